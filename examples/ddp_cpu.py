"""Data-parallel training on CPUs: DDP on Gloo, with ringmpi's hook, and on the ringmpi backend.

    mpirun -n 2 python examples/ddp_cpu.py [--width 1024] [--steps 30]

torch.distributed's Gloo group is set up from mpirun's ranks
(``ringmpi.torch.init_process_group``). Three copies of one MLP (three linear
layers of ``width``), from the same weights, train on the same batches: one
with DDP's default hook on the Gloo group, one with
``ringmpi.torch.allreduce_hook``, one on a group of the ``ringmpi`` backend
(``new_group(backend="ringmpi")``: every collective of DDP through MPI).
Their steps take turns; a step's time is the slowest rank's. Prints the
median step time of each (after the first 3), the largest difference
between the Gloo model's final weights and each other's, and whether each
ringmpi model is bitwise the same on every rank. What bounds the backend's
step: a fourth copy takes the same steps without DDP (no communication), and
the backend's all-reduce of a tensor the size of the gradients is timed
(median of 10, slowest rank). Torch CPU tensors also go straight into any
ringmpi call (DLPack, no copy).
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np
import torch
from mpi4py import MPI
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import ringmpi.torch


def model(width: int) -> nn.Module:
    torch.manual_seed(0)  # the same first weights on every rank
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))  # fmt: skip


def batches(width: int, steps: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1 + rank)  # each rank its own data
    return [(torch.randn(64, width, generator=g), torch.randint(0, 10, (64,), generator=g))
            for _ in range(steps)]  # fmt: skip


def step(ddp: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    nn.functional.cross_entropy(ddp(x), y).backward()  # DDP averages the gradients here
    opt.step()


def take_turns(runs: dict[str, nn.Module], width: int, steps: int,
               comm: MPI.Intracomm) -> dict[str, list[float]]:  # fmt: skip
    """``steps`` SGD steps of each model in ``runs`` on this rank's batches, the models'
    steps in turn; each step's time, the slowest rank's."""
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in runs.items()}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for i, (x, y) in enumerate(batches(width, steps, comm.rank)):
        for name in sorted(runs, reverse=i % 2 == 1):  # take turns
            comm.Barrier()
            t0 = time.perf_counter()
            step(runs[name], opts[name], x, y)
            times[name].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return times


def arguments(doc: str) -> argparse.Namespace:
    """The examples' command line: --width, --steps."""
    parser = argparse.ArgumentParser(description=doc.split("\n", maxsplit=1)[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30)
    return parser.parse_args()


def all_reduce_ms(n: int, group: torch.distributed.ProcessGroup, comm: MPI.Intracomm) -> float:
    """Median ms of 10 all-reduces (after 2) of ``n`` float32 on ``group``, slowest rank."""
    x, times = torch.ones(n), []
    for _ in range(12):
        comm.Barrier()
        t0 = time.perf_counter()
        torch.distributed.all_reduce(x, group=group)
        times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return float(np.median(times[2:])) * 1e3


def main() -> None:
    args = arguments(__doc__)
    comm = MPI.COMM_WORLD
    ringmpi.torch.init_process_group(comm)
    gloo = DistributedDataParallel(model(args.width))
    hooked = DistributedDataParallel(model(args.width))
    hooked.register_comm_hook(comm, ringmpi.torch.allreduce_hook)
    group = torch.distributed.new_group(backend="ringmpi")
    backend = DistributedDataParallel(model(args.width), process_group=group)
    runs = {"gloo": gloo, "hook": hooked, "backend": backend, "local": model(args.width)}
    times = take_turns(runs, args.width, args.steps, comm)
    params = sum(p.numel() for p in gloo.parameters())
    reduce_ms = all_reduce_ms(params, group, comm)
    diff, same = {}, {}
    for name in ("hook", "backend"):
        pairs = zip(gloo.parameters(), runs[name].parameters(), strict=True)
        diff[name] = max(float((a - b).detach().abs().max()) for a, b in pairs)
        mine = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                       for p in runs[name].parameters()))  # fmt: skip
        same[name] = len(set(comm.allgather(mine.hexdigest()))) == 1
    if comm.rank == 0:
        ms = {k: float(np.median(v[3:])) * 1e3 for k, v in times.items()}
        print(
            f"{comm.size} ranks, {params:,} parameters ({4 * params / 2**20:.1f} MiB of "
            f"gradients), {args.steps} steps of 64 samples"
        )
        print(f"step ms: gloo {ms['gloo']:.2f}, ringmpi hook {ms['hook']:.2f} "
              f"({ms['hook'] / ms['gloo']:.2f}x), ringmpi backend {ms['backend']:.2f} "
              f"({ms['backend'] / ms['gloo']:.2f}x)")  # fmt: skip
        for name in ("hook", "backend"):
            print(f"{name}: largest weight difference from gloo's {diff[name]:.3g}; "
                  f"the same on every rank: {same[name]}")  # fmt: skip
        floor = ms["local"] + reduce_ms
        print(f"no communication: step {ms['local']:.2f} ms; the backend's all-reduce of the "
              f"gradients {reduce_ms:.2f} ms; their sum {floor:.2f} ms "
              f"({floor / ms['gloo']:.2f}x gloo's step)")  # fmt: skip
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
