"""``python -m ringmpi scaling``: the cost model taken beyond one machine, on paper.

The model is :mod:`ringmpi.tuning`'s, called, not copied: for M nodes of L
ranks (N = M L ranks) and n bytes,

    ring                2(N-1) alpha + 2n(N-1)/N beta + n(N-1)/N gamma
    recursive_doubling  lg N (alpha + n beta + n gamma)
    hierarchical        node phase (node_call, node_step, node_byte n)
                        + 2(M-1) alpha + 2(n/L)(M-1)/M beta + (n/L)(M-1)/M gamma

with alpha and beta those of the fabric between nodes (a flat ring's step, and
a recursive-doubling exchange, waits for its slowest link, a network one) and
every other constant that of a node of L ranks (:func:`tuning.defaults`, or a
tuning file). One node is all shared memory: the node's own constants.

Four modes:

* predict (the default): time and busbw of each algorithm from 8 to 512 nodes
  of 8 ranks, as a table (``--markdown``) and a plot (``--plot FILE``);
* ``--simulate`` (the ``simulate`` extra, SimGrid): the plans replayed as
  messages on a modelled fat tree (:mod:`ringmpi.tools._simgrid`) for 8 B to
  256 MiB, auto's pick by the model, and the alpha-beta lower bound; with
  ``--check RUN.json ...``, the measured runs' layouts replayed against them;
* ``--check RUN.json ...``: every row of ``python -m ringmpi.allreduce --json``
  runs against the model's prediction for its nodes, ranks per node and size;
* ``--pingpong FILE`` (under ``mpirun -n 2``, one rank per host): measure the
  fabric's alpha and beta, t(n) = alpha + n beta one way, and write them as JSON
  for ``--fabric``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
from typing import Any

from ringmpi import algorithms, tuning

from . import command_parser
from ._units import format_size, parse_size, sweep, whole

__all__ = ["FABRIC", "Fabric", "busbw", "check", "costs_for", "fit_fabric", "lower_bound", "main",
           "pingpong", "predict", "predict_grid", "simulate_grid"]  # fmt: skip

ALGORITHMS = ("ring", "hierarchical", "recursive_doubling")
NODES = (8, 16, 32, 64, 128, 256, 512)
PER_NODE = 8
SIZES = (8, 64 << 10, 1 << 20, 16 << 20, 256 << 20)


@dataclasses.dataclass(frozen=True)
class Fabric:
    """The network between nodes: seconds per message (one way) and per byte."""

    alpha: float
    beta: float


# The emulated fabric of cluster/hosts-up.sh on bare links (veth pairs into a
# bridge, UCX over TCP), 1 rank per host, ping-pong medians, 2026-11-30:
# docs/scaling.md.
FABRIC = Fabric(alpha=17e-6, beta=0.78e-9)


def costs_for(nodes: int, per_node: int, fabric: Fabric = FABRIC, node: tuning.Costs | None = None):
    """The model's constants for ``nodes`` nodes of ``per_node`` ranks: the node's
    own (``node``, or the untuned defaults for that many ranks), with alpha and
    beta those of ``fabric`` where there is more than one node."""
    base = node if node is not None else tuning.defaults(per_node)
    if nodes <= 1:
        return base
    return dataclasses.replace(base, alpha=fabric.alpha, beta=fabric.beta)


def predict(costs: tuning.Costs, algorithm: str, n: float, nodes: int, per_node: int,
            shared_nic: bool = False) -> float:  # fmt: skip
    """:func:`ringmpi.algorithms.predict` for ``nodes`` nodes of ``per_node`` ranks.

    ``shared_nic``: the L rails of hierarchical share one link per node (as the
    hosts of cluster/hosts-up.sh --rate do), so each rail's bytes cost L beta;
    the model as written gives every rail a link of its own.
    """
    if shared_nic and algorithm == "hierarchical" and nodes > 1:
        costs = dataclasses.replace(costs, beta=costs.beta * per_node)
    return algorithms.predict(costs, algorithm, n, nodes * per_node, nodes, per_node)


def busbw(n: float, p: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth in bytes per second: n/t * 2(p-1)/p."""
    return n / seconds * 2 * (p - 1) / p if seconds > 0 and p > 1 else 0.0


def predict_grid(
    fabric: Fabric = FABRIC,
    node: tuning.Costs | None = None,
    nodes=NODES,
    per_node: int = PER_NODE,
    sizes=SIZES,
    shared_nic: bool = False,
) -> list[dict]:
    """One row per (size, nodes): predicted seconds and busbw of every algorithm."""
    rows = []
    for n in sizes:
        for m in nodes:
            p = m * per_node
            costs = costs_for(m, per_node, fabric, node)
            row = {"bytes": n, "nodes": m, "per_node": per_node, "ranks": p}
            for a in ALGORITHMS:
                t = predict(costs, a, n, m, per_node, shared_nic)
                row[a] = {"seconds": t, "busbw": busbw(n, p, t)}
            row["best"] = min(ALGORITHMS, key=lambda a: row[a]["seconds"])
            rows.append(row)
    return rows


# --simulate: sizes 8 B to 256 MiB, a factor 32 apart.
SIM_SIZES = (8, 256, 8 << 10, 256 << 10, 8 << 20, 256 << 20)


def lower_bound(n: float, p: int, fabric: Fabric) -> float:
    """The alpha-beta lower bound of an all-reduce of n bytes over p ranks on the fabric:
    max(ceil(lg p) alpha, 2n(p-1)/p beta)."""
    if p <= 1:
        return 0.0
    return max(math.ceil(math.log2(p)) * fabric.alpha, 2 * n * (p - 1) / p * fabric.beta)


def simulate_grid(fabric: Fabric = FABRIC, node: tuning.Costs | None = None, nodes=NODES,
                  per_node: int = PER_NODE, sizes=SIM_SIZES,
                  shared_nic: bool = False) -> list[dict]:  # fmt: skip
    """One row per (size, nodes): every algorithm's time replayed in SimGrid
    (:mod:`ringmpi.tools._simgrid`), auto's pick by the model and its predicted and
    replayed time, and the alpha-beta lower bound."""
    from . import _simgrid  # noqa: PLC0415 (the simulate extra)

    rows = []
    for m in nodes:
        p = m * per_node
        costs = costs_for(m, per_node, fabric, node)
        inside = node if node is not None else tuning.defaults(per_node)
        got = _simgrid.simulate(m, per_node, sizes, ALGORITHMS, costs, inside, fabric.alpha,
                                fabric.beta, shared_nic)  # fmt: skip
        for n in sizes:
            row = {"bytes": n, "nodes": m, "per_node": per_node, "ranks": p}
            for a in ALGORITHMS:
                row[a] = {"simulated": got[a, n],
                          "predicted": predict(costs, a, n, m, per_node, shared_nic)}  # fmt: skip
            pick = min(ALGORITHMS, key=lambda a: row[a]["predicted"])
            bound = lower_bound(n, p, fabric)
            row["auto"] = {"algorithm": pick, "predicted": row[pick]["predicted"],
                           "simulated": row[pick]["simulated"], "bound": bound}  # fmt: skip
            rows.append(row)
        rows.sort(key=lambda r: (r["bytes"], r["nodes"]))
    return rows


def simulate_plot(rows: list[dict], path: str, fabric: Fabric) -> None:
    """Auto's simulated time over the lower bound against ranks, one line per size; and
    every algorithm's simulated time against ranks at 256 KiB."""
    plt = _pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.4))
    for n in sorted({r["bytes"] for r in rows}):
        sub = [r for r in rows if r["bytes"] == n and r["auto"]["simulated"]]
        left.semilogx([r["ranks"] for r in sub],
                      [r["auto"]["simulated"] / r["auto"]["bound"] for r in sub], "o-", ms=3,
                      label=format_size(n, long=True))  # fmt: skip
    left.axhline(1.5, color="k", lw=0.8, ls="--")
    left.set(xlabel="ranks (8 per node)", ylabel="auto / lower bound",
             title="auto, simulated, over the alpha-beta bound")  # fmt: skip
    left.legend(fontsize=7, ncol=2)
    size = 256 << 10
    sub = [r for r in rows if r["bytes"] == size]
    for a, style in zip(ALGORITHMS, ("o-", "s-", "^-"), strict=True):
        pts = [(r["ranks"], r[a]["simulated"]) for r in sub if r[a]["simulated"]]
        if pts:
            right.loglog(*zip(*pts, strict=True), style, ms=3, label=a)
    right.loglog([r["ranks"] for r in sub], [r["auto"]["bound"] for r in sub], "k--", lw=0.8,
                 label="lower bound")  # fmt: skip
    right.set(xlabel="ranks (8 per node)", ylabel="seconds", title="256 KiB, simulated")
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"SimGrid replay: fabric alpha {fabric.alpha * 1e6:.3g} us, "
                 f"beta {fabric.beta * 1e9:.3g} ns/B", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def simulate_check(runs: list[dict], fabric: Fabric = FABRIC, node: tuning.Costs | None = None,
                   shared_nic: bool = False) -> list[dict]:  # fmt: skip
    """Every row of the runs that ran a modelled algorithm: its time replayed in SimGrid
    on the run's layout, predicted and measured."""
    from . import _simgrid  # noqa: PLC0415

    out = []
    for run in runs:
        p, m, per_node = _layout(run["header"])
        if m * per_node != p:
            raise ValueError(f"uneven nodes ({p} ranks on {m}) are not in this model")
        costs = costs_for(m, per_node, fabric, node)
        inside = node if node is not None else tuning.defaults(per_node)
        rows = [r for r in run["rows"] if _algorithm(r["algorithm"]) in ALGORITHMS]
        sizes = sorted({r["size"] for r in rows})
        names = sorted({_algorithm(r["algorithm"]) for r in rows})
        got = _simgrid.simulate(m, per_node, sizes, names, costs, inside, fabric.alpha,
                                fabric.beta, shared_nic)  # fmt: skip
        for row in rows:
            algo = _algorithm(row["algorithm"])
            measured = row["time_us"] * 1e-6
            simulated = got[algo, row["size"]]
            out.append({"nodes": m, "per_node": per_node, "ranks": p, "bytes": row["size"],
                        "algorithm": row["algorithm"], "measured": measured,
                        "predicted": predict(costs, algo, row["size"], m, per_node, shared_nic),
                        "simulated": simulated,
                        "ratio": measured / simulated if simulated else None})  # fmt: skip
    return out


def _algorithm(label: str) -> str:
    return label[5:-1] if label.startswith("auto(") else label


def simulate_check_table(rows: list[dict], markdown: bool = False) -> str:
    head = ["nodes x ranks", "size", "algorithm", "predicted", "simulated", "measured",
            "measured/simulated"]  # fmt: skip
    body = [[f"{r['nodes']} x {r['per_node']}", format_size(r["bytes"], long=True), r["algorithm"],
             _time(r["predicted"]), _time(r["simulated"]) if r["simulated"] else "-",
             _time(r["measured"]), f"{r['ratio']:.2f}" if r["ratio"] else "-"]
            for r in rows]  # fmt: skip
    return _render(head, body, markdown)


def simulate_table(rows: list[dict], markdown: bool = False) -> str:
    """The replayed grid as text (or a markdown table)."""
    head = ["size", "nodes x ranks", "N", *(f"{a} simulated" for a in ALGORITHMS), "auto runs",
            "auto predicted", "auto simulated", "lower bound", "auto / bound"]  # fmt: skip
    body = []
    for r in rows:
        auto = r["auto"]
        sim = auto["simulated"]
        cells = [format_size(r["bytes"], long=True), f"{r['nodes']} x {r['per_node']}",
                 str(r["ranks"])]  # fmt: skip
        cells += [_time(r[a]["simulated"]) if r[a]["simulated"] is not None else "-"
                  for a in ALGORITHMS]  # fmt: skip
        cells += [auto["algorithm"], _time(auto["predicted"]),
                  _time(sim) if sim is not None else "-", _time(auto["bound"]),
                  f"{sim / auto['bound']:.2f}" if sim and auto["bound"] else "-"]  # fmt: skip
        body.append(cells)
    return _render(head, body, markdown)


def _time(t: float) -> str:
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def _bw(b: float) -> str:
    return f"{b / 1e9:.3g}" if b >= 1e6 else f"{b / 1e9:.2e}"


def table(rows: list[dict], markdown: bool = False) -> str:
    """The prediction grid as text (or a markdown table)."""
    head = ["size", "nodes x ranks", "N"]
    head += [f"{a} time" for a in ALGORITHMS] + [f"{a} busbw (GB/s)" for a in ALGORITHMS]
    head.append("fastest")
    body = []
    for r in rows:
        size = format_size(r["bytes"], long=True)
        cells = [size, f"{r['nodes']} x {r['per_node']}", str(r["ranks"])]
        cells += [_time(r[a]["seconds"]) for a in ALGORITHMS]
        cells += [_bw(r[a]["busbw"]) for a in ALGORITHMS]
        cells.append(r["best"])
        body.append(cells)
    return _render(head, body, markdown)


def _render(head: list[str], body: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c) + " |" for c in body]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join(["# " + fmt.format(*head)] + ["  " + fmt.format(*c) for c in body])


def _layout(header: dict) -> tuple[int, int, int]:
    """(ranks, nodes, ranks per node) of a CLI run, emulated nodes included."""
    p = int(header["ranks"])
    per_node = header.get("emulated_ranks_per_node") or max(1, p // max(1, int(header["nodes"])))
    return p, max(1, -(-p // per_node)), int(per_node)


def check(runs: list[dict], fabric: Fabric = FABRIC, node: tuning.Costs | None = None,
          shared_nic: bool = False) -> list[dict]:  # fmt: skip
    """Every row of the runs that ran a modelled algorithm, with its prediction."""
    out = []
    for run in runs:
        p, m, per_node = _layout(run["header"])
        costs = costs_for(m, per_node, fabric, node)
        for row in run["rows"]:
            label = row["algorithm"]
            algo = label[5:-1] if label.startswith("auto(") else label
            if algo not in ALGORITHMS:
                continue
            if m * per_node != p:
                raise ValueError(f"uneven nodes ({p} ranks on {m}) are not in this model")
            predicted = predict(costs, algo, row["size"], m, per_node, shared_nic)
            measured = row["time_us"] * 1e-6
            out.append({"nodes": m, "per_node": per_node, "ranks": p, "bytes": row["size"],
                        "algorithm": label, "predicted": predicted, "measured": measured,
                        "ratio": measured / predicted})  # fmt: skip
    return out


def check_table(rows: list[dict], markdown: bool = False) -> str:
    head = ["nodes x ranks", "size", "algorithm", "predicted", "measured", "measured/predicted"]
    body = [[f"{r['nodes']} x {r['per_node']}", format_size(r["bytes"], long=True), r["algorithm"],
             _time(r["predicted"]), _time(r["measured"]), f"{r['ratio']:.2f}"]
            for r in rows]  # fmt: skip
    return _render(head, body, markdown)


def plot(rows: list[dict], path: str, fabric: Fabric, checked: list[dict] | None = None) -> None:
    """Predicted time against nodes, one panel per size, and busbw at the largest size."""
    plt = _pyplot()

    sizes = sorted({r["bytes"] for r in rows})
    panels = len(sizes) + 1 + (1 if checked else 0)
    cols = 3
    nrows = -(-panels // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(8, 2.6 * nrows))  # 800 px wide
    axes = list(axes.flat)
    style = {"ring": "C0o-", "hierarchical": "C1s-", "recursive_doubling": "C2^-"}
    for ax, n in zip(axes, sizes, strict=False):
        sub = [r for r in rows if r["bytes"] == n]
        for a in ALGORITHMS:
            ax.loglog([r["ranks"] for r in sub], [r[a]["seconds"] for r in sub], style[a], label=a)
        ax.set_title(f"{format_size(n, long=True)}: predicted time", fontsize=9)
        ax.set_xlabel("ranks (8 per node)")
        ax.set_ylabel("seconds")
        ax.grid(True, which="both", alpha=0.3)
    ax = axes[len(sizes)]
    big = [r for r in rows if r["bytes"] == sizes[-1]]
    for a in ALGORITHMS:
        ax.semilogx([r["ranks"] for r in big], [r[a]["busbw"] / 1e9 for r in big], style[a],
                    label=a)  # fmt: skip
    ax.set_title(f"{format_size(sizes[-1], long=True)}: predicted busbw", fontsize=9)
    ax.set_xlabel("ranks (8 per node)")
    ax.set_ylabel("GB/s")
    ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper left")
    if checked:
        ax = axes[len(sizes) + 1]
        marks = {"ring": "C0o", "hierarchical": "C1s", "recursive_doubling": "C2^"}
        for a in ALGORITHMS:
            pts = [r for r in checked if r["algorithm"].removeprefix("auto(").rstrip(")") == a]
            ax.loglog([r["predicted"] for r in pts], [r["measured"] for r in pts], marks[a],
                      alpha=0.6, label=a)  # fmt: skip
        lo = min(min(r["predicted"], r["measured"]) for r in checked)
        hi = max(max(r["predicted"], r["measured"]) for r in checked)
        ax.loglog([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = predicted")
        ax.set_title("measured against the model", fontsize=9)
        ax.set_xlabel("predicted seconds")
        ax.set_ylabel("measured seconds")
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[:panels]:
        ax.tick_params(labelsize=7)
        ax.xaxis.label.set_size(8)
        ax.yaxis.label.set_size(8)
    for ax in axes[panels:]:
        ax.set_visible(False)
    fig.suptitle(
        f"ringmpi cost model: fabric alpha {fabric.alpha * 1e6:.3g} us, "
        f"beta {fabric.beta * 1e9:.3g} ns/B ({1 / fabric.beta / 1e9:.3g} GB/s)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fit_fabric(points: list[tuple[int, float]], large: int = 1 << 20) -> Fabric:
    """alpha and beta of t = alpha + n beta from ping-pong medians (n bytes, t seconds).

    Each from its own regime, not one least-squares line through both: beta is
    the slope of a line through the points of ``large`` bytes and more (a rate
    limit's burst makes the middle sizes faster than the wire), alpha the
    smallest size's time less its bytes' worth of beta.
    """
    import numpy as np  # noqa: PLC0415

    big = sorted((n, t) for n, t in points if n >= large) or sorted(points)[-2:]
    if len(big) >= 2:
        beta = float(np.polyfit([n for n, _ in big], [t for _, t in big], 1)[0])
    else:
        beta = big[0][1] / big[0][0]
    n0, t0 = min(points)
    beta = max(beta, 0.0)
    return Fabric(alpha=max(t0 - n0 * beta, 0.0), beta=beta)


def pingpong(path: str, minbytes: int, maxbytes: int, rounds: int, argv: list[str]) -> Fabric:
    """Ranks 0 and 1 bounce a buffer; each round visits every size (interleaved)."""
    import numpy as np  # noqa: PLC0415
    from mpi4py import MPI  # noqa: PLC0415

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("--pingpong runs on exactly 2 ranks (one per host)")
    rank = comm.Get_rank()
    sizes = sweep(minbytes, maxbytes, 4)
    bufs = {n: np.zeros(n, np.uint8) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for i in range(rounds + 1):
        for n in sizes[i % len(sizes) :] + sizes[: i % len(sizes)]:
            buf, k = bufs[n], max(2, min(50, (8 << 20) // n))
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(k):
                if rank == 0:
                    comm.Send(buf, 1)
                    comm.Recv(buf, 1)
                else:
                    comm.Recv(buf, 0)
                    comm.Send(buf, 0)
            if i:  # round 0 warms the connections up
                times[n].append((MPI.Wtime() - t0) / (2 * k))
    hosts = comm.gather(MPI.Get_processor_name(), root=0)
    if rank:
        return FABRIC
    measured: list[dict[str, Any]]
    measured = [{"bytes": n, "seconds": float(np.median(t)), "low": float(np.min(t)),
                 "high": float(np.max(t)), "rounds": len(t)} for n, t in times.items()]  # fmt: skip
    fabric = fit_fabric([(m["bytes"], m["seconds"]) for m in measured])
    lib = " ".join(MPI.Get_library_version().replace("\x00", "").split("\n")[0].split())
    with open(path, "w") as fh:
        json.dump({"fabric": dataclasses.asdict(fabric), "date": datetime.date.today().isoformat(),
                   "mpi_library": lib, "hosts": hosts,
                   "command": "python -m ringmpi scaling " + " ".join(argv),
                   "measured": measured}, fh, indent=1)  # fmt: skip
    print(f"# fabric: alpha {fabric.alpha * 1e6:.2f} us, beta {fabric.beta * 1e9:.4f} ns/B "
          f"({1 / fabric.beta / 1e9 if fabric.beta else math.inf:.3g} GB/s)")  # fmt: skip
    print(f"# {'bytes':>10} {'median':>10} {'low':>10} {'high':>10} {'model':>10}  (us, one way)")
    for m in measured:
        model = fabric.alpha + m["bytes"] * fabric.beta
        print(f"  {m['bytes']:>10} {m['seconds'] * 1e6:10.1f} {m['low'] * 1e6:10.1f} "
              f"{m['high'] * 1e6:10.1f} {model * 1e6:10.1f}")  # fmt: skip
    print(f"# written to {path}")
    return fabric


def _node_costs(path: str | None) -> tuning.Costs | None:
    """The in-node constants of a tuning file (python -m ringmpi tune), or None."""
    if path is None:
        return None
    with open(path) as fh:
        given = json.load(fh)["costs"]
    own = {f.name: float(given.get(f.name, getattr(tuning.DEFAULTS, f.name)))
           for f in dataclasses.fields(tuning.Costs) if f.name != "extra"}  # fmt: skip
    return tuning.Costs(**own)  # type: ignore[arg-type]  # (mypy: all float fields)


def _fabric(args: argparse.Namespace) -> Fabric:
    fabric = FABRIC
    if args.fabric:
        with open(args.fabric) as fh:
            fabric = Fabric(**json.load(fh)["fabric"])
    if args.alpha is not None:
        fabric = dataclasses.replace(fabric, alpha=args.alpha)
    if args.beta is not None:
        fabric = dataclasses.replace(fabric, beta=args.beta)
    return fabric


# The flags that one mode alone reads: {dest: (the flag, the mode, its default)}.
_ONLY = {
    "nodes": ("--nodes", "simulate", ",".join(map(str, NODES))),
    "minbytes": ("-b/--minbytes", "pingpong", 8),
    "maxbytes": ("-e/--maxbytes", "pingpong", 16 << 20),
    "rounds": ("--rounds", "pingpong", 15),
}


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("scaling", __doc__)
    parser.add_argument(
        "--tuning",
        metavar="FILE",
        help="in-node constants (python -m ringmpi tune); default: untuned",
    )
    parser.add_argument("--fabric", metavar="FILE", help="alpha and beta from --pingpong")
    parser.add_argument(
        "--alpha", type=float, help=f"fabric seconds per message (default {FABRIC.alpha:g})"
    )
    parser.add_argument(
        "--beta", type=float, help=f"fabric seconds per byte (default {FABRIC.beta:g})"
    )
    parser.add_argument(
        "--ranks-per-node",
        type=whole(1),
        default=PER_NODE,
        help="ranks per node of the modelled nodes",
    )
    parser.add_argument(
        "--shared-nic",
        action="store_true",
        help="hierarchical's rails share one link per node (beta times L)",
    )
    parser.add_argument("--markdown", action="store_true", help="tables as markdown")
    parser.add_argument("--plot", metavar="FILE", help="draw the predictions (needs matplotlib)")
    parser.add_argument(
        "--check",
        nargs="+",
        metavar="RUN.json",
        help="python -m ringmpi.allreduce --json files: predicted vs measured",
    )
    parser.add_argument(
        "--pingpong",
        metavar="FILE",
        help="measure the fabric (2 ranks, one per host) and write it here",
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="replay the plans in SimGrid (the simulate extra) for 8 B to 256 MiB",
    )
    # The flags of one mode, with no default here: given without their mode, they are
    # refused (they would do nothing); the defaults come after.
    parser.add_argument(
        "--nodes", help=f"--simulate: comma-separated node counts (default {_ONLY['nodes'][2]})"
    )
    parser.add_argument(
        "-b", "--minbytes", type=parse_size, help="--pingpong: smallest size (default 8)"
    )
    parser.add_argument(
        "-e", "--maxbytes", type=parse_size, help="--pingpong: largest size (default 16M)"
    )
    parser.add_argument("--rounds", type=whole(1), help="--pingpong: rounds (default 15)")
    args = parser.parse_args(argv)
    for dest, (flag, mode, default) in _ONLY.items():
        if getattr(args, dest) is None:
            setattr(args, dest, default)
        elif not getattr(args, mode):
            parser.error(f"{flag} applies to --{mode} only: without it, nothing reads it")
    if args.pingpong:
        try:
            sweep(args.minbytes, args.maxbytes, 4)
        except ValueError as exc:
            parser.error(str(exc))
    argv = sys.argv[1:] if argv is None else argv
    if args.pingpong:
        pingpong(args.pingpong, args.minbytes, args.maxbytes, args.rounds, argv)
        return 0
    try:
        fabric, node = _fabric(args), _node_costs(args.tuning)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        parser.error(str(exc))
    if args.simulate:
        return _simulate_main(parser, args, fabric, node)
    rows = predict_grid(fabric, node, per_node=args.ranks_per_node, shared_nic=args.shared_nic)
    checked = None
    if args.check:
        runs = _read_runs(parser, args.check)
        try:
            checked = check(runs, fabric, node, args.shared_nic)
        except (KeyError, ValueError) as exc:
            parser.error(f"--check: {exc}")
    if args.plot:
        try:
            plot(rows, args.plot, fabric, checked)
        except ValueError as exc:
            parser.error(str(exc))
    inside = args.tuning or f"untuned defaults for {args.ranks_per_node} ranks per node"
    print(f"# fabric: alpha {fabric.alpha * 1e6:.3g} us, beta {fabric.beta * 1e9:.3g} ns/B; "
          f"in-node: {inside}{'; shared NIC' if args.shared_nic else ''}")  # fmt: skip
    print(table(rows, args.markdown))
    if checked is not None:
        print()
        print(check_table(checked, args.markdown))
        ratios = sorted(r["ratio"] for r in checked)
        if ratios:
            print(f"# {len(ratios)} points, measured/predicted from {ratios[0]:.2f} to "
                  f"{ratios[-1]:.2f}, median {ratios[len(ratios) // 2]:.2f}")  # fmt: skip
    if args.plot:
        print(f"# plot written to {args.plot}")
    return 0


def _simulate_main(parser, args, fabric: Fabric, node) -> int:
    from . import _simgrid  # noqa: PLC0415

    why = _simgrid.available()
    if why is not None:
        parser.error(f"--simulate needs SimGrid (make simulate, or pip install "
                     f"'ringmpi[simulate]'): {why}")  # fmt: skip
    try:
        nodes = [int(m) for m in args.nodes.split(",")]
    except ValueError:
        parser.error(f"--nodes: whole numbers, comma-separated, not {args.nodes!r}")
    if min(nodes) < 1:
        parser.error("--nodes: at least 1")
    inside = args.tuning or f"untuned defaults for {args.ranks_per_node} ranks per node"
    if args.check:
        runs = _read_runs(parser, args.check)
        checked = simulate_check(runs, fabric, node, args.shared_nic)
        nic = "; shared NIC" if args.shared_nic else ""
        print(f"# SimGrid replay of measured runs; fabric: alpha {fabric.alpha * 1e6:.3g} us, "
              f"beta {fabric.beta * 1e9:.3g} ns/B{nic}")  # fmt: skip
        print(simulate_check_table(checked, args.markdown))
        ratios = sorted(r["ratio"] for r in checked if r["ratio"])
        if ratios:
            near = sum(1 for x in ratios if 0.8 <= x <= 1.25)
            middle = ratios[len(ratios) // 2]
            print(f"# {len(ratios)} points, measured/simulated {ratios[0]:.2f} to "
                  f"{ratios[-1]:.2f}, median {middle:.2f}; {near} within 25 %")  # fmt: skip
        return 0
    rows = simulate_grid(fabric, node, nodes, args.ranks_per_node, shared_nic=args.shared_nic)
    if args.plot:
        try:
            simulate_plot(rows, args.plot, fabric)
        except ValueError as exc:
            parser.error(str(exc))
    print(f"# SimGrid replay; fabric: alpha {fabric.alpha * 1e6:.3g} us, beta "
          f"{fabric.beta * 1e9:.3g} ns/B; in-node: {inside}"
          f"{'; shared NIC' if args.shared_nic else ''}")  # fmt: skip
    print(simulate_table(rows, args.markdown))
    ratios = [r["auto"]["simulated"] / r["auto"]["bound"] for r in rows
              if r["auto"]["simulated"] and r["auto"]["bound"]]  # fmt: skip
    if ratios:
        print(f"# auto / lower bound: {min(ratios):.2f} to {max(ratios):.2f} over "
              f"{len(ratios)} cells")  # fmt: skip
    return 0


def _read_runs(parser, paths: list[str]) -> list[dict]:
    """The --check files, or the parser's error naming the one that cannot be read."""
    runs = []
    for path in paths:
        try:
            with open(path) as fh:
                runs.append(json.load(fh))
        except (OSError, ValueError) as exc:
            parser.error(f"--check: {path}: {exc}")
    return runs


def _pyplot():
    """matplotlib's pyplot drawing to files, or ValueError saying how to install it."""
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError:
        raise ValueError(
            "--plot needs matplotlib: pip install 'ringmpi[plot]' (or matplotlib)"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("scaling")
