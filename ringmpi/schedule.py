"""The ring all-reduce schedule and the node layouts, as pure data.

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
counted by simulating every rank's plan (:func:`ringmpi.plans.simulate`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "ALL_GATHER",
    "REDUCE_SCATTER",
    "Step",
    "chunk_bounds",
    "hierarchical_plan",
    "owned_slices",
    "ring_steps",
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


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("schedule")
