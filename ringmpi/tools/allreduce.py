"""``python -m ringmpi allreduce``: benchmark and verify, in nccl-tests' vocabulary.

``python -m ringmpi.allreduce``, the design card's command, runs it too.

Every row is one (size, algorithm): the median time of ``-n`` timed calls (the
slowest rank's median), algbw = bytes / time, busbw = algbw * 2(N-1)/N, the
number of wrong elements summed over ranks, and the bytes and steps this
rank's sends really took, from :func:`ringmpi.trace`. Algorithms are timed
interleaved (call k of each before call k+1 of any), so they see the same
machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import _settings, _trace, algorithms, tuning
from ringmpi._comm import Context, context, sleepy_barrier
from ringmpi._copy import copy
from ringmpi._errors import abort_on_error
from ringmpi.algorithms.hierarchical import layout, window_choice
from ringmpi.kernels import AVG, OPS, op_from_name, reduction
from ringmpi.verify import count_wrong, verify_inputs

from . import _plot, prog
from ._units import parse_size

__all__ = ["main"]


def _parser(name: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=name,
        description="Benchmark and verify all-reduce algorithms (run under mpirun).",
    )
    p.add_argument("-b", "--minbytes", type=parse_size, default=8, help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=16 * 2**20, help="largest (16M)")
    p.add_argument("-f", "--stepfactor", type=int, default=8, help="size multiplier (8)")
    p.add_argument("-n", "--iters", type=int, default=10, help="timed calls per size (10)")
    p.add_argument("-w", "--warmup", type=int, default=2, help="untimed calls first (2)")
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
        "for, and the job is aborted (RINGMPI_TIMEOUT; default: wait as long as it takes)",
    )  # fmt: skip
    p.add_argument("--json", metavar="FILE", help="also write the header and rows as JSON")
    p.add_argument(
        "--plot", metavar="FILE",
        help="also draw busbw and time against size, and the cost model's prediction against "
        "the measurement, as a PNG (needs matplotlib: the plot extra)",
    )  # fmt: skip
    return p


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


def _variant(name: str) -> tuple[str, _settings.Settings | None]:
    """An ``-a`` entry: an algorithm, and for ``hierarchical:WAY`` the settings with
    that way of storing to the node's window, so that both ways run in one launch."""
    if name == RAW:
        return RAW, None
    base, _, way = name.partition(":")
    algorithms.lookup(base)
    if not way:
        return base, None
    if base != "hierarchical" or way not in _settings.STORES:
        raise ValueError(
            f"algorithm: {name!r}: only hierarchical takes a variant after ':', "
            f"one of {', '.join(_settings.STORES)}"
        )
    return base, _settings.current().changed(window_stores=way)


def _allreduce(send, recv, op, comm, variant: tuple[str, _settings.Settings | None]) -> None:
    """One call of an ``-a`` entry, under its own settings if it has them."""
    name, settings = variant
    if name == RAW:
        comm.Allreduce(send, recv, op)
        return
    if settings is None:  # as a program would call it
        if name == "auto":  # the default: no keyword, which the C repeat path takes
            ringmpi.Allreduce(send, recv, op, comm)
        else:
            ringmpi.Allreduce(send, recv, op, comm, algorithm=name)
        return
    with _settings.using(settings):
        ringmpi.Allreduce(send, recv, op, comm, algorithm=name)


def _warm(ctx: Context, red: Any) -> float:
    """Load the kernels; one rank per node compiles into Numba's cache, the others then load.

    Returns the slowest node leader's first-call time (compile, or cache load).
    """
    took = algorithms.warm_on_node(ctx, red)
    first = ctx.node.Get_rank() == 0
    sleepy_barrier(ctx.node)  # the others' loads, before anything is timed
    return ctx.comm.allreduce(took if first else 0.0, op=MPI.MAX)


def _header(ctx: Context, compile_s: float, args: argparse.Namespace) -> dict:
    comm = ctx.comm
    nodes = comm.allreduce(1 if ctx.node.Get_rank() == 0 else 0)
    now = _settings.current()
    per_node, placement = now.ranks_per_node, now.node_placement
    lib = " ".join(MPI.Get_library_version().replace("\x00", "").split("\n")[0].split())
    return {
        "ranks": comm.Get_size(),
        "nodes": nodes,
        "mpi_library": lib,
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
    }


def _sizes(args: argparse.Namespace) -> list[int]:
    sizes, s = [], args.minbytes
    while s <= args.maxbytes:
        sizes.append(s)
        if args.stepfactor <= 1:
            break
        s *= args.stepfactor
    return sizes


@dataclass
class _Run:
    """One algorithm at one size: its label, check, trace and timed calls."""

    label: str
    wrong: int  # -1 when not checked
    traced: _trace.Trace | None  # None for the MPI baseline, whose traffic ringmpi cannot see
    iters: int
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


def _row(comm: MPI.Intracomm, run: _Run, nbytes: int, count: int, args: argparse.Namespace) -> dict:
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
        "algorithm": run.label, "time_us": t * 1e6, "algbw_GBs": algbw,
        "busbw_GBs": algbw * 2 * (n - 1) / n, "wrong": wrong,
        "bytes_per_rank": None if traced is None else bytes_sent / nbytes,
        "steps": None if traced is None else int(steps),
        "iters": run.iters,
    }  # fmt: skip


_COLUMNS = (
    f"{'size':>11} {'count':>10} {'type':>9} {'redop':>6} {'algorithm':>24} "
    f"{'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6} {'bytes/D':>7} {'steps':>5} "
    f"{'iters':>5} {'copy':>7} {'stream':>7}"
)


def _format(row: dict) -> str:
    bpr = "-" if row["bytes_per_rank"] is None else f"{row['bytes_per_rank']:.2f}"
    steps = "-" if row["steps"] is None else str(row["steps"])
    wrong = "N/A" if row["wrong"] < 0 else str(row["wrong"])
    return (
        f"{row['size']:>11} {row['count']:>10} {row['type']:>9} {row['redop']:>6} "
        f"{row['algorithm']:>24} {row['time_us']:>10.1f} {row['algbw_GBs']:>7.2f} "
        f"{row['busbw_GBs']:>7.2f} {wrong:>6} {bpr:>7} {steps:>5} {row['iters']:>5} "
        f"{row['copy_GBs']:>7.1f} {row['stream_GBs']:>7.1f}"
    )


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


def main(argv: list[str] | None = None, command: str = prog("allreduce")) -> int:
    """The benchmark; ``command``: how it was typed (for usage and the plot)."""
    comm = MPI.COMM_WORLD
    # An exception on one rank would leave the others waiting forever in the next
    # collective: print it and take the whole job down instead.
    abort_on_error(comm)
    parser = _parser(command)
    args = parser.parse_args(argv)
    given = {"ranks_per_node": args.ranks_per_node, "node_placement": args.node_placement,
             "timeout": args.timeout}  # fmt: skip
    rank, nranks = comm.Get_rank(), comm.Get_size()
    # Every rank checks the same arguments the same way, so all of them stop here together.
    try:
        # The settings (RINGMPI_* read and checked), with the options given.
        _settings.configure(**{k: v for k, v in given.items() if v is not None})
        op = op_from_name(args.op)
        red = reduction(op, args.datatype)  # TypeError for a combination MPI does not allow
        names = _names(args.algorithm)
        variants = {name: _variant(name) for name in names}
        if red.half:  # 16 bits on the wire and one rounding: only some algorithms can
            takes = ("auto", *algorithms.half_algorithms())
            if args.algorithm in (parser.get_default("algorithm"), "all"):
                names = [n for n in names if variants[n][0] in takes]
            for n in names:
                if variants[n][0] not in takes:
                    raise ValueError(
                        f"algorithm: {n} cannot reduce {red.describe()} with one rounding "
                        f"(algorithms that can: {', '.join(takes)})"
                    )
        if RAW in names and op is AVG:
            raise ValueError(f"algorithm: {RAW} (MPI's own Allreduce) has no AVG; use mpi")
        tuning.load()  # RINGMPI_TUNING, checked
        if args.plot:
            _plot.check()
    except (TypeError, ValueError) as exc:
        if rank == 0:
            parser.print_usage(sys.stderr)
            sys.stderr.write(f"{parser.prog}: error: {exc}\n")
        return 2
    # A sleepy barrier first: ranks that spin in MPI would take the CPU from ranks
    # still starting up (64 ranks on 2 cores import for tens of seconds).
    sleepy_barrier(comm)
    ctx = context(comm)
    if "all" in args.algorithm.split(","):  # shared_memory only where it can run
        names = [n for n in names
                 if n not in algorithms.candidates() or n in algorithms.usable(ctx)]  # fmt: skip
    compile_s = _warm(ctx, red)
    header = _header(ctx, compile_s, args)
    if rank == 0:
        print(f"# ringmpi {header['ringmpi']}: all-reduce benchmark and verification")
        emulated = ""
        if header["emulated_ranks_per_node"]:
            emulated = (f" (hierarchical: emulated nodes of {header['emulated_ranks_per_node']} "
                        f"ranks, {header['node_placement']} placement)")  # fmt: skip
        print(f"# ranks {header['ranks']}, nodes {header['nodes']}{emulated}")
        print(f"# MPI: {header['mpi_library']} (MPI {header['mpi_version']})")
        print(f"# mpi4py {header['mpi4py']}, numba {header['numba']}, numpy {header['numpy']}")
        print(f"# first-call compile (or cache load) of the {red.describe()} kernel: "
              f"{header['first_call_compile_ms']} ms")  # fmt: skip
        print(
            f"# time: median of -n {args.iters} calls after -w {args.warmup} warm-up "
            f"(fewer where they would pass --budget {args.budget} s; see iters), slowest rank"
        )
        print("# busbw = algbw * 2(N-1)/N; bytes/D and steps: counted from the sends (trace), "
              "max over ranks")  # fmt: skip
        print("#" + _COLUMNS[1:])
        print(
            f"# {'(B)':>9} {'(elements)':>10} {'':>9} {'':>6} {'':>24} {'':>10} "
            f"{'(GB/s)':>7} {'(GB/s)':>7} {'':>6} {'':>7} {'':>5} {'':>5} {'(GB/s)':>7} "
            f"{'(GB/s)':>7}"
        )
        print(
            "# copy: NumPy copy of the same size on every rank at once, read + write bytes, "
            "summed over ranks; stream: the same with streaming (non-temporal) stores, which "
            "do not read a line before writing it: the memory bandwidth the shared-memory "
            "phase can reach"
        )
        sys.stdout.flush()

    rows, total_wrong = [], 0
    for size in _sizes(args):
        count = max(1, size // red.dtype.itemsize)
        nbytes = count * red.dtype.itemsize
        send = verify_inputs(op, red.dtype, rank, count)
        recv = np.empty_like(send)
        copy_bw = _copy_bandwidth(comm, ctx, send, recv)
        stream_bw = _copy_bandwidth(comm, ctx, send, recv, streaming=True)
        runs = {}
        for name in names:
            # The first call is checked and traced; its time sets how many calls fit the budget.
            raw = name == RAW
            ordered = _settings.current().reproducible  # as the call will see it
            base = variants[name][0]
            if name == "auto":  # auto's tuner tries its candidates first (untimed)
                while isinstance(algorithms.choose(base, nbytes, ctx, red, ordered),
                                 algorithms.Trial):  # fmt: skip
                    _allreduce(send, recv, op, comm, variants[name])
            chosen = RAW if raw else algorithms.choose(base, nbytes, ctx, red, ordered).name
            ctx.barrier()
            t0 = time.perf_counter()
            with _trace.trace() as t:
                _allreduce(send, recv, op, comm, variants[name])
            took = time.perf_counter() - t0
            first = comm.allreduce(took, op=MPI.MAX)
            warmup, iters = _calls(first, args)
            wrong = count_wrong(recv, op, nranks) if args.check else -1
            if iters == 0:
                # The first call also paid what is done once per communicator and size
                # (plans, buffers; at 64 ranks on 2 cores that alone takes 0.3 s): time
                # one more before settling on a single call.
                ctx.barrier()
                t0 = time.perf_counter()
                _allreduce(send, recv, op, comm, variants[name])
                took = time.perf_counter() - t0
                warmup, iters = _calls(comm.allreduce(took, op=MPI.MAX), args)
            runs[name] = _Run(
                label=f"auto({chosen})" if name == "auto" else name,
                wrong=wrong,
                traced=None if raw or not algorithms.get(chosen).own else t,
                iters=max(iters, 1),
                # A call too slow for two in the budget is timed once: the last one.
                times=[took] if iters == 0 else [],
            )
            for _ in range(warmup):
                _allreduce(send, recv, op, comm, variants[name])
        for i in range(max(run.iters for run in runs.values())):
            # Interleaved, so that each sees the same machine, and each round starts with
            # the next one, so that none always finds the caches as one other left them.
            order = names[i % len(names) :] + names[: i % len(names)]
            for name, run in ((name, runs[name]) for name in order):
                if len(run.times) < run.iters:
                    ctx.barrier()
                    t0 = time.perf_counter()
                    _allreduce(send, recv, op, comm, variants[name])
                    run.times.append(time.perf_counter() - t0)
        for name, run in runs.items():
            row = _row(comm, run, nbytes, count, args)
            row["copy_GBs"], row["stream_GBs"] = copy_bw, stream_bw
            if "hierarchical" in run.label and variants[name][1] is None:
                row["window"] = _window_note(ctx, nbytes)
            rows.append(row)
            total_wrong += max(row["wrong"], 0)
            if rank == 0:
                print(_format(row))
                if row.get("window"):
                    print(f"#   {row['window']}")
                sys.stdout.flush()

    if args.plot:  # the layout the cost model is drawn for (collective on first use)
        lay = layout(ctx)
        nodes, per_node = lay.nodes, lay.slices
    if rank == 0:
        print(f"# wrong elements in total: {total_wrong}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"header": header, "rows": rows}, fh, indent=1)
        if args.plot:
            _plot.draw(rows, header, args.plot, nodes, per_node, argv, command)
            print(f"# plot written to {args.plot}")
    return 1 if total_wrong else 0
