"""Numba's own start at N ranks, without ringmpi: import numba, then load one cached function.

    mpirun -n 16 python examples/numba_floor.py

Run it twice: the first run fills Numba's cache. Prints the slowest rank's
seconds of each part (docs/performance.md, "Cold start").
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    comm = MPI.COMM_WORLD
    comm.Barrier()
    t0 = time.perf_counter()
    import numba  # noqa: PLC0415 (what is timed)

    t1 = time.perf_counter()

    @numba.njit(cache=True)
    def one(x):
        return x + 1

    one(1)
    t2 = time.perf_counter()
    worst = np.empty(3)
    comm.Reduce(np.array([t1 - t0, t2 - t1, t2 - t0]), worst, op=MPI.MAX)
    if comm.rank == 0:
        print(f"{comm.size} ranks: import numba {worst[0]:.2f} s, first cached load "
              f"{worst[1]:.2f} s, both {worst[2]:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
