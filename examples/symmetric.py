"""Window-resident arrays against ordinary ones: in-place all-reduces of big arrays, off the cache.

    mpirun -n 2 python examples/symmetric.py [--min 1M] [--max 1G] [--rounds 9]

Each size (float32 SUM, in place; 1 MiB, 4 MiB, ... up to --max), on as
many arrays as make the node's ranks touch twice its last-level cache before
one comes back, four calls take turns, each after a barrier, for --rounds
rounds over the arrays: ``ringmpi.Allreduce(MPI.IN_PLACE, x)`` on arrays of
``ringmpi.empty`` (auto runs ``symmetric`` on them from ``AUTO_FROM_BYTES``);
``shared_memory`` on ordinary arrays; the library's own ``comm.Allreduce``
on ordinary arrays; and the floor, a copy of one array into another by every
rank at once with streaming stores (one read and one write of the buffer,
which do not read the lines they write). A rank of ``symmetric`` reads its
chunk of every rank's array and writes its chunk into every rank's array:
two buffers, what the copy moves, so its floor is the copy's time. Each
prints the median of the slowest rank's times, in ms, and symmetric's time
over the others'. Then a check of symmetric's result on verifiable inputs.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import verify
from ringmpi._copy import copy
from ringmpi.tools._units import SYSTEM, buffer_sets, off_cache_bytes, parse_size

MOST_SETS = 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--min", type=parse_size, default=1 << 20, help="smallest size (1M)")
    parser.add_argument("--max", type=parse_size, default=1 << 30, help="largest size (1G)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds over the arrays (9)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    cache = comm.allreduce(off_cache_bytes(SYSTEM), op=MPI.MAX)
    node_ranks = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    if comm.rank == 0:
        print(f"# off the cache: arrays that touch twice {cache >> 20} MiB on the node")
        print(f"{'bytes':>11} {'sets':>4} {'symmetric':>10} {'shared_mem':>10} {'library':>8} "
              f"{'floor':>8} {'/shared':>7} {'/lib':>5} {'/floor':>6}  exact")  # fmt: skip
    nbytes = args.min
    while nbytes <= args.max:
        sets = buffer_sets(nbytes, cache, node_ranks, MOST_SETS, buffers=1)
        windowed = [ringmpi.zeros(nbytes // 4, np.float32) for _ in range(sets)]
        plain = [np.zeros(nbytes // 4, np.float32) for _ in range(sets)]
        spare = np.zeros(nbytes // 4, np.float32)  # where a copy goes
        calls = _calls(windowed, plain, spare)
        for call in calls.values():  # every array touched once, every call loaded
            for i in range(sets):
                call(i)
        times: dict[str, list[float]] = {k: [] for k in calls}
        for r in range(args.rounds * sets):
            for name, call in calls.items():
                comm.Barrier()
                t0 = time.perf_counter()
                call(r % sets)
                times[name].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        ms = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        by = {k: ms["symmetric"] / ms[k] for k in ("shared_memory", "library", "floor")}
        x = windowed[0]
        x[...] = verify.verify_inputs(MPI.SUM, "float32", comm.rank, x.size)
        with ringmpi.trace() as t:
            ringmpi.Allreduce(MPI.IN_PLACE, x)
        exact = verify.verify_expected(MPI.SUM, "float32", comm.size, x.size)
        ok = comm.allreduce(bool(np.array_equal(x, exact)), op=MPI.LAND)
        if comm.rank == 0:
            print(f"{nbytes:>11} {sets:>4} {ms['symmetric']:>10.2f} {ms['shared_memory']:>10.2f} "
                  f"{ms['library']:>8.2f} {ms['floor']:>8.2f} {by['shared_memory']:>7.2f} "
                  f"{by['library']:>5.2f} {by['floor']:>6.2f}  "
                  f"{ok} ({t.ran[0]})")  # fmt: skip
        del windowed, plain, spare, x  # (the windows stay until MPI_Finalize frees them)
        nbytes *= 4


def _calls(windowed: list[np.ndarray], plain: list[np.ndarray], spare: np.ndarray) -> dict:
    """The four calls, each on the i-th array."""
    return {
        "symmetric": lambda i: ringmpi.Allreduce(MPI.IN_PLACE, windowed[i]),
        "shared_memory": lambda i: ringmpi.Allreduce(MPI.IN_PLACE, plain[i],
                                                     algorithm="shared_memory"),
        "library": lambda i: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, plain[i]),
        "floor": lambda i: copy(spare, plain[i], streaming=True),
    }  # fmt: skip


if __name__ == "__main__":
    main()
