"""``python -m ringmpi trace``: one call's schedule as it ran, rank by rank, in time.

Under mpirun every rank makes a few untimed calls of one algorithm and size, then
one traced call (:func:`ringmpi.trace`). Each plan row records when it started
and ended and how long it spent reducing; each pass through the node's shared
memory records its span. Rank 0 gathers them and draws a timeline (``--plot``)
and writes Chrome-trace JSON (``--chrome``) that Perfetto and chrome://tracing
open. Times count from the end of a barrier just before the call: on one host
the ranks share a clock; across hosts each rank's axis starts at its own exit
from that barrier.

    mpirun -n 4 python -m ringmpi trace -a ring -b 1M --plot ring.png --chrome ring.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

from . import command_parser
from ._units import format_size, parse_size, whole

__all__ = ["chrome", "draw", "main"]

# Colours by what a step did: the message phases by name, the node's shared memory apart.
_COLOURS = {
    "reduce-scatter": "#4c72b0",
    "all-gather": "#55a868",
    "recursive-doubling": "#c44e52",
    "fold-in": "#8172b2",
    "fold-out": "#8172b2",
    "shared": "#dd8452",
}


def _kind(span: dict) -> str:
    if span["shared"]:
        return "shared"
    phase = span["phase"].split()[-1]
    return phase if phase in _COLOURS else "reduce-scatter"


def _rows(spans: list[list[dict]]) -> list[tuple[int, dict]]:
    return [(rank, s) for rank, mine in enumerate(spans) for s in mine]


def chrome(spans: list[list[dict]], title: str) -> dict:
    """The spans of every rank (lists of :class:`ringmpi._trace.Span` as dicts, times
    in ns from the barrier) as Chrome-trace JSON: a thread per rank, a complete
    event per step, its reduce nested at the end of it."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0,
                           "args": {"name": title}}]  # fmt: skip
    for rank in range(len(spans)):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": rank,
                       "args": {"name": f"rank {rank}"}})  # fmt: skip
    for rank, s in _rows(spans):
        name = f"{s['phase']} {s['step']}" if not s["shared"] else s["phase"]
        args = {"algorithm": s["algorithm"], "bytes sent": s["nbytes"]}
        if s["sent_to"] >= 0:
            args["to"] = s["sent_to"]
        if s["received_from"] >= 0:
            args["from"] = s["received_from"]
        events.append({"ph": "X", "name": name, "cat": _kind(s), "pid": 0, "tid": rank,
                       "ts": s["start"] / 1e3, "dur": (s["end"] - s["start"]) / 1e3,
                       "args": args})  # fmt: skip
        if s["reducing"] > 0:
            events.append({"ph": "X", "name": "reduce", "cat": "reduce", "pid": 0, "tid": rank,
                           "ts": (s["end"] - s["reducing"]) / 1e3,
                           "dur": s["reducing"] / 1e3})  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def draw(spans: list[list[dict]], path: str, title: str) -> None:
    """A timeline PNG, 800 px wide: a lane per rank, a bar per step coloured by its
    phase, the time it spent reducing dark at the bar's end, the peer it sent to
    written on it where it fits."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    nranks = len(spans)
    end = max((s["end"] for _, s in _rows(spans)), default=1) / 1e3 or 1.0
    fig, ax = plt.subplots(figsize=(8, 1.5 + 0.4 * nranks), dpi=100)
    for rank, s in _rows(spans):
        x, w = s["start"] / 1e3, max((s["end"] - s["start"]) / 1e3, end / 400)
        ax.barh(rank, w, left=x, height=0.7, color=_COLOURS[_kind(s)], edgecolor="white",
                linewidth=0.5)  # fmt: skip
        if s["reducing"] > 0:
            r = s["reducing"] / 1e3
            ax.barh(rank, r, left=x + w - r, height=0.7, color="black", alpha=0.35)
        if s["sent_to"] >= 0 and w > end / 25:
            ax.text(x + w / 2, rank, f"→{s['sent_to']}", ha="center", va="center",
                    fontsize=8, color="white")  # fmt: skip
    ax.set_yticks(range(nranks), [f"rank {r}" for r in range(nranks)])
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1.02)
    ax.set_xlabel("µs from the barrier before the call")
    fig.suptitle(title, fontsize=10)
    kinds = list(dict.fromkeys(_kind(s) for _, s in _rows(spans)))
    handles = [Patch(color=_COLOURS[k], label="shared memory" if k == "shared" else k)
               for k in kinds]  # fmt: skip
    if any(s["reducing"] > 0 for _, s in _rows(spans)):
        handles.append(Patch(color="black", alpha=0.35, label="reducing"))
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0),
              ncol=len(handles), fontsize=8, frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = command_parser("trace", __doc__)
    p.add_argument("-a", "--algorithm", default="ring", help="the algorithm")
    p.add_argument(
        "-b",
        "--bytes",
        default=1 << 20,
        type=parse_size,
        help="the buffer's size, e.g. 8, 64K, 16M",
    )
    p.add_argument("-d", "--datatype", default="float32", help="NumPy dtype")
    p.add_argument("-w", "--warmup", type=whole(0), default=3, help="untimed calls first")
    p.add_argument("--ranks-per-node", type=int, metavar="K",
                   help="emulate nodes of K ranks (RINGMPI_RANKS_PER_NODE)")  # fmt: skip
    p.add_argument("--plot", metavar="FILE", help="write the timeline as a PNG")
    p.add_argument("--chrome", metavar="FILE", help="write Chrome-trace JSON (Perfetto)")
    p.add_argument("--json", metavar="FILE", help="write every rank's spans as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.plot:
        from ._plot import check  # noqa: PLC0415

        check()
    if args.ranks_per_node:
        os.environ["RINGMPI_RANKS_PER_NODE"] = str(args.ranks_per_node)
    import numpy as np  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    import ringmpi  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    dtype = np.dtype(args.datatype)
    count = max(0, args.bytes // dtype.itemsize)
    x = np.ones(count, dtype)
    for _ in range(args.warmup):
        ringmpi.Allreduce(MPI.IN_PLACE, x, comm=comm, algorithm=args.algorithm)
    x[:] = 1
    comm.Barrier()
    zero = time.monotonic_ns()
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, comm=comm, algorithm=args.algorithm)
    mine_wrong = int(np.count_nonzero(x != comm.Get_size()))
    mine = [dict(s.__dict__, start=s.start - zero, end=s.end - zero) for s in t.spans]
    spans = comm.gather(mine, root=0)
    wrong = comm.reduce(mine_wrong, op=MPI.SUM, root=0)
    if comm.Get_rank() != 0:
        return 0
    assert spans is not None
    title = (f"{args.algorithm}, {format_size(count * dtype.itemsize, long=True)} of {dtype.name}, "
             f"{comm.Get_size()} ranks"
             + (f", nodes of {args.ranks_per_node}" if args.ranks_per_node else ""))  # fmt: skip
    for rank, ss in enumerate(spans):
        for s in ss:
            peer = f" to {s['sent_to']}" if s["sent_to"] >= 0 else ""
            print(f"rank {rank} {s['phase']:>32} step {s['step']:>2}{peer:>7} "
                  f"{s['start'] / 1e3:9.1f} - {s['end'] / 1e3:9.1f} us "
                  f"reducing {s['reducing'] / 1e3:7.1f} us  {s['nbytes']:>10} B")  # fmt: skip
    print(f"# {title}: wrong elements {wrong}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"title": title, "spans": spans}, f)
    if args.chrome:
        with open(args.chrome, "w") as f:
            json.dump(chrome(spans, title), f)
    if args.plot:
        draw(spans, args.plot, title)
    return 1 if wrong else 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("trace")
