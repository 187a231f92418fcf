"""``python -m ringmpi report``: the command line's JSON results merged into one table.

Each file is what ``python -m ringmpi.allreduce --json FILE`` wrote (a header and
rows), possibly stamped with the Slurm job that made it (``header["job"]``, written by
the jobs/ scripts). The table has one line per (file, size, algorithm), sorted by
size, algorithm and layout, so that the same algorithm at 1, 2, 4 ... nodes reads
down one block::

    python -m ringmpi report results/*.json
    python -m ringmpi report results/scaling-*.json --markdown --plot scaling.png

``nodes`` is the node count the hierarchical algorithm saw: real nodes, or with a
``*`` nodes emulated by ``RINGMPI_RANKS_PER_NODE`` inside fewer real ones. The exit
status is 1 when any row counted a wrong element, 2 for a file that is not such a
result.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from . import prog
from ._units import format_size

__all__ = ["Line", "main", "merge", "render"]

_COLUMNS = ("size", "algorithm", "ranks", "nodes", "time(us)", "busbw(GB/s)", "#wrong",
            "steps", "run", "host", "commit")  # fmt: skip


@dataclass(frozen=True)
class Line:
    """One row of one result file, with the layout and the run it came from."""

    size: int
    algorithm: str
    ranks: int
    nodes: int
    emulated: bool
    time_us: float
    busbw: float
    wrong: int  # -1: not checked
    steps: int | None
    run: str  # the Slurm job (id and script), else the file's name
    host: str
    commit: str
    source: str  # the file

    @property
    def layout(self) -> str:
        star = "*" if self.emulated else ""
        return f"{self.ranks} ranks, {self.nodes}{star} node{'s' if self.nodes > 1 else ''}"


def _lines(path: Path) -> list[Line]:
    """The rows of one result file; ValueError naming the file if it is not one."""
    try:
        data = json.loads(path.read_text())
        header, rows = data["header"], data["rows"]
        ranks = int(header["ranks"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: not a result of python -m ringmpi.allreduce --json ({exc})"
        ) from None
    per_node = header.get("emulated_ranks_per_node")
    nodes = -(-ranks // per_node) if per_node else int(header.get("nodes", 1))
    job = header.get("job") or {}
    run = path.stem
    if job.get("id"):
        run = f"{job['id']} {job.get('script') or job.get('name') or ''}".strip()
    return [
        Line(
            size=int(r["size"]),
            algorithm=str(r["algorithm"]),
            ranks=ranks,
            nodes=nodes,
            emulated=bool(per_node),
            time_us=float(r["time_us"]),
            busbw=float(r["busbw_GBs"]),
            wrong=int(r["wrong"]),
            steps=r.get("steps"),
            run=run,
            host=str(job.get("host") or header.get("host") or "-"),
            commit=str(job.get("commit") or header.get("commit") or "-"),
            source=str(path),
        )
        for r in rows
    ]


def merge(paths: list[str | Path]) -> list[Line]:
    """Every row of every file, sorted by size, algorithm, ranks, nodes and run."""
    lines = [line for p in paths for line in _lines(Path(p))]
    return sorted(lines, key=lambda x: (x.size, x.algorithm, x.ranks, x.nodes, x.run))


def _cells(line: Line) -> list[str]:
    return [
        format_size(line.size), line.algorithm, str(line.ranks),
        f"{line.nodes}{'*' if line.emulated else ''}", f"{line.time_us:.1f}",
        f"{line.busbw:.3f}", "N/A" if line.wrong < 0 else str(line.wrong),
        "-" if line.steps is None else str(line.steps), line.run, line.host, line.commit,
    ]  # fmt: skip


def render(lines: list[Line], markdown: bool = False) -> str:
    """The merged table: aligned text, or a Markdown table."""
    table = [_cells(line) for line in lines]
    notes = []
    if any(line.emulated for line in lines):
        notes.append("nodes*: emulated by RINGMPI_RANKS_PER_NODE inside fewer real nodes")
    notes.append("steps: counted serial steps (max over ranks); for hierarchical, inter-node")
    if markdown:
        right = {0, 2, 3, 4, 5, 6, 7}
        out = ["| " + " | ".join(_COLUMNS) + " |"]
        out.append("|" + "|".join("---:" if i in right else "---" for i in range(len(_COLUMNS)))
                   + "|")  # fmt: skip
        out += ["| " + " | ".join(row) + " |" for row in table]
        return "\n".join([*out, "", *notes]) + "\n"
    widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(_COLUMNS)]
    fmt = "  ".join(f"{{:>{w}}}" if i < 8 else f"{{:<{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*_COLUMNS).rstrip()] + [fmt.format(*row).rstrip() for row in table]
    return "\n".join(out + [f"# {n}" for n in notes]) + "\n"


def plot(lines: list[Line], path: str) -> None:
    """busbw and time against size, one curve per (algorithm, layout)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    # One curve per (algorithm, layout, run); auto's choice changes with size, so its
    # rows make one "auto" curve; the run is named only where two runs share a curve.
    curves: dict[tuple[str, str, str], list[Line]] = {}
    for line in lines:
        name = "auto" if line.algorithm.startswith("auto(") else line.algorithm
        curves.setdefault((name, line.layout, line.run), []).append(line)
    runs: dict[tuple[str, str], int] = {}
    for name, layout, _ in curves:
        runs[name, layout] = runs.get((name, layout), 0) + 1
    fig, (bw, tm) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (name, layout, run), points in curves.items():
        label = f"{name} ({layout})" + (f" [{run}]" if runs[name, layout] > 1 else "")
        points.sort(key=lambda x: x.size)
        sizes = [p.size for p in points]
        bw.plot(sizes, [p.busbw for p in points], marker="o", label=label)
        tm.plot(sizes, [p.time_us for p in points], marker="o", label=label)
    for ax, what in ((bw, "busbw (GB/s)"), (tm, "time (us)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel(what)
        ax.grid(True, alpha=0.3)
    tm.set_yscale("log")
    bw.legend(fontsize="small")
    fig.suptitle("ringmpi all-reduce: " + ", ".join(sorted({x.run for x in lines})))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=prog("report"),
        description="Merge python -m ringmpi.allreduce --json results into one table.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE.json")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument(
        "--plot", metavar="OUT.png", help="also draw busbw and time against size (matplotlib)"
    )
    args = parser.parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401, PLC0415
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'ringmpi[plot]' (or matplotlib)")
    try:
        lines = merge(args.files)
    except ValueError as exc:
        parser.error(str(exc))
    sys.stdout.write(render(lines, markdown=args.markdown))
    wrong = sum(max(line.wrong, 0) for line in lines)
    print(f"{'' if args.markdown else '# '}{len(lines)} rows from {len(args.files)} file(s); "
          f"wrong elements in total: {wrong}")  # fmt: skip
    if args.plot:
        plot(lines, args.plot)
        print(f"{'' if args.markdown else '# '}plot written to {args.plot}")
    return 1 if wrong else 0
