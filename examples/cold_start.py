"""The first calls of a library program: import, then two 4 MiB float32 SUMs (auto).

    rm -rf /tmp/cache; NUMBA_CACHE_DIR=/tmp/cache mpirun -n 16 python examples/cold_start.py
    ... python examples/cold_start.py warm     # ringmpi.warm first, timed apart

Prints the slowest rank's seconds of each, and whether the sums are exact
(docs/performance.md, "Cold start").
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

import ringmpi


def main() -> None:
    comm = MPI.COMM_WORLD
    x = np.full(1 << 20, comm.rank, np.float32)
    comm.Barrier()
    t0 = time.perf_counter()
    if sys.argv[1:] == ["warm"]:
        ringmpi.warm(np.float32)
    t1 = time.perf_counter()
    ringmpi.Allreduce(MPI.IN_PLACE, x)
    t2 = time.perf_counter()
    ringmpi.Allreduce(MPI.IN_PLACE, x)
    t3 = time.perf_counter()
    exact = bool(np.all(x == comm.size * sum(range(comm.size))))
    warm, first, second = (comm.allreduce(t, op=MPI.MAX) for t in (t1 - t0, t2 - t1, t3 - t2))
    exact = comm.allreduce(exact, op=MPI.LAND)
    if comm.rank == 0:
        print(f"{comm.size} ranks: warm {warm:.2f} s, first call {first:.2f} s, "
              f"second {second:.2f} s, exact {exact}")  # fmt: skip


if __name__ == "__main__":
    main()
