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
inputs (:func:`ringmpi.plans.direct_exchange`): in step s rank r sends its own
input's chunk (r + 1 + s) straight to that chunk's owner, rank (r + s), and
receives rank (r - s)'s input for the chunk it owns, (r + 1), into a slot.
Sends read the input where it lies (no working copy). The last step completes
the contributions segment by segment, so each segment, once arrived, is folded
at once while the next one arrives (the compute overlaps the transfer, as the
reduce-scatter's reduces do): the N 16-bit contributions widened to float32,
folded in rank order (AVG divides there), rounded once, in one pass at 2 ranks
(:func:`ringmpi._engine.run_half`). The ring's all-gather then sends the
finished 16-bit chunks round. Bytes and steps are
the ring's: (N-1)/N of the buffer each way, 2(N-1) steps, every byte sent 16
bits an element. Each step is a permutation, so no rank receives more than one
chunk at a time, but the partners change every step (r +- s) where the ring
keeps its two neighbours. Since the fold is in rank order, the result is
bitwise the one shared_memory gives, and reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import _engine
from .._comm import Context
from ..kernels import Reduction, copy
from ..plans import direct_slots
from ..schedule import chunk_bounds
from . import register


def ring_half(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """The ring for the half types: inputs exchanged directly, one rounding, all-gather."""
    n = work.size
    out, src = red.lanes(work), red.lanes(work if source is None else source)
    if ctx.size == 1:
        if source is not None:
            copy(out, src)
        return
    mine = _Half.of(ctx, n)
    # Sends read the input where it lies; the other ranks' contributions to the chunk
    # this rank finishes land in N - 1 slots, folded segment by segment as they arrive.
    slots = ctx.scratch(2 * mine.slots).view(np.uint16)
    _engine.run_half(ctx.plan("direct_exchange", n), out, src, slots, mine.starts, mine.lo, red,
                     ctx, "ring")  # fmt: skip
    _engine.run(ctx.plan("all_gather", n), out, red, ctx, "ring")


class _Half:
    """Per count: the chunk this rank finishes, where each rank's contribution to it
    lies (the input below the count, the slots from it on), the slots' length."""

    def __init__(self, ctx: Context, n: int) -> None:
        bounds = chunk_bounds(n, ctx.size)
        c = (ctx.rank + 1) % ctx.size
        self.lo, self.hi = bounds[c], bounds[c + 1]
        self.starts = direct_slots(ctx.size, ctx.rank, n)
        self.slots = (ctx.size - 1) * (self.hi - self.lo)

    @staticmethod
    def of(ctx: Context, n: int) -> _Half:
        cache = ctx.extra.get("ring_half")
        if cache is None:
            cache = ctx.extra["ring_half"] = _Counts()
        found = cache.get(n)
        if found is None:
            if len(cache) >= _KEPT:
                cache.clear()
            found = cache[n] = _Half(ctx, n)
        return found


class _Counts(dict):
    def free(self) -> None:
        self.clear()


_KEPT = 64


@register("ring", plan="ring", half=ring_half)
def ring_allreduce(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """Ring all-reduce: reduce-scatter then all-gather with the ring neighbours, pipelined."""
    run_ring(work, red, ctx, source=source)


def run_ring(
    work: np.ndarray,
    red: Reduction,
    ctx: Context,
    *,
    algorithm: str = "ring",
    phase_prefix: str = "",
    peers: Sequence[int] | None = None,
    source: np.ndarray | None = None,
) -> None:
    """The ring on ``ctx``'s communicator; other algorithms run it on sub-communicators.

    ``peers`` maps ranks of ``ctx`` to the ranks of the caller's communicator, so
    the trace and the error messages name ranks the user knows.
    """
    _engine.run(ctx.plan("ring", work.size), work, red, ctx, algorithm,
                prefix=phase_prefix, peers=peers, source=source)  # fmt: skip
