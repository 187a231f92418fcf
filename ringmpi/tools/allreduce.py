"""``python -m ringmpi allreduce``: benchmark and verify, in nccl-tests' vocabulary.

``python -m ringmpi.allreduce``, the design card's command, runs it too.

Every row is one (size, algorithm): the median time of ``-n`` timed calls (the
slowest rank's median), algbw = bytes / time, busbw = algbw * 2(N-1)/N, the
number of wrong elements summed over ranks, and the bytes and steps this
rank's sends really took, from :func:`ringmpi.trace`. Algorithms are timed
interleaved (call k of each before call k+1 of any), so they see the same
machine, and every row's call is the same positional ``ringmpi.Allreduce(send,
recv, op, comm)``: a named algorithm is selected by the settings snapshot its
calls run under (set outside the timed region), as auto's repeat path serves it.
Each call runs on the same buffers, or with ``--off-cache`` on the next of a
set of buffers that the node's ranks cannot keep in its last-level cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import _direct, _host, _settings, _trace, algorithms, tuning
from ringmpi._comm import Context, context, sleepy_barrier
from ringmpi._copy import copy
from ringmpi._errors import abort_on_error
from ringmpi.algorithms import shared, tuner
from ringmpi.algorithms.hierarchical import layout, window_choice
from ringmpi.kernels import AVG, OPS, op_from_name, reduction
from ringmpi.verify import count_wrong, verify_inputs

from . import _memory, _plot, prog
from ._args import ArgumentParser, quiet_compiles
from ._units import (
    SYSTEM,
    buffer_sets,
    format_size,
    interleaved,
    off_cache_bytes,
    parse_size,
    sweep,
    whole,
)

__all__ = ["main"]


def _parser(name: str) -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=name,
        description="Benchmark and verify all-reduce algorithms (run under mpirun).",
    )
    p.add_sweep(8, 16 << 20, 8)  # checked with the rest, on every rank (_checked)
    p.add_argument("-n", "--iters", type=whole(1), default=10, help="timed calls per size (10)")
    p.add_argument("-w", "--warmup", type=whole(0), default=2, help="untimed calls first (2)")
    p.add_argument(
        "--budget", type=float, default=0.5,
        help="seconds per size and algorithm: fewer calls when one is slow; 0: always -n (0.5)",
    )  # fmt: skip
    p.add_argument("-c", "--check", type=int, default=1, help="verify results: 1 or 0 (1)")
    p.add_argument("-d", "--datatype", default="float32",
                   help="NumPy dtype name, or bfloat16 (float32)")  # fmt: skip
    p.add_argument("-o", "--op", default="sum", help=f"one of {', '.join(OPS)} (sum)")
    p.add_argument(
        "-a", "--algorithm", default="auto,mpi",
        help=f"comma list from {', '.join(algorithms.names())}, {RAW} (comm.Allreduce called "
        f"directly, without ringmpi's API), or all (auto, each of ringmpi's algorithms, mpi "
        f"and {RAW}); hierarchical:WAY fixes how it stores to the node's window, WAY one of "
        f"{', '.join(_settings.STORES)} (auto,mpi)",
    )  # fmt: skip
    p.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="K",
        help="emulate nodes of K ranks (RINGMPI_RANKS_PER_NODE) for the hierarchical algorithm",
    )
    p.add_argument(
        "--node-placement", choices=("block", "cyclic"),
        help="emulated nodes take consecutive ranks (block) or every M-th rank (cyclic)",
    )  # fmt: skip
    p.add_argument(
        "--timeout", type=float, metavar="SECONDS",
        help="a rank that waits this long without progress raises, naming the rank it waits "
        "for, and the job is aborted (RINGMPI_TIMEOUT; default: wait as long as it takes); "
        "ringmpi's rows only: mpi and mpi4py time the library's blocking call",
    )  # fmt: skip
    p.add_argument(
        "--off-cache", nargs="?", const=SYSTEM, type=parse_size, metavar="SIZE",
        help="time each call on the next of several buffers, so many that the node's ranks "
        "touch twice its last-level cache (as the system says it, or SIZE, e.g. 260M) before "
        "one comes back, as a program's large arrays meet it (default: the same buffers)",
    )  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="also write the header and rows as JSON")
    p.add_argument(
        "--plot", metavar="FILE",
        help="also draw busbw and time against size, and the cost model's prediction against "
        "the measurement, as a PNG (needs matplotlib: the plot extra)",
    )  # fmt: skip
    return p


# What --off-cache rotates over at most: sets of buffers per size, and calls remembered
# per size (each row's call on each set is one; ringmpi._direct's table holds 256).
_MOST_SETS, _MOST_REMEMBERED = 64, 192


# Not an algorithm of the registry: mpi4py's comm.Allreduce called straight from the
# benchmark loop, with none of ringmpi's Python in the way (what "mpi" adds to it is
# ringmpi's call overhead, the same for every algorithm).
RAW = "mpi4py"


def _names(text: str) -> list[str]:
    """The ``-a`` list, ``all`` expanded (auto, ringmpi's own algorithms, the MPI baseline
    through ringmpi and straight from mpi4py)."""
    names: list[str] = []
    for name in (a.strip() for a in text.split(",")):
        every = ["auto", *algorithms.candidates(), "mpi", RAW]
        expanded = every if name == "all" else [name] if name else []
        names += [n for n in expanded if n not in names]
    return names


@dataclass
class _Entry:
    """One ``-a`` entry and the settings snapshot its calls run under."""

    name: str  # as given: auto, ring, hierarchical:cached, mpi4py
    base: str  # the registry's name (auto, ring, hierarchical), or RAW
    # Made once: the API's repeat paths know a remembered call by this very object.
    settings: _settings.Settings


def _entry(name: str, now: _settings.Settings) -> _Entry:
    """An ``-a`` entry. A named algorithm is chosen by the ``algorithm`` setting, so
    that its calls are auto's positional call, which the C repeat path serves; for
    ``hierarchical:WAY`` the settings also store to the node's window that way, so
    that both ways run in one launch. The baseline (``mpi``, like ``mpi4py``) runs
    without ``--timeout``: with one, the library's call would be its nonblocking
    one, polled, which is not the call a program makes."""
    if name == RAW:
        return _Entry(name, RAW, now)
    base, _, way = name.partition(":")
    algorithms.lookup(base)
    if way and (base != "hierarchical" or way not in _settings.STORES):
        raise ValueError(
            f"algorithm: {name!r}: only hierarchical takes a variant after ':', "
            f"one of {', '.join(_settings.STORES)}"
        )
    if base == "auto":
        return _Entry(name, base, now)
    changes: dict[str, object] = {"algorithm": base}
    if way:
        changes["window_stores"] = way
    if base == "mpi":  # the baseline as a program calls it: blocking, no timeout
        changes["timeout"] = 0
    return _Entry(name, base, now.changed(**changes))


def _cannot(entry: _Entry, red: Any, op: Any, ordered: bool, where: str) -> str | None:
    """Why ``entry`` cannot run this reduction, said after ``where``; or None."""
    if entry.base == RAW:
        if red.half:
            return (f"{where}: {RAW} (MPI's own Allreduce) cannot reduce {red.describe()} "
                    "with one rounding")  # fmt: skip
        if op is AVG:
            return f"{where}: {RAW} (MPI's own Allreduce) has no AVG; use mpi"
        return None
    if entry.base == "auto":
        return None
    try:
        algorithms.check(algorithms.get(entry.base), ordered, red, where)
    except ValueError as exc:
        return str(exc)
    return None


def _views(arrays: list[np.ndarray], n: int, comm: MPI.Intracomm) -> list[list[np.ndarray]]:
    """``n`` lists of views, one per row, each a view of every one of ``arrays``. The
    API remembers a call by its recvbuf object, and its C repeat path keeps one call
    per slot of a table indexed by that object's address and ``comm``'s
    (ringmpi._direct): calls that shared an object, or a slot, would evict each
    other's call at every call and time the slower path."""
    views: list[list[np.ndarray]] = [[] for _ in range(n)]
    taken: set[int] = set()
    spare: list[np.ndarray] = []  # held until the views are chosen: no address comes again
    for array in arrays:
        for row in views:
            for _ in range(64 * _direct._SLOTS):  # (a free slot comes in a few tries)
                view = array.view()
                slot = _direct.slot(view, comm)
                if slot not in taken:
                    break
                spare.append(view)
            else:
                raise RuntimeError(f"no free slot of the C repeat table for {len(taken) + 1} "
                                   f"of {n * len(arrays)} buffers' views")  # fmt: skip
            taken.add(slot)
            row.append(view)
    return views


def _caller(entry: _Entry, send: np.ndarray, recv: np.ndarray, op: Any,
            comm: MPI.Intracomm) -> Callable[[], None]:  # fmt: skip
    """One call of ``entry``: the same positional call for every ringmpi row, and
    mpi4py's own for RAW's."""
    if entry.base == RAW:
        raw = comm.Allreduce
        return lambda: raw(send, recv, op)
    allreduce = ringmpi.Allreduce
    return lambda: allreduce(send, recv, op, comm)


def _timed(ctx: Context, entry: _Entry, call: Callable[[], None]) -> float:
    """One call after a barrier, under its entry's settings (set outside the timed
    region): its seconds."""
    with _settings.using(entry.settings):
        ctx.barrier()
        t0 = time.perf_counter()
        call()
        return time.perf_counter() - t0


class _Ticker:
    """On rank 0, a line every ``every`` seconds while long work runs, so that a
    compile or a large size shows that it goes on."""

    def __init__(self, what: str, on: bool, every: float = 10.0) -> None:
        self.what, self.on, self.every = what, on, every
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._tick, daemon=True)

    def __enter__(self) -> _Ticker:
        if self.on:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.on:
            self.thread.join()

    def _tick(self) -> None:
        t0 = time.monotonic()
        while not self.done.wait(self.every):
            print(f"#   ... {self.what}: {time.monotonic() - t0:.0f} s so far", flush=True)


def _warm(ctx: Context, red: Any) -> float:
    """Load the kernels; one rank per node compiles into Numba's cache, the others then load.

    Returns the slowest node leader's first-call time (compile, or cache load).
    """
    took = algorithms.warm_on_node(ctx, red)
    first = ctx.node.Get_rank() == 0
    sleepy_barrier(ctx.node)  # the others' loads, before anything is timed
    return ctx.comm.allreduce(took if first else 0.0, op=MPI.MAX)


def _cores(ctx: Context) -> dict:
    """The busiest node (most ranks per core): its ranks, its cores online, and the
    cores its ranks may run on (the union of their affinities), collectively."""
    online = os.sysconf("SC_NPROCESSORS_ONLN")
    usable = _host.cores_held(ctx.node.allgather(_host.affinity()))
    ranks = ctx.node.Get_size()
    mine = (ranks / usable, ranks, online, usable) if ctx.node.Get_rank() == 0 else None
    _, ranks, online, usable = max(n for n in ctx.comm.allgather(mine) if n is not None)
    return {"node_ranks": ranks, "node_cores_online": online, "node_cores_usable": usable,
            "oversubscribed": ranks > usable}  # fmt: skip


def _age(seconds: float) -> str:
    for unit, length in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f} {unit}"
    return f"{seconds:.0f} s"


def _auto_source(settings: _settings.Settings) -> tuple[str, dict]:
    """Where auto's choices come from, as the header says it and as JSON."""
    path = tuner.cache_file(settings)
    existed = path is not None and os.path.exists(path)
    age = time.time() - os.path.getmtime(path) if path is not None and existed else None
    if settings.algorithm != "auto":
        said = f"RINGMPI_ALGORITHM={settings.algorithm}, at every size"
    elif settings.tuner == "off":
        said = "the cost model alone (RINGMPI_TUNER=off)"
    elif path is None:
        said = "tuned in this run, kept in memory only (RINGMPI_TUNER=memory)"
    elif age is not None:
        said = (f"the tuner's file {path}, last written {_age(age)} ago; a size it has no "
                f"choice for at this layout, or one older than {settings.retune_days:g} "
                "days, is tuned in this run (RINGMPI_TUNER=off: the cost model alone)")  # fmt: skip
    else:
        said = f"tuned in this run (no tuner file yet; the choices are kept in {path})"
    if settings.tuning:
        said += f"; the cost model's constants from {settings.tuning}"
    return said, {"tuner": settings.tuner, "file": path, "file_existed": existed,
                  "file_age_s": None if age is None else round(age)}  # fmt: skip


def _header(comm: MPI.Intracomm, nodes: int, compile_s: float, args: argparse.Namespace,
            cores: dict, auto: dict, left_out: list[str]) -> dict:  # fmt: skip
    now = _settings.current()
    per_node, placement = now.ranks_per_node, now.node_placement
    return {
        "ranks": comm.Get_size(),
        "nodes": nodes,
        **cores,
        "mpi_library": _library(),
        "mpi_version": "{}.{}".format(*MPI.Get_version()),
        "mpi4py": __import__("mpi4py").__version__,
        "numba": numba.__version__,
        "numpy": np.__version__,
        "ringmpi": ringmpi.__version__,
        "first_call_compile_ms": round(compile_s * 1e3, 1),
        "emulated_ranks_per_node": per_node,
        "node_placement": placement,
        "datatype": args.datatype,
        "op": args.op,
        "iters": args.iters,
        "warmup": args.warmup,
        "auto_choices": auto,
        "left_out": left_out,
    }


def _timeout_line(timeout: float, entries: list[_Entry]) -> str:
    """The header's line on ``--timeout``: which rows run with it, which without."""
    on = [e.name for e in entries if e.base not in (RAW, "mpi")]
    off = [e.name for e in entries if e.base in (RAW, "mpi")]
    said = f"timeout {timeout:g} s"
    if on:
        said += (f" on {', '.join(on)}: a rank that waits that long without progress "
                 "raises, naming the rank it waits for")  # fmt: skip
    if off:
        said += (f"{';' if on else ':'} {', '.join(off)} without one: the library's blocking "
                 "MPI_Allreduce, as a program calls it (a timeout would poll its "
                 "nonblocking call)")  # fmt: skip
    return said


def _library() -> str:
    return " ".join(MPI.Get_library_version().replace("\x00", "").split("\n")[0].split())


def _sizes(args: argparse.Namespace, itemsize: int) -> list[tuple[int, int]]:
    """The sweep's (elements, bytes): each size of ``-b -e -f`` (ValueError naming
    them where they give none) in whole elements, one at least; each once."""
    found: dict[int, int] = {}
    for size in sweep(args.minbytes, args.maxbytes, args.stepfactor):
        count = max(1, size // itemsize)
        found.setdefault(count, count * itemsize)
    return list(found.items())


def _unwritable(args: argparse.Namespace) -> str | None:
    """Why ``--json`` or ``--plot`` could not be written, naming the flag; None if both
    can. Checked before the sweep, so that a typo in a path costs nothing."""
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if not path:
            continue
        folder = os.path.dirname(path) or "."
        if os.path.isdir(path):
            return f"{flag} {path}: is a folder"
        if not os.path.isdir(folder):
            return f"{flag} {path}: no folder {folder}"
        # Opened as the write after the sweep will open it (root may write anywhere
        # os.access allows, yet not create a file in /proc); a file made here is removed.
        existed = os.path.exists(path)
        try:
            with open(path, "a"):
                pass
        except OSError as exc:
            return f"{flag} {path}: {exc.strerror or 'not writable'}"
        if not existed:
            os.remove(path)
    return None


def _sets(nbytes: int, cache: int, node_ranks: int, rows: int) -> int:
    """The sets of buffers a size's calls rotate over: one, or with ``--off-cache``
    (``cache`` bytes) enough to touch it twice, as the remembered calls allow."""
    if not cache:
        return 1
    return buffer_sets(nbytes, cache, node_ranks, max(1, min(_MOST_SETS, _MOST_REMEMBERED // rows)))


# What a rank holds beside its buffers once the kernels are compiled and the
# library's own collective has run (its temporary buffers; Numba's compiler).
_HELD = 256 << 20


def _too_large(args: argparse.Namespace, sizes: list[tuple[int, int]], red: Any,
               entries: list[_Entry], cache: int, node_ranks: int) -> str | None:  # fmt: skip
    """Why the sweep's largest size cannot fit in the memory a rank may still take,
    naming the flags; None where it fits. A rank holds, per set of buffers, a send
    and a receive buffer of the size, and the check's comparison, a byte an element."""
    need = max(2 * nbytes * _sets(nbytes, cache, node_ranks, len(entries)) + count
               for count, nbytes in sizes)  # fmt: skip
    why = _memory.shortfall(need + _HELD, node_ranks)
    if why is None:
        return None
    largest = format_size(max(nbytes for _, nbytes in sizes))
    flags = "-e" + (" and --off-cache" if cache else "")
    return (
        f"{flags}: the largest size, {largest} of {red.dtype}, {why}; give a smaller "
        "-e (docs: cli.md, Memory per size)"
    )


@dataclass
class _Run:
    """One algorithm at one size: its label, check, trace and timed calls."""

    label: str
    wrong: int  # -1 when not checked
    traced: _trace.Trace | None  # None for the MPI baseline, whose traffic ringmpi cannot see
    iters: int
    tuned: bool  # auto's trials ran at this size, in this run
    busy: bool  # ... while the node was busy: the choice is not saved to the tuner's file
    times: list[float] = field(default_factory=list)


def _copy_bandwidth(comm: MPI.Intracomm, ctx: Any, send: np.ndarray, recv: np.ndarray,
                    streaming: bool = False) -> float:  # fmt: skip
    """The node's memory copy bandwidth at this size: every rank copies at once (NumPy's
    copy, or with ``streaming`` ringmpi's copy with non-temporal stores), read + write
    bytes over its median time, summed over ranks (GB/s)."""
    times = []
    for _ in range(5):
        ctx.barrier()
        t0 = time.perf_counter()
        if streaming:
            copy(recv, send, streaming=True)
        else:
            np.copyto(recv, send)
        times.append(time.perf_counter() - t0)
    t = float(np.median(times))
    return comm.allreduce(2 * send.nbytes / t / 1e9 if t > 0 else 0.0)


def _calls(first: float, args: argparse.Namespace) -> tuple[int, int]:
    """(warm-up, timed) calls: -w and -n, fewer when one call takes long against --budget."""
    if args.budget <= 0 or first <= 0:
        return args.warmup, args.iters
    fit = int(args.budget / first)
    if fit < 2:
        return 0, 0  # time the checked call itself
    iters = min(args.iters, fit)
    return min(args.warmup, fit - iters), iters


def _prepare(ctx: Context, entry: _Entry, calls: list[Callable[[], None]], recv: np.ndarray,
             nbytes: int, red: Any, op: Any, args: argparse.Namespace) -> _Run:  # fmt: skip
    """``entry``'s first call at this size (``calls[0]``, on ``recv``), checked and traced
    (its time sets how many calls fit the budget), its warm-up calls, and two calls on
    each other set of buffers (a call repeated is remembered: the timed ones repeat)."""
    comm, call = ctx.comm, calls[0]
    raw = entry.base == RAW
    with _settings.using(entry.settings):
        ordered = entry.settings.reproducible  # as the call will see it
        tuned = False
        if entry.base == "auto":  # auto's tuner's trials first (untimed)
            while isinstance(algorithms.choose("auto", nbytes, ctx, red, ordered),
                             algorithms.UNSETTLED):  # fmt: skip
                call()
                tuned = True
        chosen = RAW if raw else algorithms.choose("auto", nbytes, ctx, red, ordered).name
        klass = nbytes.bit_length()
        busy = tuned and ctx.tuner is not None and bool({klass, -klass} & ctx.tuner.busy)
        ctx.barrier()
        t0 = time.perf_counter()
        with _trace.trace() as t:
            call()
        took = time.perf_counter() - t0
    first = comm.allreduce(took, op=MPI.MAX)
    warmup, iters = _calls(first, args)
    wrong = count_wrong(recv, op, comm.Get_size()) if args.check else -1
    if iters == 0:
        # The first call also paid what is done once per communicator and size
        # (plans, buffers; at 64 ranks on 2 cores that alone takes 0.3 s): time
        # one more before settling on a single call.
        took = _timed(ctx, entry, call)
        warmup, iters = _calls(comm.allreduce(took, op=MPI.MAX), args)
    with _settings.using(entry.settings):
        for _ in range(warmup):
            call()
        for other in calls[1:]:
            other()
            other()
    return _Run(
        label=f"auto({chosen})" if entry.base == "auto" else entry.name,
        wrong=wrong,
        traced=None if raw or not algorithms.get(chosen).own else t,
        iters=max(iters, 1),
        tuned=tuned,
        busy=busy,
        # A call too slow for two in the budget is timed once: the last one.
        times=[took] if iters == 0 else [],
    )


def _row(comm: MPI.Intracomm, run: _Run, nbytes: int, count: int, args: argparse.Namespace,
         floor: float | None) -> dict:  # fmt: skip
    n = comm.Get_size()
    traced = run.traced
    mine = [float(np.median(run.times)), 0.0, 0.0]
    if traced is not None:
        mine[1:] = [traced.bytes_sent, traced.steps]
    # Two reductions per row: the slowest rank's time and the most traffic; wrong summed.
    most = np.empty(3)
    comm.Allreduce(np.array(mine), most, op=MPI.MAX)
    t, bytes_sent, steps = most
    wrong = comm.allreduce(run.wrong) if run.wrong >= 0 else -1
    algbw = nbytes / t / 1e9 if t > 0 else 0.0
    return {
        "size": nbytes, "count": count, "type": args.datatype, "redop": args.op,
        "algorithm": run.label, "time_us": t * 1e6,
        "floor_us": None if floor is None else floor * 1e6, "algbw_GBs": algbw,
        "busbw_GBs": algbw * 2 * (n - 1) / n, "wrong": wrong,
        "bytes_per_rank": None if traced is None else bytes_sent / nbytes,
        "steps": None if traced is None else int(steps),
        "iters": run.iters,
    }  # fmt: skip


# About 100 columns: type and op are the header's, the copy bandwidths the size's line.
_COLUMNS = (
    f"{'size':>10} {'count':>10}  {'algorithm':<24} {'time(us)':>9} {'floor':>8} {'algbw':>6} "
    f"{'busbw':>6} {'#wrong':>6} {'bytes/D':>7} {'steps':>5} {'iters':>5}"
)
_UNITS = (f"# {'(B)':>8} {'(elements)':>10}  {'':<24} {'':>9} {'(us)':>8} {'(GB/s)':>6} "
          f"{'(GB/s)':>6}")  # fmt: skip
_WIDTH = 99  # of the header's lines, wrapped


def _format(row: dict) -> str:
    bpr = "-" if row["bytes_per_rank"] is None else f"{row['bytes_per_rank']:.2f}"
    steps = "-" if row["steps"] is None else str(row["steps"])
    wrong = "N/A" if row["wrong"] < 0 else str(row["wrong"])
    floor = "-" if row["floor_us"] is None else f"{row['floor_us']:.1f}"
    return (
        f"{row['size']:>10} {row['count']:>10}  {row['algorithm']:<24} {row['time_us']:>9.1f} "
        f"{floor:>8} {row['algbw_GBs']:>6.2f} {row['busbw_GBs']:>6.2f} {wrong:>6} {bpr:>7} "
        f"{steps:>5} {row['iters']:>5}"
    )


# From this size a copy's time is the memory's, not the call's: the floor is shown.
_FLOOR_FROM = 1 << 20


def _floor(nbytes: int, ranks: int, nodes: int, stream_GBs: float | None) -> float | None:
    """The least time an all-reduce of ``nbytes`` on one node spends in memory: every
    rank's input read once and every result written once (two buffers a rank) at the
    node's streaming rate (seconds); None across nodes, below _FLOOR_FROM, or where no
    rate was measured."""
    if nodes > 1 or not stream_GBs or stream_GBs <= 0 or nbytes < _FLOOR_FROM:
        return None
    return 2 * nbytes * ranks / (stream_GBs * 1e9)


def _say(text: str) -> None:
    """A header line, wrapped to about 100 columns."""
    print(textwrap.fill(text, _WIDTH, initial_indent="# ", subsequent_indent="#   ",
                        break_on_hyphens=False, break_long_words=False))  # fmt: skip


def _window_note(ctx: Context, nbytes: int) -> str | None:
    """How the hierarchical row's node stored to its window (auto's timed choice), as
    the line printed under the row: the way depends on where the ranks' cores sit,
    which is what most changes its time from one launch to the next on a VM."""
    found = window_choice(ctx, nbytes)
    if found is None:
        return None
    way, trials = found
    timed = ", ".join(f"{w} {t * 1e6:.0f} us" for w, t in trials.items())
    return f"window stores: {way} (fastest trial call: {timed})"


def _write(args: argparse.Namespace, header: dict, rows: list[dict], drawn: tuple[int, int],
           argv: list[str] | None, command: str) -> list[str]:  # fmt: skip
    """Write ``--json`` and ``--plot`` (rank 0); what could not be written, by flag."""
    failed = []
    if args.json:
        try:
            with open(args.json, "w") as fh:
                json.dump({"header": header, "rows": rows}, fh, indent=1)
        except OSError as exc:
            failed.append(f"--json {args.json}: {exc.strerror or exc}")
    if args.plot:
        try:
            _plot.draw(rows, header, args.plot, *drawn, argv, command)
            print(f"# plot written to {args.plot}")
        except (OSError, ValueError) as exc:  # ValueError: a format matplotlib lacks
            failed.append(f"--plot {args.plot}: {getattr(exc, 'strerror', None) or exc}")
    return failed


# The exit status when --json or --plot could not be written after the sweep (1:
# wrong elements, 2: bad arguments, found before it).
EXIT_OUTPUT = 3


def _checked(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple:
    """The run the arguments and settings ask for: (settings, op, reduction, sizes,
    entries, what was left out and why, the cache ``--off-cache`` times beyond in bytes
    or 0); TypeError or ValueError naming what is wrong.
    Every rank checks the same arguments the same way, before any communication."""
    given = {"ranks_per_node": args.ranks_per_node, "node_placement": args.node_placement,
             "timeout": args.timeout}  # fmt: skip
    # The settings (RINGMPI_* read and checked), with the options given.
    now = _settings.configure(**{k: v for k, v in given.items() if v is not None})
    op = op_from_name(args.op)
    red = reduction(op, args.datatype)  # TypeError for a combination MPI does not allow
    sizes = _sizes(args, red.dtype.itemsize)
    if args.budget < 0:
        raise ValueError(f"--budget must be 0 or more seconds, not {args.budget:g}")
    entries = [_entry(name, now) for name in _names(args.algorithm)]
    # What the default list or all hold that cannot run this reduction is left out,
    # and said so; a name given that cannot is an error.
    implicit = args.algorithm in (parser.get_default("algorithm"), "all")
    ordered = now.reproducible and algorithms.order_matters(red)
    left_out = []
    for entry in list(entries):
        why = _cannot(entry, red, op, ordered, "left out" if implicit else "algorithm")
        if why is not None and not implicit:
            raise ValueError(why)
        if why is not None:
            entries.remove(entry)
            left_out.append(why)
    tuning.load()  # RINGMPI_TUNING, checked
    if args.plot:
        _plot.check(args.plot)
    return now, op, red, sizes, entries, left_out, off_cache_bytes(args.off_cache)


def main(argv: list[str] | None = None, command: str = prog("allreduce")) -> int:
    """The benchmark; ``command``: how it was typed (for usage and the plot)."""
    comm = MPI.COMM_WORLD
    # An exception on one rank would leave the others waiting forever in the next
    # collective: print it and take the whole job down instead.
    abort_on_error(comm)
    quiet_compiles()  # the header says that the kernels compile, a line every 10 s more
    parser = _parser(command)
    args = parser.parse_args(argv)
    rank = comm.Get_rank()
    problem = None
    try:
        now, op, red, sizes, entries, left_out, cache = _checked(args, parser)
    except (TypeError, ValueError) as exc:
        problem = str(exc)
    # One agreement, so that every rank stops here together, also where the ranks'
    # environments differ; after a sleepy barrier: ranks that spin in MPI would take
    # the CPU from ranks still starting up (64 ranks on 2 cores import for tens of
    # seconds). Rank 0 alone writes the outputs: it checks them.
    sleepy_barrier(comm)
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    node_ranks = node.Get_size()
    node.Free()
    if problem is None:
        problem = _too_large(args, sizes, red, entries, cache, node_ranks)
    problems = comm.allgather(problem)
    said = comm.bcast(_unwritable(args) if rank == 0 else None, root=0)
    if any(problems):
        said = next(p for p in problems if p)
        if problems.count(said) < len(problems):  # not every rank's
            said = f"rank {problems.index(said)}: {said}"
    if said:
        if rank == 0:
            parser.print_usage(sys.stderr)
            sys.stderr.write(f"{parser.prog}: error: {said}\n")
        return 2
    ctx = context(comm)
    if "all" in args.algorithm.split(","):  # shared_memory only where it can run
        usable = algorithms.usable(ctx)
        for entry in list(entries):
            if entry.base in algorithms.candidates() and entry.base not in usable:
                entries.remove(entry)
                left_out.append(f"left out: {entry.name}: needs every rank on one node")
    cores = _cores(ctx)
    # The largest any rank found: every rank runs the same calls on as many sets.
    cache = comm.allreduce(cache, op=MPI.MAX)
    said, auto = _auto_source(now)
    nodes = comm.allreduce(1 if ctx.node.Get_rank() == 0 else 0)
    if rank == 0:
        print(f"# ringmpi {ringmpi.__version__}: all-reduce benchmark and verification")
        emulated = ""
        if now.ranks_per_node:
            emulated = (f" (hierarchical: emulated nodes of {now.ranks_per_node} "
                        f"ranks, {now.node_placement} placement)")  # fmt: skip
        print(f"# ranks {comm.Get_size()}, nodes {nodes}{emulated}")
        _say(f"cores: {cores['node_cores_online']} online per node, "
             f"{cores['node_cores_usable']} in the ranks' affinity")  # fmt: skip
        if cores["oversubscribed"]:
            usable = cores["node_cores_usable"]
            _say(f"oversubscribed: {cores['node_ranks']} ranks share {usable} "
                 f"core{'s' if usable > 1 else ''} on a node: ranks wait for a core, so "
                 "times are the scheduler's more than the algorithm's, and noisy")  # fmt: skip
            if now.oversubscribed != "no":
                _say(f"there shared_memory hands a buffer on in pieces of up to "
                     f"{format_size(shared.CROWDED_SET_BYTES, long=True)}, not "
                     f"{format_size(shared.SET_BYTES, long=True)}: a rank the scheduler puts aside "
                     "costs a few handoffs a call (RINGMPI_OVERSUBSCRIBED=no: the small "
                     "pieces)")  # fmt: skip
        elif now.oversubscribed == "yes":
            _say(f"RINGMPI_OVERSUBSCRIBED=yes: shared_memory hands a buffer on in pieces of "
                 f"up to {format_size(shared.CROWDED_SET_BYTES, long=True)}")  # fmt: skip
        print(f"# MPI: {_library()} (MPI {'{}.{}'.format(*MPI.Get_version())})")
        print(f"# mpi4py {__import__('mpi4py').__version__}, numba {numba.__version__}, "
              f"numpy {np.__version__}")  # fmt: skip
        if any(e.base == "auto" for e in entries):
            _say(f"auto's choices: {said}")
        if now.timeout:
            _say(_timeout_line(now.timeout, entries))
        for why in left_out:
            _say(why)
        _say(f"loading the {red.describe()} kernels: the first run of a type and op on "
             "a machine compiles them into Numba's cache (half a minute at 2 ranks on 2 "
             "cores, minutes on busy ones); later runs load them in a second ...")  # fmt: skip
        sys.stdout.flush()
    with _Ticker("compiling or loading the kernels", rank == 0):
        compile_s = _warm(ctx, red)
    header = _header(comm, nodes, compile_s, args, cores, auto, left_out)
    header["off_cache_bytes"] = cache
    header["timeout_s"] = {e.name: e.settings.timeout for e in entries if e.base != RAW}
    if rank == 0:
        print(f"# first-call compile (or cache load) of the {red.describe()} kernel: "
              f"{header['first_call_compile_ms']} ms")  # fmt: skip
        _say(f"time: median of -n {args.iters} calls after -w {args.warmup} warm-up (fewer "
             f"where they would pass --budget {args.budget} s; see iters), slowest rank; "
             f"{red.describe()}")  # fmt: skip
        _say("busbw = algbw * 2(N-1)/N; bytes/D and steps: counted from the sends (trace), "
             "max over ranks; floor (from 1 MiB): the least time in memory on one node, "
             "every input read once and every result written once (2 buffers a rank) at the "
             "stream rate below")  # fmt: skip
        if cache:
            _say(f"off the cache: each timed call runs on the next of as many sets of "
                 f"buffers as make the node's ranks touch twice its "
                 f"{format_size(cache, long=True)} last-level cache before a set comes back "
                 f"(at most {_MOST_SETS}: small sizes stay in the cache)")  # fmt: skip
        if cores["oversubscribed"]:
            _say("no copy rates and no floor: ranks that share cores do not copy at once, so "
                 "the node's memory bandwidth cannot be measured from them")  # fmt: skip
        else:
            _say("each size's line: copy, a NumPy copy of that size on every rank at once, "
                 "read + write bytes summed over ranks; stream, the same with streaming "
                 "(non-temporal) stores, which do not read a line before writing it: the "
                 "memory bandwidth the shared-memory phase can reach")  # fmt: skip
        print("#" + _COLUMNS[1:])
        print(_UNITS)
        sys.stdout.flush()

    rows, total_wrong, tuned = [], 0, []
    for count, nbytes in sizes:
        send = verify_inputs(op, red.dtype, rank, count)
        recv = np.empty_like(send)
        copy_bw = stream_bw = None  # where ranks share cores, their copies do not overlap
        if not cores["oversubscribed"]:
            copy_bw = _copy_bandwidth(comm, ctx, send, recv)
            stream_bw = _copy_bandwidth(comm, ctx, send, recv, streaming=True)
        sets = _sets(nbytes, cache, cores["node_ranks"], len(entries))
        # Each set's send holds the same verifiable inputs, so every call's result is
        # the checked one.
        sends = [send] + [send.copy() for _ in range(sets - 1)]
        recvs = [recv] + [np.empty_like(recv) for _ in range(sets - 1)]
        if rank == 0:
            on = ""
            if cache:
                on = (f"; {sets} set{'s' if sets > 1 else ''} of buffers, "
                      f"{format_size(2 * nbytes * sets * cores['node_ranks'], long=True)} "
                      f"on the node")  # fmt: skip
            rates = ("" if copy_bw is None
                     else f": copy {copy_bw:.1f} GB/s, stream {stream_bw:.1f} GB/s")  # fmt: skip
            print(f"# {format_size(nbytes)}{rates}{on}", flush=True)
        views = dict(zip((e.name for e in entries), _views(recvs, len(entries), comm),
                         strict=True))  # fmt: skip
        calls = {e.name: [_caller(e, sends[k], views[e.name][k], op, comm) for k in range(sets)]
                 for e in entries}  # fmt: skip
        with _Ticker(f"size {format_size(nbytes)}", rank == 0):
            runs = {e.name: _prepare(ctx, e, calls[e.name], views[e.name][0], nbytes, red, op,
                                     args)
                    for e in entries}  # fmt: skip
            turn = 0  # the set of buffers the next timed call runs on
            for i in range(max(run.iters for run in runs.values())):
                # Interleaved, so that each sees the same machine, in an order that
                # varies so that none always finds the caches as one other left them.
                for entry in (entries[k] for k in interleaved(len(entries), i)):
                    run = runs[entry.name]
                    if len(run.times) < run.iters:
                        run.times.append(_timed(ctx, entry, calls[entry.name][turn % sets]))
                        turn += 1
        floor = _floor(nbytes, comm.Get_size(), nodes, stream_bw)
        for entry in entries:
            run = runs[entry.name]
            row = _row(comm, run, nbytes, count, args, floor)
            row["copy_GBs"], row["stream_GBs"] = copy_bw, stream_bw
            row["buffer_sets"] = sets
            if entry.base == "auto":
                row["tuned_in_this_run"] = run.tuned
                row["tuned_on_a_busy_node"] = run.busy
                if run.tuned:
                    tuned.append(format_size(nbytes) + (" (node busy: not saved)" if run.busy
                                                        else ""))  # fmt: skip
            if "hierarchical" in run.label and ":" not in entry.name:
                row["window"] = _window_note(ctx, nbytes)
            rows.append(row)
            total_wrong += max(row["wrong"], 0)
            if rank == 0:
                print(_format(row))
                if row.get("window"):
                    print(f"#   {row['window']}")
                sys.stdout.flush()

    drawn: tuple[int, int] = (0, 0)
    if args.plot:  # the layout the cost model is drawn for (collective on first use)
        lay = layout(ctx)
        drawn = (lay.nodes, lay.slices)
    failed: list[str] = []
    if rank == 0:
        print(f"# wrong elements in total: {total_wrong}")
        if tuned:
            _say(f"auto tuned in this run at: {', '.join(tuned)}")
        failed = _write(args, header, rows, drawn, argv, command)
        sys.stdout.flush()
        for why in failed:
            sys.stderr.write(f"{parser.prog}: error: {why}\n")
    failed = comm.bcast(failed, root=0)  # every rank exits with the same status
    if total_wrong:
        return 1
    return EXIT_OUTPUT if failed else 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("allreduce")
