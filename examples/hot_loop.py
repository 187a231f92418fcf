"""auto against comm.Allreduce in a hot loop of the same in-place float32 SUM, 8 B to 64 MiB.

    RINGMPI_TUNER=$(mktemp -d) mpirun -n 2 python examples/hot_loop.py [--off-cache [SIZE]]
        [--max SIZE]

Each size: calls of auto until its tuner has settled the size class (untimed:
the trials and the lead's calls between them),
then 7 rounds in which the two paths take turns, each a barrier and then a
loop of the same call (``ringmpi.Allreduce(MPI.IN_PLACE, x)``, as a user calls
it, and ``comm.Allreduce(MPI.IN_PLACE, x)``); a round's time is the slowest
rank's. Prints the median µs a call of each, their ratio, what auto ran, and
whether a last call on verifiable inputs gave the exact sum on every rank
(docs/performance.md, "The three MPI families").

``--off-cache`` loops over as many arrays of each size as make the node's ranks
touch twice its last-level cache (the system's, or SIZE) before one comes back,
as ``python -m ringmpi.allreduce --off-cache`` does (the ``sets`` column);
``--max`` is the largest size (64M; up to 1G is a power of 8 times 8 B or 64M).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import _comm, algorithms, kernels, verify
from ringmpi.tools._units import SYSTEM, buffer_sets, off_cache_bytes, parse_size

# 8 B, 64 B, ..., 16 MiB, 64 MiB (--max: then 128 MiB, 1 GiB)
SIZES = [8 << (3 * i) for i in range(8)] + [64 << 20, 128 << 20, 1 << 30]
ROUNDS = 7
MOST_SETS = 64  # small arrays sit in any cache: more of them gain nothing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--off-cache", nargs="?", const=SYSTEM, type=parse_size, metavar="SIZE",
                        help="loop over arrays that do not fit the last-level cache")  # fmt: skip
    parser.add_argument("--max", type=parse_size, default=64 << 20, help="largest size (64M)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    try:
        cache = off_cache_bytes(args.off_cache)
    except ValueError as exc:
        parser.error(str(exc))
    cache = comm.allreduce(cache, op=MPI.MAX)  # every rank loops over as many arrays
    node_ranks = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    if comm.rank == 0:
        if args.off_cache is not None:
            print(f"# off the cache: arrays that touch twice {cache >> 20} MiB on the node")
        print(f"{'bytes':>10} {'auto us':>10} {'mpi4py us':>10} {'ratio':>6}  auto ran  "
              "exact  sets")  # fmt: skip
    for nbytes in (n for n in SIZES if n <= args.max):
        sets = buffer_sets(nbytes, cache, node_ranks, MOST_SETS, buffers=1) if cache else 1
        xs = [np.zeros(nbytes // 4, np.float32) for _ in range(sets)]
        x = xs[0]
        calls = max(3, min(2000, (200 << 20) // nbytes // 8))
        while _untuned(comm, nbytes):  # the tuner's trials and the lead's calls, untimed
            ringmpi.Allreduce(MPI.IN_PLACE, x)
        for other in xs[1:]:  # a call repeated is remembered: the timed ones repeat
            ringmpi.Allreduce(MPI.IN_PLACE, other)
            ringmpi.Allreduce(MPI.IN_PLACE, other)
        paths = {
            "auto": lambda x: ringmpi.Allreduce(MPI.IN_PLACE, x),
            "mpi4py": lambda x: comm.Allreduce(MPI.IN_PLACE, x),
        }
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(ROUNDS):
            for name, call in paths.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for i in range(calls):
                    call(xs[i % sets])
                took = (time.perf_counter() - t0) / calls
                times[name].append(comm.allreduce(took, op=MPI.MAX))
        ran = _ran(comm, nbytes)
        x[...] = verify.verify_inputs(MPI.SUM, "float32", comm.rank, x.size)
        ringmpi.Allreduce(MPI.IN_PLACE, x)
        exact = verify.verify_expected(MPI.SUM, "float32", comm.size, x.size)
        ok = comm.allreduce(bool(np.array_equal(x, exact)), op=MPI.LAND)
        if comm.rank == 0:
            auto, raw = (float(np.median(times[k])) * 1e6 for k in paths)
            print(f"{nbytes:>10} {auto:>10.2f} {raw:>10.2f} {auto / raw:>6.2f}  {ran:<9} {ok!s:<5}"
                  f"  {sets:>4}")  # fmt: skip


def _untuned(comm: MPI.Intracomm, nbytes: int) -> bool:
    """Whether auto's tuner has yet to settle ``nbytes``'s class on ``comm``."""
    red = kernels.reduction(MPI.SUM, np.float32)
    chosen = algorithms.choose("auto", nbytes, _comm.context(comm), red, False)
    return isinstance(chosen, algorithms.UNSETTLED)


def _ran(comm: MPI.Intracomm, nbytes: int) -> str:
    """The algorithm auto now runs for ``nbytes`` on ``comm`` (its tuner's winner)."""
    red = kernels.reduction(MPI.SUM, np.float32)
    return algorithms.choose("auto", nbytes, _comm.context(comm), red, False).name


if __name__ == "__main__":
    main()
