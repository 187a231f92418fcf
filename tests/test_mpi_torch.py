"""ringmpi.torch: DDP with ringmpi's hook reaches DDP's own weights (make test-torch)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

torch = pytest.importorskip("torch")
from torch_train import differences, mlp, train_ddp  # noqa: E402

import ringmpi  # noqa: E402
import ringmpi.torch  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.torch]

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


@pytest.fixture(scope="module")
def gloo():
    ringmpi.torch.init_process_group(WORLD)
    yield
    torch.distributed.destroy_process_group()


def test_the_hook_reaches_ddps_weights(gloo):
    theirs = train_ddp()
    ours = train_ddp(hook=ringmpi.torch.allreduce_hook, state=WORLD)
    problems = differences(ours, theirs)
    digest = hashlib.sha256(b"".join(p.numpy().tobytes() for p in ours)).hexdigest()
    if len(set(WORLD.allgather(digest))) != 1:
        problems.append("the hook's weights differ between ranks")
    moved = max(float((p - q).abs().max()) for p, q in zip(ours, mlp().parameters(), strict=True))
    problems += [] if moved > 0 else ["the weights never moved"]
    agree(WORLD, problems)


def test_cpu_tensors_go_through_every_call():
    t = torch.full((1000,), float(RANK + 1))
    ringmpi.Iallreduce(MPI.IN_PLACE, t, op=ringmpi.AVG).Wait()
    u = torch.arange(6, dtype=torch.int32) * (RANK + 1)
    out = torch.empty_like(u)
    ringmpi.Allreduce(u, out)
    problems = [] if torch.all(t == (SIZE + 1) / 2) else [f"AVG {t[:3]}"]
    want = np.arange(6) * SIZE * (SIZE + 1) // 2
    problems += [] if np.array_equal(out.numpy(), want) else [f"SUM {out}"]
    agree(WORLD, problems)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_window_tensors_are_reduced_where_they_lie(dtype):
    from ringmpi.algorithms import symmetric

    t = ringmpi.torch.zeros((3, 100), dtype)
    assert t.dtype == dtype and t.shape == (3, 100) and t.is_contiguous()
    assert symmetric.resident(t.view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy())
    i = torch.arange(300).reshape(3, 100) % 50  # every sum exact in bfloat16 too
    t += (i + RANK).to(dtype)
    with ringmpi.trace() as tr:
        ringmpi.Allreduce(MPI.IN_PLACE, t, algorithm="symmetric")
    assert torch.equal(t.to(torch.float64), (SIZE * i + SIZE * (SIZE - 1) // 2).to(torch.float64))
    assert tr.ran == ["symmetric"]
