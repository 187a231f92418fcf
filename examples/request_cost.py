"""What a request costs: ringmpi's own nonblocking and persistent all-reduce against the
library's, and ringmpi's blocking call, by size.

    mpirun -n 2 python examples/request_cost.py [--sizes 8,1K,16K,64K,256K,1M]

Each size (float32 SUM, in place): ringmpi's blocking ``Allreduce``; its own
``Iallreduce`` + ``Wait`` and ``Allreduce_init``'s ``Start`` + ``Wait``, made
ringmpi's at every size (auto otherwise hands the smaller sizes to the
library: ``ringmpi._requests.own_from_bytes``); and the library's own
``comm.Allreduce``, ``comm.Iallreduce`` and ``comm.Allreduce_init`` through
mpi4py (what a request costs the library over its blocking call). The six take
turns in 9 rounds of a loop each; a round's time is the slowest rank's mean
call; prints the medians in µs. The last result of each path must be exact.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import _requests
from ringmpi.tools._units import parse_size

SIZES = "8,1K,16K,64K,256K,1M"
ROUNDS = 9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=SIZES, help=f"bytes, comma list ({SIZES})")
    sizes = [parse_size(s) for s in parser.parse_args().sizes.split(",")]
    comm = MPI.COMM_WORLD
    _requests._own_from[:] = [0]  # ringmpi's own request at every size
    exact = True
    if comm.rank == 0:
        print(f"# {MPI.Get_library_version().splitlines()[0].strip()}, {comm.size} ranks")
        print(f"{'bytes':>8} {'blocking':>9} {'own I+W':>8} {'own S+W':>8} {'library':>8} "
              f"{'lib I+W':>8} {'lib S+W':>8}  exact")  # fmt: skip
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        reps = 400 if nbytes <= 64 << 10 else 100
        for _ in range(50):
            ringmpi.Allreduce(MPI.IN_PLACE, x)
        mine = ringmpi.Allreduce_init(MPI.IN_PLACE, x)
        lib = comm.Allreduce_init(MPI.IN_PLACE, x)

        def started(request) -> None:
            request.Start()
            request.Wait()

        paths = {
            "blocking": lambda x=x: ringmpi.Allreduce(MPI.IN_PLACE, x),
            "own I+W": lambda x=x: ringmpi.Iallreduce(MPI.IN_PLACE, x).Wait(),
            "own S+W": lambda mine=mine: started(mine),
            "library": lambda x=x: comm.Allreduce(MPI.IN_PLACE, x),
            "lib I+W": lambda x=x: comm.Iallreduce(MPI.IN_PLACE, x).Wait(),
            "lib S+W": lambda lib=lib: started(lib),
        }
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(ROUNDS):
            for name, call in paths.items():
                times[name].append(_timed(comm, call, reps))
        ok = True
        for call in paths.values():
            x[...] = comm.rank + 1
            call()
            ok &= bool((x == comm.size * (comm.size + 1) // 2).all())
        ok = comm.allreduce(ok, op=MPI.LAND)
        exact &= ok
        mine.Free()
        lib.Free()
        if comm.rank == 0:
            t = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
            print(f"{nbytes:>8} {t['blocking']:>9.1f} {t['own I+W']:>8.1f} {t['own S+W']:>8.1f} "
                  f"{t['library']:>8.1f} {t['lib I+W']:>8.1f} {t['lib S+W']:>8.1f}  {ok}",
                  flush=True)  # fmt: skip
    sys.exit(0 if exact else 1)


def _timed(comm: MPI.Intracomm, call, reps: int) -> float:
    """The slowest rank's mean seconds of ``call`` over ``reps`` calls."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    return comm.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX)


if __name__ == "__main__":
    main()
