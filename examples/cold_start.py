"""The first calls of a library program: import, then two 4 MiB float32 SUMs (auto).

    rm -rf /tmp/cache; NUMBA_CACHE_DIR=/tmp/cache mpirun -n 16 python examples/cold_start.py
    ... python examples/cold_start.py warm     # ringmpi.warm first, timed apart
    ... python examples/cold_start.py --calls 100 --dtype float64 --op max
                                              # a program's first 100 calls (auto's
                                              # tuner tries its candidates from the 51st)

Prints the slowest rank's seconds of each, and whether the sums are exact
(docs/performance.md, "Cold start").
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import ringmpi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("warm", nargs="?", choices=["warm"], help="ringmpi.warm first")
    parser.add_argument("--calls", type=int, default=2, help="calls timed in all (2)")
    parser.add_argument("--dtype", default="float32", help="the array's dtype (float32)")
    parser.add_argument("--op", default="sum", choices=["sum", "max"], help="(sum)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    op = {"sum": MPI.SUM, "max": MPI.MAX}[args.op]
    dtype = np.dtype(args.dtype)
    mine = np.full((4 << 20) // dtype.itemsize, comm.rank, dtype)
    x = mine.copy()
    comm.Barrier()
    t0 = time.perf_counter()
    if args.warm:
        ringmpi.warm(dtype, op)
    t1 = time.perf_counter()
    ringmpi.Allreduce(MPI.IN_PLACE, x, op)
    t2 = time.perf_counter()
    ringmpi.Allreduce(MPI.IN_PLACE, x, op)
    t3 = time.perf_counter()
    once = sum(range(comm.size)) if args.op == "sum" else comm.size - 1
    exact = bool(np.all(x == (comm.size * once if args.op == "sum" else once)))  # twice
    for _ in range(args.calls - 2):
        ringmpi.Allreduce(mine, x, op)
    t4 = time.perf_counter()
    exact = exact and (args.calls <= 2 or bool(np.all(x == once)))
    times = (t1 - t0, t2 - t1, t3 - t2, t4 - t1)
    warm, first, second, calls = (comm.allreduce(t, op=MPI.MAX) for t in times)
    exact = comm.allreduce(exact, op=MPI.LAND)
    if comm.rank == 0:
        print(f"{comm.size} ranks: warm {warm:.2f} s, first call {first:.2f} s, "
              f"second {second:.2f} s, exact {exact}")  # fmt: skip
        if args.calls > 2:
            print(f"first {args.calls} calls of {args.dtype} {args.op}: {calls:.1f} s")


if __name__ == "__main__":
    main()
