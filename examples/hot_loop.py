"""auto against comm.Allreduce in a hot loop of the same in-place float32 SUM, 8 B to 64 MiB.

    RINGMPI_TUNER=$(mktemp -d) mpirun -n 2 python examples/hot_loop.py

Each size: calls of auto until its tuner has settled the size class (untimed),
then 7 rounds in which the two paths take turns, each a barrier and then a
loop of the same call (``ringmpi.Allreduce(MPI.IN_PLACE, x)``, as a user calls
it, and ``comm.Allreduce(MPI.IN_PLACE, x)``); a round's time is the slowest
rank's. Prints the median µs a call of each, their ratio, what auto ran, and
whether a last call on verifiable inputs gave the exact sum on every rank
(docs/performance.md, "The three MPI families").
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import _comm, algorithms, kernels, verify

SIZES = [8 << (3 * i) for i in range(8)] + [64 << 20]  # 8 B, 64 B, ..., 16 MiB, 64 MiB
ROUNDS = 7


def main() -> None:
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(f"{'bytes':>10} {'auto us':>10} {'mpi4py us':>10} {'ratio':>6}  auto ran  exact")
    for nbytes in SIZES:
        x = np.zeros(nbytes // 4, np.float32)
        calls = max(3, min(2000, (200 << 20) // nbytes // 8))
        for _ in range(200 if nbytes <= 64 << 10 else 40):  # the tuner's trials, untimed
            ringmpi.Allreduce(MPI.IN_PLACE, x)
        paths = {
            "auto": lambda x=x: ringmpi.Allreduce(MPI.IN_PLACE, x),
            "mpi4py": lambda x=x: comm.Allreduce(MPI.IN_PLACE, x),
        }
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(ROUNDS):
            for name, call in paths.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                took = (time.perf_counter() - t0) / calls
                times[name].append(comm.allreduce(took, op=MPI.MAX))
        ran = _ran(comm, nbytes)
        x[...] = verify.verify_inputs(MPI.SUM, "float32", comm.rank, x.size)
        ringmpi.Allreduce(MPI.IN_PLACE, x)
        exact = verify.verify_expected(MPI.SUM, "float32", comm.size, x.size)
        ok = comm.allreduce(bool(np.array_equal(x, exact)), op=MPI.LAND)
        if comm.rank == 0:
            auto, raw = (float(np.median(times[k])) * 1e6 for k in paths)
            print(f"{nbytes:>10} {auto:>10.2f} {raw:>10.2f} {auto / raw:>6.2f}  {ran:<9} {ok}")


def _ran(comm: MPI.Intracomm, nbytes: int) -> str:
    """The algorithm auto now runs for ``nbytes`` on ``comm`` (its tuner's winner)."""
    red = kernels.reduction(MPI.SUM, np.float32)
    return algorithms.choose("auto", nbytes, _comm.context(comm), red, False).name


if __name__ == "__main__":
    main()
