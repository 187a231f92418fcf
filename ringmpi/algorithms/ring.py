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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import _engine
from .._comm import Context
from ..kernels import Reduction
from . import register


@register("ring", plan="ring")
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
