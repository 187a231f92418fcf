"""``python -m ringmpi schedule N``: the ring's step table and cost, or the hierarchical plan.

Every figure is counted by simulating every rank's plan with the one simulator,
:func:`ringmpi.plans.simulate` (``--ranks-per-node K``: the hierarchical plan for
emulated nodes of K ranks, ``--plot`` its picture).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringmpi import algorithms, plans, tuning
from ringmpi.algorithms.hierarchical import across_choices, across_nodes
from ringmpi.schedule import (
    REDUCE_SCATTER,
    chunk_bounds,
    hierarchical_plan,
    owned_slices,
    ring_steps,
)

from . import command_parser
from ._units import parse_count

__all__ = ["Cost", "main", "plot_hierarchical", "simulate_hierarchical", "simulate_naive",
           "simulate_ring"]  # fmt: skip


@dataclass
class Cost:
    """Traffic counted by a simulation, per rank and in total."""

    nranks: int
    count: int  # elements in the buffer
    itemsize: int
    bytes_sent: list[int]  # per rank
    steps: list[int]  # serial steps per rank
    messages: int  # chunk sends over all ranks

    @property
    def buffer_bytes(self) -> int:
        return self.count * self.itemsize

    @property
    def max_bytes_ratio(self) -> float:
        """Most bytes any rank sent, as a multiple of the buffer."""
        return max(self.bytes_sent) / self.buffer_bytes if self.buffer_bytes else 0.0


def _ring_plan():
    return algorithms.get("ring").plan


def simulate_ring(nranks: int, count: int, itemsize: int = 1):
    """The ring's plan run on simulated ranks: its counted cost, and for every rank and
    chunk the ranks whose contributions that rank's copy holds after the
    reduce-scatter and at the end (empty for an empty chunk)."""
    ring = _ring_plan()

    def reduce_scatter(n: int, r: int, c: int, i: int) -> plans.Plan:
        p = ring(n, r, c, i)
        keep = [k for k, row in enumerate(p.table) if p.phases[row[plans.PHASE]] == REDUCE_SCATTER]
        return plans.Plan(p.table[keep], p.phases, c)

    whole = plans.simulate(ring, nranks, count, itemsize)
    part = plans.simulate(reduce_scatter, nranks, count, itemsize, complete=False)
    bounds = chunk_bounds(count, nranks)

    def chunks(held) -> list[list[set]]:
        return [[set(h[bounds[c]]) if bounds[c + 1] > bounds[c] else set() for c in range(nranks)]
                for h in held]  # fmt: skip

    cost = Cost(nranks, count, itemsize, whole.bytes_sent, whole.steps, sum(whole.messages))
    return cost, chunks(part.held), chunks(whole.held)


def simulate_naive(nranks: int, count: int, itemsize: int = 1) -> Cost:
    """Count the naive all-reduce: every rank sends its whole buffer to every other."""
    sends = [(r, peer) for r in range(nranks) for peer in range(nranks) if peer != r]
    sent = [0] * nranks
    for r, _ in sends:
        sent[r] += count * itemsize
    return Cost(nranks, count, itemsize, sent, [nranks - 1] * nranks, len(sends))


@dataclass
class HierarchicalCost:
    inter_bytes: list[int]  # per rank, sent over the rails
    inter_steps: list[int]  # per rank, serial: 2(M-1) per rail it runs (the ring)
    shared_stored: list[int]  # per rank, bytes stored to the node's window
    shared_loaded: list[int]  # per rank, bytes loaded from it
    across: list[str] = field(default_factory=list)  # per slice, the plan across nodes


def simulate_hierarchical(
    nranks: int, per_node: int, placement: str, count: int, itemsize: int = 1,
    across: str = "ring",
) -> HierarchicalCost:  # fmt: skip
    """Count the hierarchical algorithm's traffic on simulated ranks: the rails run the
    plan across nodes (``across``: one of hierarchical.across_choices(), or auto:
    the cost model's choice for each slice, as a real call makes it) through the
    simulator, which checks that every slice ends complete, each node's
    contribution counted once."""
    layout = hierarchical_plan(nranks, per_node, placement)
    bounds = chunk_bounds(count, layout.nslices)
    cost = HierarchicalCost([0] * nranks, [0] * nranks, [0] * nranks, [0] * nranks)
    for node in layout.nodes:
        for local, r in enumerate(node):
            owned = owned_slices(local, len(node), layout.nslices)
            for j in range(layout.nslices):
                span = (bounds[j + 1] - bounds[j]) * itemsize
                cost.shared_stored[r] += span  # a contribution or a result, once each
                cost.shared_loaded[r] += span * (len(node) - 1) if j in owned else span
    for j, rail in enumerate(layout.rails):
        length = bounds[j + 1] - bounds[j]
        name = across
        if across == "auto":
            name = across_nodes(length * itemsize, len(rail), layout.nslices)
        cost.across.append(name)
        with tuning.pricing_with(tuning.pricing(layout.nslices)):  # as a real call prices
            sim = plans.simulate(algorithms.get(name).plan, len(rail), length, itemsize)
        for p, r in enumerate(rail):
            cost.inter_bytes[r] += sim.bytes_sent[p]
            cost.inter_steps[r] += sim.steps[p]
    assert sorted(r for node in layout.nodes for r in node) == list(range(nranks))
    return cost


def _hierarchical_table(nranks: int, per_node: int, placement: str, count: int,
                        across: str = "auto") -> str:  # fmt: skip
    plan = hierarchical_plan(nranks, per_node, placement)
    h = simulate_hierarchical(nranks, per_node, placement, count, across=across)
    ring, _, _ = simulate_ring(nranks, count)
    lines = [f"hierarchical plan for N={nranks}, {per_node} ranks per node, {placement}:"]
    lines.append("  nodes: " + " ".join("[" + ",".join(map(str, n)) + "]" for n in plan.nodes))
    for j, rail in enumerate(plan.rails):
        lines.append(f"  slice {j}: rail " + " -> ".join(map(str, rail)))
    lines.append("")
    lines.append(f"cost for a buffer of {count} elements (counted by simulation)")
    lines.append(f"  {'':<44}{'hierarchical':>14}{'flat ring':>12}")
    rows = [
        ("inter-node bytes per rank / buffer (max)", max(h.inter_bytes) / count,
         ring.max_bytes_ratio, ".2f"),
        ("serial inter-node steps (max)", max(h.inter_steps), max(ring.steps), "d"),
        ("shared-memory bytes stored per rank / buffer", max(h.shared_stored) / count, 0, ".2f"),
        ("shared-memory bytes loaded per rank / buffer", max(h.shared_loaded) / count, 0, ".2f"),
    ]  # fmt: skip
    for name, a, b, fmt in rows:
        lines.append(f"  {name:<44}{a:>14{fmt}}{b:>12{fmt}}")
    used = ", ".join(dict.fromkeys(h.across))
    lines.append(
        f"  (flat ring: every message, {2 * (nranks - 1)} serial steps; hierarchical: "
        f"{len(plan.nodes)} nodes, across them {used})"
    )
    return "\n".join(lines)


def plot_hierarchical(nranks: int, per_node: int, placement: str, count: int, path: str,
                      across: str = "auto") -> None:  # fmt: skip
    """Draw the plan and its counted cost to ``path`` (PNG; needs matplotlib)."""
    import matplotlib  # noqa: PLC0415 - optional, only for this picture

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    plan = hierarchical_plan(nranks, per_node, placement)
    cost = simulate_hierarchical(nranks, per_node, placement, count, across=across)
    ring, _, _ = simulate_ring(nranks, count)
    width = max(len(n) for n in plan.nodes)
    fig, ax = plt.subplots(figsize=(2.2 + 1.3 * len(plan.nodes), 1.8 + 0.75 * width))
    where = {}
    for x, node in enumerate(plan.nodes):
        ax.add_patch(plt.Rectangle((x - 0.4, -0.6), 0.8, width + 0.2, fill=False, lw=1.5))
        ax.text(x, width - 0.2, f"node {x}", ha="center", va="bottom", fontsize=9)
        for y, r in enumerate(node):
            where[r] = (x, width - 1 - y)
            ax.text(*where[r], f"rank {r}", ha="center", va="center", fontsize=8,
                    bbox={"boxstyle": "round", "fc": "white"})  # fmt: skip
    colors = plt.get_cmap("tab10")
    for j, rail in enumerate(plan.rails):
        xs = [where[r][0] for r in rail]
        ys = [where[r][1] - 0.22 + 0.08 * j for r in rail]
        ax.plot(xs, ys, "-o", color=colors(j % 10), ms=3, lw=1.5, label=f"rail of slice {j}")
    ax.set_xlim(-0.8, len(plan.nodes) - 0.2)
    ax.set_ylim(-1.0, width + 0.6)
    ax.axis("off")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=min(4, plan.nslices),
              fontsize=7, frameon=False)  # fmt: skip
    ax.set_title(
        f"N={nranks}, {per_node} per node ({placement}): inter-node bytes/rank "
        f"{max(cost.inter_bytes) / count:.2f} D in {max(cost.inter_steps)} steps; "
        f"flat ring {ring.max_bytes_ratio:.2f} D in {max(ring.steps)}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _step_table(nranks: int) -> str:
    plans = [list(ring_steps(nranks, r)) for r in range(nranks)]
    head = "phase           step " + " ".join(f"{'rank ' + str(r):>9}" for r in range(nranks))
    lines = [head, "-" * len(head)]
    for k in range(2 * (nranks - 1)):
        st0 = plans[0][k]
        cells = " ".join(f"{f'{p[k].send_chunk}->{p[k].recv_chunk}':>9}" for p in plans)
        lines.append(f"{st0.phase:<15} {st0.step:>4} {cells}")
    lines.append("cell: chunk sent right -> chunk received from the left")
    return "\n".join(lines)


def _cost_table(nranks: int, count: int) -> str:
    ring, _, _ = simulate_ring(nranks, count)
    naive = simulate_naive(nranks, count)
    rows = [
        ("ring bytes per rank / buffer", f"{ring.max_bytes_ratio:.2f}", "2(N-1)/N"),
        ("naive bytes per rank / buffer", f"{naive.max_bytes_ratio:.2f}", "N-1"),
        ("serial steps", f"{max(ring.steps)}", "2(N-1)"),
        ("chunk sends, all ranks", f"{ring.messages}", "N*2(N-1)"),
    ]
    lines = [f"cost for N={nranks}, buffer of {count} elements (counted by simulation)"]
    lines += [f"  {name:<32}{value:>10}   closed form {form}" for name, value, form in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("schedule", __doc__)
    parser.add_argument("nranks", type=int, help="ring size N")
    parser.add_argument(
        "--count",
        type=parse_count,
        default=None,
        help="buffer elements to simulate, e.g. 1000, 1K, 4M (default 1024*N)",
    )
    parser.add_argument("--no-steps", action="store_true", help="print only the cost table")
    parser.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="K",
        help="also print the hierarchical plan for emulated nodes of K ranks",
    )
    parser.add_argument(
        "--node-placement",
        choices=("block", "cyclic"),
        default="block",
        help="emulated nodes take consecutive ranks (block) or every M-th rank (cyclic)",
    )
    parser.add_argument("--across", choices=("auto", *across_choices()), default="auto",
                        help="the hierarchical plan's phase across nodes (auto: the cost "
                        "model's choice for each slice's bytes, one byte an element)")  # fmt: skip
    parser.add_argument("--plot", metavar="PNG", help="with --ranks-per-node: draw the plan")
    args = parser.parse_args(argv)
    if args.nranks < 1:
        parser.error("N must be at least 1")
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        parser.error("--ranks-per-node must be at least 1")
    count = args.count if args.count is not None else 1024 * args.nranks
    if args.plot is not None and args.ranks_per_node is None:
        parser.error("--plot draws the hierarchical plan: give --ranks-per-node too")
    if args.ranks_per_node is not None:
        layout = (args.nranks, args.ranks_per_node, args.node_placement, count)
        print(_hierarchical_table(*layout, args.across))
        if args.plot:
            plot_hierarchical(*layout, args.plot, args.across)
        return 0
    if not args.no_steps:
        print(_step_table(args.nranks))
        print()
    print(_cost_table(args.nranks, count))
    return 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("schedule")
