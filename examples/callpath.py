"""N repeats of one in-place 8-byte float32 SUM on one path, for counting instructions.

    valgrind --tool=callgrind python examples/callpath.py api 20000
    valgrind --tool=callgrind python examples/callpath.py api 220000

The difference of the two totals over 200,000 is one call's instructions
(docs/performance.md). Paths: ``raw`` (comm.Allreduce through mpi4py), ``api``
(ringmpi.Allreduce, auto set to the ``mpi`` algorithm: its C repeat) and ``run``
(the compiled call the API's Python repeat path makes, through Numba's
dispatcher). ``time N`` times the three instead, under mpirun, interleaved in 7
rounds of N calls: the median µs a call.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import _repeat


def main() -> None:
    what, n = sys.argv[1], int(sys.argv[2])
    comm, a, op, in_place = MPI.COMM_WORLD, np.ones(2, np.float32), MPI.SUM, MPI.IN_PLACE
    call = ringmpi.Allreduce
    ringmpi.configure(algorithm="mpi")  # what auto runs: as a user calls it, no keywords
    for _ in range(5):  # from the second call on, the repeat path
        call(in_place, a, op, comm)
    hit = _repeat.latest[id(a)]
    compiled, cells = hit.in_place, hit.cells
    paths = {
        "raw": lambda: comm.Allreduce(in_place, a, op),
        "api": lambda: call(in_place, a, op, comm),
        "run": lambda: compiled(a, cells),
    }
    if what == "time":
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(7):
            for name, f in paths.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                times[name].append((time.perf_counter() - t0) / n * 1e6)
        if comm.rank == 0:
            print({k: round(float(np.median(v)), 2) for k, v in times.items()})
    elif what == "raw":
        for _ in range(n):
            comm.Allreduce(in_place, a, op)
    elif what == "api":
        for _ in range(n):
            call(in_place, a, op, comm)
    elif what == "run":
        for _ in range(n):
            compiled(a, cells)
    else:
        raise SystemExit(f"unknown path {what!r}: raw, api, run or time")


if __name__ == "__main__":
    main()
