"""The ring all-reduce schedule as pure data, and a simulator that counts its cost.

Vocabulary (the rest of the package follows it):

* **buffer** -- the ``count`` elements every rank contributes.
* **chunk** -- one of the ``N`` pieces the buffer is cut into, one per rank.
  The first ``count % N`` chunks are one element longer; when ``count < N``
  the last chunks are empty.
* **step** -- one exchange: every rank sends one chunk to its right neighbour
  (``rank + 1``) and receives one chunk from its left neighbour (``rank - 1``).

The ring runs two phases of ``N - 1`` steps each::

    reduce-scatter, step s:  rank r sends chunk (r - s) and receives chunk (r - s - 1),
                             which it reduces into its own copy of that chunk.
    all-gather,     step s:  rank r sends chunk (r - s + 1) and receives chunk (r - s),
                             which it stores.

After reduce-scatter, rank ``r`` holds the finished chunk ``r + 1`` (all
indices modulo ``N``); all-gather passes the finished chunks once around.

``python -m ringmpi schedule N`` prints the step table and the cost table,
both counted by simulating every rank with this module's schedule.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "ALL_GATHER",
    "REDUCE_SCATTER",
    "Cost",
    "Step",
    "chunk_bounds",
    "hierarchical_plan",
    "owned_slices",
    "ring_steps",
    "simulate_hierarchical",
    "simulate_naive",
    "simulate_ring",
    "virtual_node",
]

REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"


def chunk_bounds(count: int, nchunks: int) -> list[int]:
    """Offsets of the ``nchunks`` chunks of a buffer of ``count`` elements.

    Chunk ``c`` is ``[bounds[c], bounds[c + 1])``; the first ``count % nchunks``
    chunks are one element longer than the rest.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if nchunks < 1:
        raise ValueError(f"nchunks must be >= 1, got {nchunks}")
    base, extra = divmod(count, nchunks)
    bounds = [0]
    for c in range(nchunks):
        bounds.append(bounds[-1] + base + (1 if c < extra else 0))
    assert bounds[-1] == count
    return bounds


@dataclass(frozen=True)
class Step:
    """One step of the ring, seen from one rank."""

    phase: str  # REDUCE_SCATTER (receive and reduce) or ALL_GATHER (receive and store)
    step: int  # 0 .. N-2 within the phase
    send_chunk: int  # sent to the right neighbour
    recv_chunk: int  # received from the left neighbour
    last: bool  # the last reduce-scatter step: the received chunk becomes final here


def ring_steps(nranks: int, rank: int) -> Iterator[Step]:
    """The 2(N-1) steps rank ``rank`` takes in a ring of ``nranks``."""
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} is not in a ring of {nranks}")
    n = nranks
    for s in range(n - 1):
        yield Step(REDUCE_SCATTER, s, (rank - s) % n, (rank - s - 1) % n, s == n - 2)
    for s in range(n - 1):
        yield Step(ALL_GATHER, s, (rank - s + 1) % n, (rank - s) % n, False)


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


def simulate_ring(
    nranks: int, count: int, itemsize: int = 1
) -> tuple[Cost, list[list[set]], list[list[set]]]:
    """Run the ring schedule on simulated ranks, tracking contributions, not values.

    Returns the counted cost and, for every rank and chunk, the set of ranks
    whose contribution that rank's copy of the chunk holds after reduce-scatter
    and at the end.
    Raises AssertionError if the schedule ever reduces a chunk into the wrong
    place, counts a contribution twice, or leaves a rank without the full sum.
    """
    bounds = chunk_bounds(count, nranks)
    held = [[{r} for _ in range(nranks)] for r in range(nranks)]
    bytes_sent = [0] * nranks
    steps = [0] * nranks
    messages = 0
    plans = [list(ring_steps(nranks, r)) for r in range(nranks)]
    after_reduce_scatter = held
    for k in range(2 * (nranks - 1)):
        if k == nranks - 1:
            after_reduce_scatter = [[set(c) for c in chunks] for chunks in held]
        # Everyone sends before anyone receives: a step is simultaneous.
        in_flight = []
        for r in range(nranks):
            st = plans[r][k]
            right = (r + 1) % nranks
            nbytes = (bounds[st.send_chunk + 1] - bounds[st.send_chunk]) * itemsize
            in_flight.append((right, st.send_chunk, frozenset(held[r][st.send_chunk])))
            bytes_sent[r] += nbytes
            steps[r] += 1
            messages += 1
        for right, chunk, contrib in in_flight:
            st = plans[right][k]
            assert st.recv_chunk == chunk, (right, k, st, chunk)
            if st.phase == REDUCE_SCATTER:
                assert not (held[right][chunk] & contrib), "a contribution counted twice"
                held[right][chunk] = held[right][chunk] | contrib
            else:
                held[right][chunk] = set(contrib)
    if nranks == 1:
        after_reduce_scatter = [[set(c) for c in chunks] for chunks in held]
    cost = Cost(nranks, count, itemsize, bytes_sent, steps, messages)
    return cost, after_reduce_scatter, held


def simulate_naive(nranks: int, count: int, itemsize: int = 1) -> Cost:
    """Count the naive all-reduce: every rank sends its whole buffer to every other."""
    bytes_sent = [0] * nranks
    messages = 0
    for r in range(nranks):
        for peer in range(nranks):
            if peer != r:
                bytes_sent[r] += count * itemsize
                messages += 1
    return Cost(nranks, count, itemsize, bytes_sent, [nranks - 1] * nranks, messages)


# --- the hierarchical plan -----------------------------------------------------


def virtual_node(rank: int, nranks: int, per_node: int, placement: str) -> int:
    """The emulated node of ``rank``: nodes of ``per_node`` consecutive ranks (block)
    or rank modulo the number of nodes (cyclic, as ``--map-by node`` places them)."""
    if placement == "block":
        return rank // per_node
    return rank % -(-nranks // per_node)


def owned_slices(local_rank: int, local_size: int, nslices: int) -> list[int]:
    """The slices a local rank reduces and rings: every ``local_size``-th from its own."""
    return [j for j in range(nslices) if j % local_size == local_rank]


@dataclass
class HierarchicalPlan:
    """Nodes, slices and rails of the hierarchical algorithm for emulated nodes."""

    nodes: list[list[int]]  # ranks of each node, nodes ordered by their lowest rank
    nslices: int  # the largest node's size
    rails: list[list[int]]  # rail j: the owner of slice j on each node, in ring order


def hierarchical_plan(nranks: int, per_node: int, placement: str = "block") -> HierarchicalPlan:
    groups: dict[int, list[int]] = {}
    for r in range(nranks):
        groups.setdefault(virtual_node(r, nranks, per_node, placement), []).append(r)
    nodes = sorted(groups.values())
    nslices = max(len(n) for n in nodes)
    rails = [[n[j % len(n)] for n in nodes] for j in range(nslices)]
    return HierarchicalPlan(nodes, nslices, rails)


@dataclass
class HierarchicalCost:
    inter_bytes: list[int]  # per rank, sent over the rails
    inter_steps: list[int]  # per rank, serial: 2(M-1) per rail it runs
    shared_stored: list[int]  # per rank, bytes stored to the node's window
    shared_loaded: list[int]  # per rank, bytes loaded from it


def simulate_hierarchical(
    nranks: int, per_node: int, placement: str, count: int, itemsize: int = 1
) -> HierarchicalCost:
    """Count the hierarchical algorithm's traffic by running its plan on simulated ranks.

    The rails run the ring's own simulator, and the simulated contributions are
    checked: every slice ends complete, each rank's contribution counted once.
    """
    plan = hierarchical_plan(nranks, per_node, placement)
    bounds = chunk_bounds(count, plan.nslices)
    cost = HierarchicalCost(*([0] * nranks for _ in range(4)))
    for node in plan.nodes:
        for local, r in enumerate(node):
            owned = owned_slices(local, len(node), plan.nslices)
            for j in range(plan.nslices):
                span = (bounds[j + 1] - bounds[j]) * itemsize
                cost.shared_stored[r] += span  # a contribution or a result, once each
                cost.shared_loaded[r] += span * (len(node) - 1) if j in owned else span
    everyone = set(range(nranks))
    for j, rail in enumerate(plan.rails):
        length = bounds[j + 1] - bounds[j]
        ring, _, held = simulate_ring(len(rail), length, itemsize)
        for p, r in enumerate(rail):
            cost.inter_bytes[r] += ring.bytes_sent[p]
            cost.inter_steps[r] += ring.steps[p]
        # Rail position p brings node p's sum; the ring must leave every position with
        # every node's sum, and the nodes partition the ranks: each counted once.
        m = len(rail)
        for p in range(m):
            assert all(chunk == set(range(m)) for chunk in held[p]), (j, p)
    assert sorted(r for node in plan.nodes for r in node) == sorted(everyone)
    return cost
