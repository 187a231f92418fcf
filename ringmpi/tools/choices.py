"""``python -m ringmpi choices``: what auto's cost model picks, by size and layout.

For each layout (nodes x ranks per node) and buffer size it prints the
algorithm :func:`ringmpi.tuning.choose` ranks first among auto's candidates
that can run there (shared memory only on one node), priced with the
constants a call would use (:func:`ringmpi.tuning.load`: ``RINGMPI_TUNING``'s
file, else the untuned defaults for that many ranks per node), and for the
hierarchical algorithm its plan across nodes. The online tuner may still keep
the library's own call where it times faster (docs/api.md). No MPI is started.

    python -m ringmpi choices
    python -m ringmpi choices --layouts 1x2,1x16,8x8 --plot choices.png
"""

from __future__ import annotations

from . import command_parser
from ._units import format_size

__all__ = ["choices", "main"]

LAYOUTS = "1x2,1x4,1x8,1x16,2x8,8x8,64x8,512x8"


def _layouts(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        try:
            nodes, per_node = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--layouts: {item!r} is not NODESxRANKS, e.g. 8x8") from None
        if nodes < 1 or per_node < 1 or nodes * per_node < 2:
            raise ValueError(f"--layouts: {item!r} needs at least 2 ranks")
        out.append((nodes, per_node))
    return out


def choices(layouts: list[tuple[int, int]], sizes: list[int]) -> dict[tuple[int, int], list[str]]:
    """{(nodes, per_node): the model's pick at each size}; hierarchical as
    ``hierarchical/PLAN`` with its plan across nodes."""
    from ringmpi import algorithms, tuning  # noqa: PLC0415
    from ringmpi.algorithms import hierarchical  # noqa: PLC0415

    got = {}
    for nodes, per_node in layouts:
        costs = tuning.load(per_node)
        p = nodes * per_node
        pool = [a for a in map(algorithms.get, algorithms.candidates())
                if nodes == 1 or not a.one_node]  # fmt: skip
        row = []
        for n in sizes:
            name = tuning.choose(costs, n, p, nodes, per_node, pool).name
            if name == "hierarchical" and nodes > 1:
                with tuning.pricing_with(costs):
                    name += "/" + hierarchical.across_nodes(n / per_node, nodes, per_node)
            row.append(name)
        got[nodes, per_node] = row
    return got


def _plot(got: dict[tuple[int, int], list[str]], sizes: list[int], path: str) -> None:
    """A grid 800 px wide: a row per layout, a column per size, coloured by the pick."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    names = list(dict.fromkeys(n for row in got.values() for n in row))
    colour = {n: f"C{i}" for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(8, 1.6 + 0.38 * len(got)), dpi=100)
    for y, row in enumerate(got.values()):
        for x, name in enumerate(row):
            ax.add_patch(plt.Rectangle((x, y), 1, 1, color=colour[name], ec="white", lw=1))
    ax.set_xlim(0, len(sizes))
    ax.set_ylim(len(got), 0)
    step = max(1, len(sizes) // 10)
    ax.set_xticks([i + 0.5 for i in range(0, len(sizes), step)],
                  [format_size(s) for s in sizes[::step]], fontsize=8)  # fmt: skip
    ax.set_yticks([i + 0.5 for i in range(len(got))],
                  [f"{m} x {k}" for m, k in got], fontsize=8)  # fmt: skip
    ax.set_xlabel("buffer (bytes)", fontsize=9)
    ax.set_ylabel("nodes x ranks per node", fontsize=9)
    ax.legend(handles=[Patch(color=colour[n], label=n) for n in names], fontsize=7,
              loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=3, frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("choices", __doc__)
    parser.add_argument(
        "--layouts", default=LAYOUTS, help="comma-separated NODESxRANKS: nodes x ranks per node"
    )
    parser.add_sweep(8, 256 << 20, 4)
    parser.add_argument("--plot", metavar="FILE", help="draw the picks as a grid (matplotlib)")
    args = parser.parse_args(argv)
    sizes = parser.sizes(args)
    try:
        layouts = _layouts(args.layouts)
        if args.plot:
            from ._plot import check  # noqa: PLC0415

            check()
    except ValueError as exc:
        parser.error(str(exc))
    got = choices(layouts, sizes)
    widths = [max(len(f"{m}x{k}"), *map(len, row)) for (m, k), row in got.items()]
    heads = [f"{f'{m}x{k}':<{w}}" for (m, k), w in zip(got, widths, strict=True)]
    print(f"{'size':>6}  " + "  ".join(heads).rstrip())
    for i, size in enumerate(sizes):
        cells = [f"{row[i]:<{w}}" for row, w in zip(got.values(), widths, strict=True)]
        print(f"{format_size(size):>6}  " + "  ".join(cells).rstrip())
    if args.plot:
        _plot(got, sizes, args.plot)
        print(f"# plot written to {args.plot}")
    return 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("choices")
