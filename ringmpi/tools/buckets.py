"""``python -m ringmpi buckets``: fused buckets (allreduce_many) against one call per array.

Gradients of a training step: ``--arrays`` float32 arrays whose sizes are drawn
(seeded, the same on every rank) log-uniformly from ``--min`` to ``--max`` bytes.
Each repetition runs every method once, in a rotated order, on fresh copies of the
inputs; a method's time in a repetition is the slowest rank's, and the table gives
each method's median over the repetitions. Inputs are small integers in floating
point (rank + 1 times a small pattern), so every sum is exact and #wrong is exact
too. docs/performance.md has the runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from ringmpi import Allreduce, buckets, kernels
from ringmpi.buckets import BUCKET_BYTES, allreduce_many

from . import command_parser
from ._units import format_size, parse_size, whole

__all__ = ["main"]


def _inputs(nbytes: list[int], dtype: np.dtype, rank: int) -> list[np.ndarray]:
    return [
        ((np.arange(n // dtype.itemsize) % 7) + i % 5).astype(dtype) * (rank + 1)
        for i, n in enumerate(nbytes)
    ]


def _methods(comm: MPI.Intracomm, op: Any, sizes: list[int], algorithm: str) -> dict:
    ring = comm  # one name per method, one closure each

    def fused(b: int):
        return lambda arrays: allreduce_many(arrays, op, ring, bucket_bytes=b, algorithm=algorithm)

    def fresh(arrays):  # the plan and its pack buffers made anew: no reuse
        buckets._plans.clear()
        allreduce_many(arrays, op, ring, bucket_bytes=sizes[0], algorithm=algorithm)

    def each_ringmpi(arrays):
        for a in arrays:
            Allreduce(MPI.IN_PLACE, a, op, ring, algorithm=algorithm)

    def each_mpi(arrays):
        for a in arrays:
            ring.Allreduce(MPI.IN_PLACE, a, op)

    found = {f"fused {format_size(b)}": fused(b) for b in sizes}
    found[f"fused {format_size(sizes[0])}, no reuse"] = fresh
    found["ringmpi each"] = each_ringmpi
    found["MPI_Allreduce each"] = each_mpi
    return found


def _collectives(nbytes: list[int], itemsize: int, bucket_bytes: int) -> int:
    """Buckets of one dtype, as allreduce_many's plan forms them."""
    count, size = 0, 0
    for raw in nbytes:
        n = raw // itemsize * itemsize
        if n >= bucket_bytes:
            count += 1
        elif size + n > bucket_bytes:
            count, size = count + 1, n
        else:
            size += n
    return count + (size > 0)


def main(argv: list[str] | None = None) -> int:
    p = command_parser("buckets", __doc__)
    p.add_argument("--arrays", type=whole(1), default=200, help="arrays per step")
    p.add_argument("--min", type=parse_size, default=1 << 10, help="smallest array, bytes")
    p.add_argument("--max", type=parse_size, default=64 << 10, help="largest array, bytes")
    p.add_argument("-d", "--dtype", default="float32", help="NumPy dtype")
    p.add_argument("-o", "--op", default="sum", help="the reduction")
    p.add_argument("-a", "--algorithm", default="auto", help="ringmpi's algorithm")
    p.add_argument(
        "--bucket-bytes",
        type=parse_size,
        nargs="+",
        default=[BUCKET_BYTES],
        help="bucket sizes; the first also runs without reuse",
    )
    p.add_argument("-n", "--iters", type=whole(1), default=30, help="repetitions")
    p.add_argument("-w", "--warmup", type=whole(0), default=3, help="untimed repetitions first")
    p.add_argument("--seed", type=int, default=0, help="seed of the sizes")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    args = p.parse_args(argv)
    if not 1 <= args.min <= args.max:
        p.error(
            f"--min {format_size(args.min)} --max {format_size(args.max)}: need 1 <= --min <= --max"
        )

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    dtype = np.dtype(args.dtype)
    op = kernels.op_from_name(args.op)
    rng = np.random.default_rng(args.seed)
    lo, hi = np.log(args.min), np.log(args.max)
    nbytes = [max(dtype.itemsize, int(np.exp(rng.uniform(lo, hi)))) for _ in range(args.arrays)]
    inputs = _inputs(nbytes, dtype, rank)
    scale = size * (size + 1) // 2  # sum over ranks of (rank + 1)
    expected = [x / (rank + 1) * scale for x in inputs] if args.op == "sum" else None
    methods = _methods(comm, op, args.bucket_bytes, args.algorithm)
    names = list(methods)
    times: dict[str, list[float]] = {m: [] for m in names}
    wrong = dict.fromkeys(names, 0)
    work = [x.copy() for x in inputs]
    for rep in range(args.warmup + args.iters):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            for w, x in zip(work, inputs, strict=True):
                w[...] = x
            comm.Barrier()
            t0 = time.perf_counter()
            methods[name](work)
            elapsed = comm.allreduce(time.perf_counter() - t0, MPI.MAX)
            if rep >= args.warmup:
                times[name].append(elapsed)
            if expected is not None:
                wrong[name] += sum(
                    int(np.count_nonzero(w != e)) for w, e in zip(work, expected, strict=True)
                )
    wrong = {m: comm.allreduce(v) for m, v in wrong.items()}
    total = sum(x.nbytes for x in inputs)
    rows = []
    base = float(np.median(times["MPI_Allreduce each"]))
    for name in names:
        b = next((b for b in args.bucket_bytes if name.startswith(f"fused {format_size(b)}")), None)
        calls = _collectives(nbytes, dtype.itemsize, b) if b is not None else args.arrays
        med = float(np.median(times[name]))
        rows.append({"method": name, "collectives": calls, "median_ms": med * 1e3,
                     "min_ms": min(times[name]) * 1e3, "vs_mpi_each": base / med,
                     "wrong": wrong[name] if expected is not None else None})  # fmt: skip
    if rank == 0:
        print(f"# ranks {size}, {args.arrays} {dtype.name} arrays of {format_size(args.min)}-"
              f"{format_size(args.max)} ({total / 2**20:.2f} MiB), op {args.op}, algorithm "
              f"{args.algorithm}, median of {args.iters} interleaved repetitions")  # fmt: skip
        print(f"{'method':<24} {'collectives':>11} {'median ms':>10} {'min ms':>8} "
              f"{'vs MPI each':>11} {'#wrong':>7}")  # fmt: skip
        for r in rows:
            shown = "-" if r["wrong"] is None else r["wrong"]
            print(f"{r['method']:<24} {r['collectives']:>11} {r['median_ms']:>10.3f} "
                  f"{r['min_ms']:>8.3f} {r['vs_mpi_each']:>10.2f}x {shown:>7}")  # fmt: skip
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": size, "arrays": args.arrays, "bytes": total,
                           "dtype": dtype.name, "rows": rows}, f, indent=1)  # fmt: skip
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("buckets")
