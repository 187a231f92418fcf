"""The bandwidth-optimal ring all-reduce.

::

        +--> rank 0 --> rank 1 --> rank 2 --> rank 3 --+
        |                                              |
        +----------------------------------------------+

The buffer is cut into N **chunks**, one per rank (the first ``count % N`` one
element longer). In reduce-scatter step s, rank r sends chunk (r - s) to its
right neighbour and receives chunk (r - s - 1) from its left one, reducing it
into its own copy; after N - 1 steps rank r holds the finished chunk (r + 1).
In all-gather step s, rank r sends chunk (r - s + 1) and stores the chunk
(r - s) it receives; after N - 1 more steps every rank holds every chunk.

Cost: each rank sends 2(N-1) chunks of D/N bytes, 2(N-1)/N·D in all -- 1.50 D
at 4 ranks, 1.97 D at 64, never 2 D -- so the bandwidth term is flat in N,
while the 2(N-1) serial steps make a large ring latency-bound.

Each chunk goes in **segments** (``RINGMPI_SEGMENT_BYTES``), pipelined: while a
reduce-scatter step reduces segment k, segment k + 1 is arriving (the step
engine, :mod:`ringmpi._engine`, which runs the whole step loop compiled).

Each chunk is reduced in one fixed order on one rank and then copied, so the
result is bitwise identical on every rank and from run to run. Every message's
tag names the (op, dtype) pair and a fingerprint of the count, and its size is
checked on arrival: a rank whose left neighbour disagrees on count, dtype or op
raises RingMPIError at its first step, never returns a silent wrong answer, and
no message is ever received into more memory than the segment it belongs to.

**Half types** (float16, bfloat16). The reduce-scatter above forwards partial
results: in 16 bits each step would round them, and the contract is one
rounding. So for the half types the reduce-scatter is a **direct exchange** of
inputs (:func:`direct_exchange`): in step s rank r sends its own
input's chunk (r + 1 + s) straight to that chunk's owner, rank (r + s), and
receives rank (r - s)'s input for the chunk it owns, (r + 1), into a slot.
Sends read the input where it lies (no working copy). The last step completes
the contributions segment by segment, so each segment, once arrived, is folded
at once while the next one arrives (the compute overlaps the transfer, as the
reduce-scatter's reduces do): the N 16-bit contributions widened to float32,
folded in rank order (AVG divides there), rounded once, in one pass at 2 ranks
(the step engine's FOLD rows). The ring's all-gather then sends the
finished 16-bit chunks round. Bytes and steps are
the ring's: (N-1)/N of the buffer each way, 2(N-1) steps, every byte sent 16
bits an element. Each step is a permutation, so no rank receives more than one
chunk at a time, but the partners change every step (r +- s) where the ring
keeps its two neighbours. Since the fold is in rank order, the result is
bitwise the one shared_memory gives, and reproducible.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import numpy as np

from .. import _engine
from .._comm import Context
from .._copy import copy
from ..kernels import Reduction
from ..plans import FINAL, FOLD, FROM_INPUT, OWN_FROM_INPUT, REDUCE, STORE, TO_SLOTS, Plan, Rows
from ..schedule import ALL_GATHER, REDUCE_SCATTER, chunk_bounds, ring_steps
from .registry import FORWARDS, register

__all__ = ["all_gather", "all_gather_owned", "direct_exchange", "direct_slots", "reduce_scatter",
           "ring", "terms"]  # fmt: skip

PlanFn = Callable[[int, int, int, int], Plan]

DIRECT_EXCHANGE = "direct-exchange"


def ring(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
    """The ring: rank r sends to r + 1 and receives from r - 1 (see ringmpi.schedule)."""
    rows = Rows(nranks, rank)
    bounds = chunk_bounds(count, nranks)
    right, left = (rank + 1) % nranks, (rank - 1) % nranks
    for st in ring_steps(nranks, rank):
        s0, s1 = bounds[st.send_chunk], bounds[st.send_chunk + 1]
        r0, r1 = bounds[st.recv_chunk], bounds[st.recv_chunk + 1]
        action = (REDUCE | (FINAL if st.last else 0)) if st.phase == REDUCE_SCATTER else STORE
        rows.add(st.phase, st.step, (right, s0, s1 - s0), (left, r0, r1 - r0), action)
    return rows.plan(count)


def direct_exchange(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
    """The half types' reduce-scatter: inputs, not partials, go to a chunk's owner.

    Rank r finishes chunk (r + 1), as after the ring's reduce-scatter (so the
    ring's all-gather follows unchanged). In step s = 1 .. N-1 rank r sends its
    own input's chunk (r + 1 + s) to that chunk's owner, rank (r + s), and stores
    what rank (r - s) sends -- rank (r - s)'s input for chunk (r + 1) -- in slot
    s - 1, at element ``count + (s - 1) * L`` of the working buffer (L the
    chunk's length): the buffer holds the input, then N - 1 slots. Every step is
    a permutation (each rank sends one chunk and receives one), N - 1 steps
    sending (N-1)/N of the buffer per rank: the ring's reduce-scatter's bytes and
    steps. The owner then folds its own chunk and the N - 1 slots in rank order
    (:func:`direct_slots`).
    """
    rows = Rows(nranks, rank)
    bounds = chunk_bounds(count, nranks)
    mine = (rank + 1) % nranks
    length = bounds[mine + 1] - bounds[mine]
    for s in range(1, nranks):
        theirs = (rank + 1 + s) % nranks
        send = ((rank + s) % nranks, bounds[theirs], bounds[theirs + 1] - bounds[theirs])
        recv = ((rank - s) % nranks, count + (s - 1) * length, length)
        # The last step completes every contribution: its segments are folded as they come.
        rows.add(DIRECT_EXCHANGE, s - 1, send, recv,
                 FROM_INPUT | TO_SLOTS | (FOLD if s == nranks - 1 else 0))  # fmt: skip
    return rows.plan(count, starts=direct_slots(nranks, rank, count), chunk=bounds[mine])


def direct_slots(nranks: int, rank: int, count: int) -> np.ndarray:
    """Where rank k's contribution to the chunk rank ``rank`` finishes starts in the
    working buffer of :func:`direct_exchange`, for k = 0 .. N-1 (rank order)."""
    bounds = chunk_bounds(count, nranks)
    mine = (rank + 1) % nranks
    length = bounds[mine + 1] - bounds[mine]
    return np.array([bounds[mine] if k == rank else count + ((rank - k) % nranks - 1) * length
                     for k in range(nranks)], np.int64)  # fmt: skip


def all_gather(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
    """The ring's all-gather alone (rank r starts with chunk r + 1 finished)."""
    rows = Rows(nranks, rank)
    bounds = chunk_bounds(count, nranks)
    right, left = (rank + 1) % nranks, (rank - 1) % nranks
    for st in ring_steps(nranks, rank):
        if st.phase != REDUCE_SCATTER:
            s0, s1 = bounds[st.send_chunk], bounds[st.send_chunk + 1]
            r0, r1 = bounds[st.recv_chunk], bounds[st.recv_chunk + 1]
            rows.add(st.phase, st.step, (right, s0, s1 - s0), (left, r0, r1 - r0))
    return rows.plan(count)


@functools.lru_cache(maxsize=64)
def reduce_scatter(counts: tuple[int, ...]) -> PlanFn:
    """The plan builder of the ring's reduce-scatter alone, rank r finishing chunk r of
    ``counts[r]`` elements (MPI_Reduce_scatter's layout): in step s rank r sends
    chunk (r - s - 1) and reduces chunk (r - s - 2) into its own. Rank r sends
    every chunk but its own: (N-1)/N of an even buffer, in N - 1 steps. The own
    operand comes from the input (nothing is copied in first); the first send is
    of the input itself."""

    def action(s: int, nranks: int) -> int:
        last = FINAL if s == nranks - 2 else 0
        return REDUCE | OWN_FROM_INPUT | last | (FROM_INPUT if s == 0 else 0)

    return _half(counts, REDUCE_SCATTER, 1, action)


@functools.lru_cache(maxsize=64)
def all_gather_owned(counts: tuple[int, ...]) -> PlanFn:
    """The plan builder of the ring's all-gather alone from rank r holding chunk r of
    ``counts[r]`` elements (MPI_Allgather's layout): in step s rank r sends chunk
    (r - s) and stores chunk (r - s - 1). Rank r sends every chunk but (r + 1)."""
    return _half(counts, ALL_GATHER, 0, lambda s, nranks: STORE)


def _half(counts: tuple[int, ...], phase: str, behind: int, action) -> PlanFn:
    """A half's builder: in step s rank r sends chunk (r - s - ``behind``) to the right
    and receives chunk (r - s - ``behind`` - 1) from the left, ``action(s, N)``."""
    bounds = list(itertools.accumulate(counts, initial=0))

    def build(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
        assert nranks == len(counts) and count == bounds[-1]
        rows = Rows(nranks, rank)
        right, left = (rank + 1) % nranks, (rank - 1) % nranks
        for s in range(nranks - 1):
            out, into = (rank - s - behind) % nranks, (rank - s - behind - 1) % nranks
            rows.add(phase, s, (right, bounds[out], counts[out]),
                     (left, bounds[into], counts[into]), action(s, nranks))  # fmt: skip
        return rows.plan(count)

    return build


def terms(n: float, p: int, nodes: int = 1, per_node: int = 1) -> dict[str, float]:
    """2(p-1) alpha + 2n(p-1)/p beta + n(p-1)/p gamma."""
    if p <= 1:
        return {"call": 1.0}
    return {"call": 1.0, "alpha": 2.0 * (p - 1), "beta": 2 * n * (p - 1) / p,
            "gamma": n * (p - 1) / p}  # fmt: skip


def ring_half(
    work: np.ndarray,
    red: Reduction,
    ctx: Context,
    source: np.ndarray | None = None,
    timeout: float = 0.0,
) -> None:
    """The ring for the half types: inputs exchanged directly, one rounding, all-gather."""
    n = work.size
    if ctx.size == 1:
        if source is not None:
            copy(red.lanes(work), red.lanes(source))
        return
    # Sends read the input where it lies; the other ranks' contributions to the chunk
    # this rank finishes land in N - 1 slots, folded segment by segment as they arrive.
    _engine.run(ctx.plan(direct_exchange, n, 2), work, red, ctx, "ring", timeout,
                source=work if source is None else source)  # fmt: skip
    _engine.run(ctx.plan(all_gather, n, 2), work, red, ctx, "ring", timeout)


def reduce_scatter_terms(n: float, p: int, nodes: int = 1, per_node: int = 1):
    """(p-1) alpha + n(p-1)/p (beta + gamma): every chunk but one, reduced on arrival."""
    if p <= 1:
        return {"call": 1.0}
    return {"call": 1.0, "alpha": p - 1.0, "beta": n * (p - 1) / p, "gamma": n * (p - 1) / p}


def all_gather_terms(n: float, p: int, nodes: int = 1, per_node: int = 1):
    """(p-1) alpha + n(p-1)/p beta: every chunk but one, stored."""
    if p <= 1:
        return {"call": 1.0}
    return {"call": 1.0, "alpha": p - 1.0, "beta": n * (p - 1) / p}


RING = register(
    "ring",
    plan=ring,
    terms=terms,
    summary="Ring all-reduce: reduce-scatter then all-gather with the ring neighbours, pipelined.",
    half=ring_half,
    across=True,
)
register("ring", collective="reduce_scatter", plan=reduce_scatter, terms=reduce_scatter_terms,
         summary="The ring's reduce-scatter: N - 1 steps with the ring neighbours.",
         no_half=FORWARDS)  # fmt: skip
register("ring", collective="allgather", plan=all_gather_owned, terms=all_gather_terms,
         summary="The ring's all-gather: N - 1 steps with the ring neighbours.")  # fmt: skip


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
