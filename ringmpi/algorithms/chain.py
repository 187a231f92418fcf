"""The chain: the all-reduce whose result is bitwise the same whatever runs it.

::

    reduce     rank 0 --> rank 1 --> rank 2 --> ... --> rank N-1
    broadcast  rank N-1 --> rank 0 --> rank 1 --> ... --> rank N-2

Every element is the left fold in communicator rank order,
``((x0 (op) x1) (op) x2) ... (op) x(N-1)``: rank r receives the partial of
ranks 0 .. r-1, combines it with its own contribution (the partial as the left
operand) and passes it on; rank N-1 finishes it (AVG divides there, once), and
the finished buffer goes once along the second chain, copied, never combined.
Neither the node layout nor the algorithm that would otherwise run changes a
bit of the result, which is what ``reproducible=True`` asks for.

The buffer goes in **pieces** (:func:`ringmpi.plans.chain_pieces`), pipelined:
while rank r folds piece t, rank r - 1 folds piece t + 1. Each message is sent
in segments like every other (``RINGMPI_SEGMENT_BYTES``).

Cost, D the buffer: ranks 0 .. N-3 send 2 D, ranks N-2 and N-1 send D; the
ring sends 2(N-1)/N D from every rank. Over all ranks both move 2(N-1) D.
P + K ticks (K = 1 at 2 ranks, 2N - 4 beyond) of one piece each, two rows
each beyond 2 ranks: the pipeline's fill makes the chain slow for small
buffers, where auto prefers shared_memory on one node.
"""

from __future__ import annotations

import numpy as np

from .. import _engine
from .._comm import Context
from ..kernels import Reduction
from ..plans import Plan, chain
from . import register

__all__ = ["plan", "prepare"]

_KEPT = 64  # plans kept per communicator


class _Plans:
    """A communicator's chain plans, by (count, itemsize): the pieces depend on bytes."""

    def __init__(self) -> None:
        self.plans: dict[tuple[int, int], Plan] = {}

    def free(self) -> None:
        self.plans.clear()


def plan(ctx: Context, count: int, red: Reduction) -> Plan:
    """This rank's chain plan for ``count`` elements of ``red``'s dtype (cached)."""
    cache = ctx.extra.get("chain")
    if cache is None:
        cache = ctx.extra["chain"] = _Plans()
    key = (count, red.dtype.itemsize)
    found = cache.plans.get(key)
    if found is None:
        if len(cache.plans) >= _KEPT:
            cache.plans.clear()
        found = cache.plans[key] = chain(ctx.size, ctx.rank, count, red.dtype.itemsize)
    return found


def prepare(red: Reduction, ctx: Context):
    """``again(work, source)``: the chain once more on arrays of one size (the API's
    repeat path), prepared by the step engine at its first call."""
    again = None

    def first(work: np.ndarray, source: np.ndarray) -> None:
        nonlocal again
        if again is None:
            again = _engine.prepare(plan(ctx, work.size, red), red, ctx, "chain")
            if again is None:  # one rank: nothing to send
                again = _copy
        again(work, source)

    return first


def _copy(work: np.ndarray, source: np.ndarray) -> None:
    if source is not work:
        np.copyto(work, source)


@register("chain", prepare=prepare)
def chain_allreduce(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """Chain: the left fold in rank order, pipelined in pieces (bitwise reproducible)."""
    _engine.run(plan(ctx, work.size, red), work, red, ctx, "chain", source=source)
