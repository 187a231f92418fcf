"""Threads per rank: window-resident all-reduces on 1, 2, 4, ... threads a rank, off the cache.

    NUMBA_NUM_THREADS=8 mpirun -n 2 python examples/threads.py [--size 256M] [--threads 1,2,4,8]

In-place float32 SUM all-reduces of arrays from ``ringmpi.zeros`` (the
``symmetric`` algorithm, which auto runs on them from 1 MiB), on as many
arrays as make the node's ranks touch twice its last-level cache before one
comes back, with the ``threads`` setting at each count in turn
(interleaved, each call after a barrier, --rounds rounds over the arrays;
the median of the slowest rank's times).
Each row: the time, the speed-up over one thread, whether random floats gave
one thread's bits on every rank, and whether verifiable inputs gave the
exact sum. A rank's threads come from Numba's pool: NUMBA_NUM_THREADS must
be at least the largest count (its default is the machine's cores).
"""

from __future__ import annotations

import argparse
import time
import zlib

import numba
import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import verify
from ringmpi.tools._units import SYSTEM, buffer_sets, off_cache_bytes, parse_size

MOST_SETS = 16


def main() -> None:
    pool = numba.config.NUMBA_NUM_THREADS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=parse_size, default=256 << 20, help="bytes (256M)")
    powers = ",".join(str(1 << k) for k in range(pool.bit_length()))
    parser.add_argument(
        "--threads",
        default=powers,
        help=f"thread counts (default: powers of two to Numba's pool, {pool})",
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds over the arrays (5)")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    comm = MPI.COMM_WORLD
    cache = comm.allreduce(off_cache_bytes(SYSTEM), op=MPI.MAX)
    node_ranks = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    sets = buffer_sets(args.size, cache, node_ranks, MOST_SETS, buffers=1)
    arrays = [ringmpi.zeros(args.size // 4, np.float32) for _ in range(sets)]
    times: dict[int, list[float]] = {t: [] for t in counts}
    for t in counts:  # every array touched once on each count
        with ringmpi.configured(threads=t):
            for a in arrays:
                ringmpi.Allreduce(MPI.IN_PLACE, a, algorithm="symmetric")
    for r in range(args.rounds * sets):
        for t in counts:
            with ringmpi.configured(threads=t):
                comm.Barrier()
                t0 = time.perf_counter()
                ringmpi.Allreduce(MPI.IN_PLACE, arrays[r % sets], algorithm="symmetric")
                times[t].append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    bits = {t: _random_bits(arrays[0], t, comm) for t in counts}
    one = bits[1] if 1 in bits else bits[counts[0]]
    if comm.rank == 0:
        print(
            f"# {comm.size} ranks, {args.size} bytes, {sets} arrays off the cache "
            f"(twice {cache >> 20} MiB), Numba's pool {pool} threads"
        )
        print(f"{'threads':>7} {'ms':>9} {'speed-up':>8}  same bits  exact")
    base = float(np.median(times[counts[0]]))
    for t in counts:
        exact = _exact(arrays[0], t, comm)
        ms = float(np.median(times[t]))
        if comm.rank == 0:
            same = bits[t] is not None and bits[t] == one
            print(f"{t:>7} {ms * 1e3:>9.2f} {base / ms:>8.2f}  {same!s:>9}  {exact}")


def _random_bits(x: np.ndarray, threads: int, comm: MPI.Intracomm) -> int | None:
    """The result's checksum for random floats, if every rank has the same; else None."""
    x[...] = np.random.default_rng(comm.rank).standard_normal(x.size, np.float32)
    with ringmpi.configured(threads=threads):
        ringmpi.Allreduce(MPI.IN_PLACE, x, algorithm="symmetric")
    sums = comm.allgather(zlib.crc32(x.view(np.uint8)))
    return sums[0] if len(set(sums)) == 1 else None


def _exact(x: np.ndarray, threads: int, comm: MPI.Intracomm) -> bool:
    """Whether verifiable inputs give the exact sum on every rank."""
    x[...] = verify.verify_inputs(MPI.SUM, "float32", comm.rank, x.size)
    with ringmpi.configured(threads=threads), ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, algorithm="symmetric")
    exact = verify.verify_expected(MPI.SUM, "float32", comm.size, x.size)
    return bool(comm.allreduce(bool(np.array_equal(x, exact)) and t.ran == ["symmetric"],
                               op=MPI.LAND))  # fmt: skip


if __name__ == "__main__":
    main()
