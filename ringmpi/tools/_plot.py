"""``python -m ringmpi allreduce --plot FILE``: the benchmark's rows as a picture.

Three panels from the rows the run measured: bus bandwidth against size for
every algorithm (the MPI baseline among them), time against size at the small
sizes where latency rules, and the cost model's predicted time
(:mod:`ringmpi.tuning`, with the constants in use) against the measured one.
matplotlib is optional (the ``plot`` extra); :func:`check` says so before
anything runs.
"""

from __future__ import annotations

import os
import sys

from ringmpi import algorithms, tuning

__all__ = ["check", "draw"]

_SMALL = 64 << 10  # the latency panel's largest size


def check(path: str = "") -> None:
    """ValueError naming the missing package, or a file type matplotlib does not
    write, before any communication."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase  # noqa: PLC0415
    except ImportError:
        raise ValueError(
            "--plot needs matplotlib: pip install 'ringmpi[plot]' (or matplotlib)"
        ) from None
    kinds = FigureCanvasBase.get_supported_filetypes()
    kind = os.path.splitext(path)[1][1:].lower()
    if kind and kind not in kinds:
        raise ValueError(f"--plot {path}: matplotlib writes no .{kind} file "
                         f"(it writes {', '.join(sorted(kinds))})")  # fmt: skip


def _base(label: str) -> str:
    """The algorithm a row ran: auto(ring) ran the ring."""
    return label[5:-1] if label.startswith("auto(") else label


def draw(rows: list[dict], header: dict, path: str, nodes: int, per_node: int, argv,
         typed: str) -> None:  # fmt: skip
    """The rows as a PNG at ``path``, titled with the command as typed (``typed``, ``argv``)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    p = header["ranks"]
    costs = tuning.load(per_node)
    labels = list(dict.fromkeys(_label(r) for r in rows))
    fig, (bw, lat, model) = plt.subplots(1, 3, figsize=(16, 5))
    for label in labels:
        mine = [r for r in rows if _label(r) == label]
        sizes = [r["size"] for r in mine]
        style = {"linestyle": "--", "color": "black"} if label == "mpi" else {}
        bw.plot(sizes, [r["busbw_GBs"] for r in mine], marker="o", label=label, **style)
        small = [r for r in mine if r["size"] <= _SMALL]
        if small:
            lat.plot([r["size"] for r in small], [r["time_us"] for r in small], marker="o",
                     label=label, **style)  # fmt: skip
    measured, predicted = [], []
    for r in rows:
        base = _base(r["algorithm"])
        if base in algorithms.candidates():
            measured.append(r["time_us"])
            predicted.append(algorithms.predict(costs, base, r["size"], p, nodes, per_node) * 1e6)
            model.annotate(base[:4], (predicted[-1], measured[-1]), fontsize=6)
    if measured:
        model.scatter(predicted, measured, s=12)
        lo, hi = min(measured + predicted), max(measured + predicted)
        model.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, label="measured = predicted")
    for ax, title, ylabel in (
        (bw, "bus bandwidth", "busbw (GB/s)"),
        (lat, f"time, sizes up to {_SMALL >> 10} KiB", "time (us)"),
        (model, "cost model: predicted against measured", "measured time (us)"),
    ):
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2 if ax is not model else 10)
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=7)
    bw.set_xlabel("size (bytes)")
    lat.set_xlabel("size (bytes)")
    lat.set_yscale("log")
    model.set_xlabel("predicted time (us)")
    model.set_yscale("log")
    command = " ".join(sys.argv[1:] if argv is None else argv)
    fig.suptitle(f"ringmpi all-reduce, {p} ranks on {nodes} node(s), {header['datatype']} "
                 f"{header['op']}; {header['mpi_library']}\n"
                 f"{typed} {command}", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _label(row: dict) -> str:
    # auto's rows are one line whatever it chose at each size
    return "auto" if row["algorithm"].startswith("auto(") else row["algorithm"]
