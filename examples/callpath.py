"""N repeats of one in-place 8-byte float32 SUM on one path, for counting instructions.

    valgrind --tool=callgrind python examples/callpath.py api 1000
    valgrind --tool=callgrind python examples/callpath.py api 61000

The difference of the two totals over 60,000 is one call's instructions
(docs/performance.md). Paths: ``raw`` (comm.Allreduce through mpi4py), ``api``
(ringmpi.Allreduce with algorithm="mpi", its repeat path) and ``run`` (that
repeat's compiled call, without the API's checks).
"""

from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import _api


def main() -> None:
    what, n = sys.argv[1], int(sys.argv[2])
    comm, a, op, in_place = MPI.COMM_WORLD, np.ones(2, np.float32), MPI.SUM, MPI.IN_PLACE
    call = ringmpi.Allreduce
    for _ in range(5):  # from the second call on, the repeat path
        call(in_place, a, op, comm, algorithm="mpi")
    run = _api._last[id(a)][-1]
    if what == "raw":
        for _ in range(n):
            comm.Allreduce(in_place, a, op)
    elif what == "api":
        for _ in range(n):
            call(in_place, a, op, comm, algorithm="mpi")
    elif what == "run":
        for _ in range(n):
            run(a, a)
    else:
        raise SystemExit(f"unknown path {what!r}: raw, api or run")


if __name__ == "__main__":
    main()
