"""One small MLP trained on each rank's own batches: the torch tests' training runs."""

from __future__ import annotations

import torch
from mpi4py import MPI
from torch import nn
from torch.nn.parallel import DistributedDataParallel

RANK = MPI.COMM_WORLD.Get_rank()


def mlp() -> nn.Sequential:
    """The same first weights on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(40, 300), nn.ReLU(), nn.Linear(300, 7))


def fit(model: nn.Module, steps: int, batches: int = RANK) -> None:
    """``steps`` SGD steps of ``model`` on batches ``batches`` (this rank's, the same every
    run)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(batches + 1)
    for _ in range(steps):
        x, y = torch.randn(16, 40, generator=g), torch.randint(0, 7, (16,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def train_ddp(group=None, hook=None, state=None, steps: int = 6) -> list[torch.Tensor]:
    """The MLP's weights after DDP on ``group`` (None: the default group; small buckets:
    several of them), with ``hook`` registered with ``state`` where given."""
    net = mlp()
    ddp = DistributedDataParallel(net, bucket_cap_mb=0.05, process_group=group)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    fit(ddp, steps)
    return [p.detach().clone() for p in net.parameters()]


def differences(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> list[str]:
    """The parameters where ``ours`` and ``theirs`` differ beyond float32's rounding."""
    problems = []
    for k, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        try:
            torch.testing.assert_close(a, b)  # float32's tolerances
        except AssertionError as e:
            problems.append(f"parameter {k}: {str(e).splitlines()[0]}")
    return problems
