"""torch.distributed collectives on the ringmpi backend against a Gloo group of the same ranks.

    mpirun -n 2 python examples/torch_collectives.py [--max 64M] [--calls 20]

For each size (float32, 8 B, 64 B, ... times 8 up to --max, and --max) and each
collective (all_reduce, all_gather_into_tensor, reduce_scatter_tensor,
broadcast), the default group on the ``ringmpi`` backend and a Gloo group
(``new_group(backend="gloo")``) take turns, --calls calls each after a
barrier (the first two of each untimed); each prints the median of the
slowest rank's times in µs and ringmpi's over Gloo's. The size is the
tensor each rank passes: all_reduce's and broadcast's, the gathered
output's, the scattered input's. Then, back to back (no barrier between
calls): an all_reduce of 8 B and a barrier on each group, --loop calls in a
row, five rounds; the median µs a call (rank 0's).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import ringmpi.torch
from ringmpi.tools._units import format_size, parse_size


def _calls(n: int, size: int) -> dict:
    """Each collective's call on ``group`` for tensors of ``n`` float32 in all."""
    block = max(1, n // size)
    x, whole = torch.ones(n), torch.ones(block * size)
    mine = torch.empty(block)
    return {
        "all_reduce": lambda g: dist.all_reduce(x, group=g),
        "all_gather": lambda g: dist.all_gather_into_tensor(whole, mine, group=g),
        "reduce_scatter": lambda g: dist.reduce_scatter_tensor(mine, whole, group=g),
        "broadcast": lambda g: dist.broadcast(x, 0, group=g),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=parse_size, default=64 << 20, help="largest size (64M)")
    parser.add_argument("--calls", type=int, default=20, help="calls of each (20)")
    parser.add_argument("--loop", type=int, default=2000, help="back-to-back calls (2000)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    ringmpi.torch.init_process_group(comm, backend="ringmpi")
    gloo = dist.new_group(backend="gloo")
    groups = {"ringmpi": None, "gloo": gloo}
    if comm.rank == 0:
        print(f"# {comm.size} ranks, float32; median µs a call, slowest rank")
        print(f"{'size':>6} {'collective':<15} {'ringmpi':>10} {'gloo':>10} {'ratio':>6}")
    sizes = [8 << 3 * k for k in range(30) if 8 << 3 * k <= args.max]
    for nbytes in sizes + ([args.max] if sizes[-1] < args.max else []):
        for name in _calls(1, comm.size):
            call = _calls(nbytes // 4, comm.size)[name]
            times: dict[str, list[float]] = {k: [] for k in groups}
            for i in range(args.calls + 2):
                for k, g in groups.items():
                    comm.Barrier()
                    t0 = time.perf_counter()
                    call(g)
                    took = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                    if i >= 2:
                        times[k].append(took)
            us = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
            if comm.rank == 0:
                print(f"{format_size(nbytes):>6} {name:<15} {us['ringmpi']:>10.1f} "
                      f"{us['gloo']:>10.1f} {us['ringmpi'] / us['gloo']:>6.2f}")  # fmt: skip
    tiny = torch.ones(2)
    loops = {"all_reduce 8 B": lambda g: dist.all_reduce(tiny, group=g),
             "barrier": lambda g: dist.barrier(group=g)}  # fmt: skip
    for name, call in loops.items():
        us = {}
        for k, g in groups.items():
            rounds = []
            for _ in range(5):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(args.loop):
                    call(g)
                rounds.append((time.perf_counter() - t0) / args.loop)
            us[k] = float(np.median(rounds)) * 1e6
        if comm.rank == 0:
            print(f"back to back, {name}: ringmpi {us['ringmpi']:.1f} µs, gloo "
                  f"{us['gloo']:.1f} µs a call")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
