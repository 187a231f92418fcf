"""``python -m ringmpi kernels``: warm Numba's cache, or time the SUM and copy kernels.

``--warm`` compiles (or loads) what a call can reach, for every (op, dtype):
each reduction's own kernels (:meth:`~ringmpi.kernels.Reduction.warm`), the
copies, and every algorithm's compiled loops; in ``--jobs`` processes at once,
each taking its share of the dtypes. Without it, times the SUM kernel
the compiled loops run (``combine_by_code``) against ``np.add``, and the copies
against ``np.copyto``; figures and their commands: docs/performance.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numba
import numpy as np

from ringmpi import _engine, algorithms
from ringmpi._copy import copy
from ringmpi._half import HALF_NAMES
from ringmpi._ops import OP_SUM, combine_by_code
from ringmpi._progress import own_cores
from ringmpi.kernels import _OPS, HALF_OPS, reduction

from . import command_parser
from ._units import format_size, parse_size, whole

__all__ = ["main"]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _combine(acc, inp, code, reverse):
    # the op as a number, as a compiled loop passes it
    combine_by_code(acc, inp, code, reverse)


def _warm(part: int = 0, parts: int = 1) -> int:
    """Warm every (op, dtype) and every compiled loop, or share ``part`` of ``parts``
    (a dtype's lanes and all they need in one share); the number of pairs."""
    kinds = sorted(_engine.lane_kinds(None), key=str)
    mine = set(kinds[part::parts])
    n = 0
    for spec in _OPS:
        halves = HALF_NAMES if spec.name in HALF_OPS else ()
        for dt in (*spec.dtypes, *halves):
            red = reduction(spec.op, dt)
            if _engine.lane_kinds(red) & mine:
                red.warm()
                n += 1
    if part == 0:
        for streaming in (False, True):
            copy(np.zeros(8, np.uint8), np.ones(8, np.uint8), streaming)
    algorithms.warm(kinds=mine)
    return n


def _warm_on_cores(jobs: int) -> int:
    """:func:`_warm` in ``jobs`` processes at once (Numba's cache takes several writers:
    ringmpi._numba_cache); the number of pairs, or -1 where a process failed."""
    if jobs == 1:
        return _warm()
    cmd = [sys.executable, "-m", "ringmpi", "kernels", "--warm", "--jobs", str(jobs), "--part"]
    procs = [subprocess.Popen([*cmd, str(i)], stdout=subprocess.PIPE, text=True)
             for i in range(jobs)]  # fmt: skip
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        return -1
    return sum(int(out.split()[0]) for out in outs)


def _bench(nbytes: int, reps: int) -> None:
    n = nbytes // 4
    a = np.ones(n, np.float32)
    b = np.ones(n, np.float32)
    t0 = time.perf_counter()
    _combine(a[:1], b[:1], OP_SUM, False)
    print(f"first call (compile or cache load): {(time.perf_counter() - t0) * 1e3:.1f} ms")
    copy(b, a)
    copy(b, a, streaming=True)
    rows = {  # name: (call, bytes moved: reads + writes)
        "numba SUM kernel": (lambda: _combine(a, b, OP_SUM, False), 3 * nbytes),
        "np.add(a, b, out=a)": (lambda: np.add(a, b, out=a), 3 * nbytes),
        "np.copyto(b, a)": (lambda: np.copyto(b, a), 2 * nbytes),
        "copy(b, a)": (lambda: copy(b, a), 2 * nbytes),
        "streaming copy": (lambda: copy(b, a, streaming=True), 2 * nbytes),
    }
    times: dict[str, list[float]] = {k: [] for k in rows}
    order = list(rows)
    for rep in range(reps):  # interleaved, alternating which goes first
        for name in order if rep % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            rows[name][0]()
            times[name].append(time.perf_counter() - t0)
    print(
        f"float32, {format_size(nbytes, long=True)}, median of {reps}; GB/s counts reads + writes"
    )
    medians = {name: float(np.median(ts)) for name, ts in times.items()}
    for name, med in medians.items():
        print(f"  {name:<22}{med * 1e3:9.3f} ms {rows[name][1] / med / 1e9:8.1f} GB/s")
    ratio = medians["np.add(a, b, out=a)"] / medians["numba SUM kernel"]
    print(f"  kernel speed relative to np.add: {ratio:.3f}")


# More processes than lanes dtypes would have nothing to compile; each takes about
# 0.7 GB while it compiles.
_MOST_JOBS = 8


def main(argv: list[str] | None = None) -> int:
    """Warm the cache (``--warm``) or run the kernel benchmark; the exit status."""
    parser = command_parser("kernels", __doc__)
    parser.add_argument(
        "--warm", action="store_true", help="compile every (op, dtype) and every compiled loop"
    )
    parser.add_argument(
        "--jobs", type=whole(1), default=min(own_cores(), _MOST_JOBS),
        help=f"processes compiling at once for --warm: this process's cores, at most {_MOST_JOBS}",
    )  # fmt: skip
    parser.add_argument("--part", type=whole(0), help=argparse.SUPPRESS)  # one of --jobs
    parser.add_argument(
        "--bytes", type=parse_size, default=16 << 20, help="benchmark size, e.g. 64K, 16M"
    )
    parser.add_argument("--reps", type=whole(1), default=50, help="timed calls of each kernel")
    args = parser.parse_args(argv)
    if args.bytes < 4:
        parser.error(f"--bytes {args.bytes}: at least 4 (one float32)")
    if args.part is not None:
        if not args.warm or args.part >= args.jobs:
            parser.error(f"--part {args.part}: one of --warm's --jobs {args.jobs} shares")
        print(_warm(args.part, args.jobs))
        return 0
    if args.warm:
        t0 = time.perf_counter()
        n = _warm_on_cores(args.jobs)
        if n < 0:
            return 1
        print(f"{n} (op, dtype) kernels ready in {time.perf_counter() - t0:.1f} s "
              f"({args.jobs} process{'es' if args.jobs > 1 else ''})")  # fmt: skip
        return 0
    _bench(args.bytes, args.reps)
    return 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("kernels")
