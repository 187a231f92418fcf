"""``python -m ringmpi report``: the command line's JSON results merged into one table.

Each file is what ``python -m ringmpi.allreduce --json FILE`` wrote (a header and
rows), possibly stamped with the Slurm job that made it (``header["job"]``, written by
the jobs/ scripts). The table has one line per (file, size, algorithm), sorted by
size, algorithm and layout, so that the same algorithm at 1, 2, 4 ... nodes reads
down one block::

    python -m ringmpi report results/*.json
    python -m ringmpi report results/scaling-*.json --markdown --plot scaling.png

With ``--versus`` it sets auto against the MPI library's own call (the
``mpi4py`` rows, else ``mpi``) in each file, one column group per library, and
plots both times and their ratio (``make bench`` makes the README's this way)::

    python -m ringmpi report --versus results/bench-*.json --markdown --plot glance.png

``nodes`` is the node count the hierarchical algorithm saw: real nodes, or with a
``*`` nodes emulated by ``RINGMPI_RANKS_PER_NODE`` inside fewer real ones. The exit
status is 1 when any row counted a wrong element, 2 for a file that is not such a
result.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from . import command_parser
from ._units import format_size

__all__ = ["Line", "main", "merge", "render", "versus"]

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
    library: str = "-"  # the MPI library the run used, as it names itself
    order: int = 0  # the file's place among those given

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
            library=_family(str(header.get("mpi_library", "-"))),
        )
        for r in rows
    ]


def _family(library: str) -> str:
    """A library's short name from its version string."""
    for name in ("MPICH", "Open MPI", "Intel"):
        if name.lower() in library.lower():
            return "Intel MPI" if name == "Intel" else name
    return library.split(",", maxsplit=1)[0].strip() or "-"


_BASELINES = ("mpi4py", "mpi")  # the library's own call, through mpi4py or the registry


def versus(lines: list[Line]) -> tuple[list[str], dict[int, dict[str, tuple]]]:
    """(libraries, {size: {library: (library us, auto us, auto's choice)}}): auto
    against the library's own call, row by row of each file."""
    table: dict[int, dict[str, tuple]] = {}
    libraries: list[str] = []
    by_run: dict[tuple[str, str], dict[int, dict[str, Line]]] = {}
    for line in lines:
        by_run.setdefault((line.library, line.source), {}).setdefault(line.size, {})[
            "auto" if line.algorithm.startswith("auto") else line.algorithm
        ] = line
    for (library, _), sizes in by_run.items():
        for size, found in sizes.items():
            base = next((found[b] for b in _BASELINES if b in found), None)
            if base is None or "auto" not in found:
                continue
            if library not in libraries:
                libraries.append(library)
            auto = found["auto"]
            choice = auto.algorithm[5:-1] if auto.algorithm.startswith("auto(") else "auto"
            table.setdefault(size, {})[library] = (base.time_us, auto.time_us, choice)
    if not table:
        raise ValueError("--versus needs files with both auto and mpi4py (or mpi) rows")
    first: dict[str, int] = {}  # each library in the order of the files given
    for line in lines:
        first.setdefault(line.library, line.order)
    libraries.sort(key=lambda lib: first[lib])
    return libraries, dict(sorted(table.items()))


def render_versus(libraries: list[str], table: dict[int, dict[str, tuple]],
                  markdown: bool) -> str:  # fmt: skip
    head = ["size"]
    for lib in libraries:
        head += [f"{lib} (us)", "auto (us)", "auto / lib"]
    rows = []
    for size, found in table.items():
        row = [format_size(size)]
        for lib in libraries:
            if lib in found:
                base, auto, choice = found[lib]
                row += [f"{base:.1f}", f"{auto:.1f} {choice}", f"{auto / base:.2f}"]
            else:
                row += ["-", "-", "-"]
        rows.append(row)
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" for _ in head) + "|"]
        return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*r) for r in rows]) + "\n"


def plot_versus(libraries: list[str], table: dict[int, dict[str, tuple]], path: str,
                title: str) -> None:  # fmt: skip
    """Two panels, 800 px wide: each library's time and auto's against size, and
    auto's time over the library's (below 1: auto is faster)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (tm, ratio) = plt.subplots(1, 2, figsize=(8, 3.6), dpi=100)
    for i, lib in enumerate(libraries):
        colour = f"C{i}"
        sizes = [s for s in table if lib in table[s]]
        base = [table[s][lib][0] for s in sizes]
        auto = [table[s][lib][1] for s in sizes]
        tm.plot(sizes, base, linestyle="--", color=colour, label=f"{lib}'s own")
        tm.plot(sizes, auto, marker="o", markersize=3, color=colour, label=f"auto on {lib}")
        ratio.plot(sizes, [a / b for a, b in zip(auto, base, strict=True)], marker="o",
                   markersize=3, color=colour, label=lib)  # fmt: skip
    ratio.axhline(1.0, color="black", linewidth=0.8)
    for ax in (tm, ratio):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("buffer (bytes)", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
    tm.set_yscale("log")
    tm.set_ylabel("time per call (µs)", fontsize=9)
    ratio.set_ylabel("auto / library (below 1: faster)", fontsize=9)
    tm.legend(fontsize=7, loc="upper left")
    ratio.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def merge(paths: list[str | Path]) -> list[Line]:
    """Every row of every file, sorted by size, algorithm, ranks, nodes and run."""
    lines = [replace(line, order=i) for i, p in enumerate(paths) for line in _lines(Path(p))]
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


def _many(n: int, one: str, more: str) -> str:
    return f"{n} {one if n == 1 else more}"


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("report", __doc__)
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE.json",
        help="what python -m ringmpi.allreduce --json wrote",
    )
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument(
        "--plot", metavar="OUT.png", help="also draw busbw and time against size (matplotlib)"
    )
    parser.add_argument("--versus", action="store_true",
                        help="auto against each file's MPI library's own call")  # fmt: skip
    args = parser.parse_args(argv)
    if args.plot:
        try:
            import matplotlib  # noqa: F401, PLC0415
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'ringmpi[plot]' (or matplotlib)")
    try:
        lines = merge(args.files)
        if args.versus:
            libraries, table = versus(lines)
    except ValueError as exc:
        parser.error(str(exc))
    if args.versus:
        sys.stdout.write(render_versus(libraries, table, args.markdown))
        ranks = sorted({line.ranks for line in lines})
        if args.plot:
            title = (
                f"auto against each library's own MPI_Allreduce, {'/'.join(map(str, ranks))} ranks"
            )
            plot_versus(libraries, table, args.plot, title)
        wrong = sum(max(line.wrong, 0) for line in lines)
        print(
            f"\n{_many(len(table), 'size', 'sizes')}, "
            f"{_many(len(libraries), 'library', 'libraries')}; wrong elements in total: {wrong}"
        )
        return 1 if wrong else 0
    sys.stdout.write(render(lines, markdown=args.markdown))
    wrong = sum(max(line.wrong, 0) for line in lines)
    print(f"{'' if args.markdown else '# '}{len(lines)} rows from {len(args.files)} file(s); "
          f"wrong elements in total: {wrong}")  # fmt: skip
    if args.plot:
        plot(lines, args.plot)
        print(f"{'' if args.markdown else '# '}plot written to {args.plot}")
    return 1 if wrong else 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("report")
