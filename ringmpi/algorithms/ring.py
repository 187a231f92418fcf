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

Each chunk is reduced in one fixed order on one rank and then copied, so the
result is bitwise identical on every rank and from run to run. Every message's
tag names the (op, dtype) pair and a fingerprint of the count, and its size is
checked on arrival: a rank whose left neighbour disagrees on count, dtype or op
raises RingMPIError at its first step, never returns a silent wrong answer, and
no message is ever received into more memory than the chunk it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mpi4py import MPI

from .. import _trace
from .._comm import Context
from .._errors import RingMPIError
from .._settings import positive_int
from ..kernels import Reduction
from ..schedule import REDUCE_SCATTER, Step, chunk_bounds
from . import register

# Reduce-scatter segment size in bytes (see docs/performance.md for the measurement).
SEGMENT_BYTES = 1 << 20


@register("ring")
def ring_allreduce(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """Ring all-reduce: reduce-scatter then all-gather, Sendrecv with the ring neighbours."""
    if source is not None:
        np.copyto(work, source)
    run_ring(work, red, ctx)


def run_ring(
    work: np.ndarray,
    red: Reduction,
    ctx: Context,
    *,
    algorithm: str = "ring",
    phase_prefix: str = "",
    peers: list[int] | None = None,
) -> None:
    """The ring on ``ctx``'s communicator; other algorithms run it on sub-communicators.

    ``peers`` maps ranks of ``ctx`` to the ranks of the caller's communicator, so
    the trace and the error messages name ranks the user knows.
    """
    n = ctx.size
    if n == 1:
        return
    ring = _Ring(ctx, ctx.tag(red, work.size), algorithm, phase_prefix, peers or range(n))
    bounds = chunk_bounds(work.size, n)
    itemsize = work.itemsize
    # A reduce-scatter step moves its chunk in `nseg` segments, each reduced right after
    # it arrives, while it is still in cache; every rank derives the same nseg from the
    # longest chunk (chunk 0), so sends and receives pair up. One scratch segment is
    # reused by every step.
    longest = bounds[1] - bounds[0]
    nseg = max(1, -(-longest * itemsize // segment_bytes()))
    scratch = ctx.scratch(-(-longest // nseg) * itemsize).view(work.dtype)
    for st in ctx.ring_plan:
        s0, s1 = bounds[st.send_chunk], bounds[st.send_chunk + 1]
        r0, r1 = bounds[st.recv_chunk], bounds[st.recv_chunk + 1]
        if st.phase != REDUCE_SCATTER:
            ring.exchange(st, work[s0:s1], work[r0:r1])
            continue
        send_seg = chunk_bounds(s1 - s0, nseg)
        recv_seg = chunk_bounds(r1 - r0, nseg)
        for k in range(nseg):
            mine = work[r0 + recv_seg[k] : r0 + recv_seg[k + 1]]
            incoming = scratch[: mine.size]
            ring.exchange(st, work[s0 + send_seg[k] : s0 + send_seg[k + 1]], incoming)
            if st.last:
                red.combine_last(mine, incoming, n)
            else:
                red.combine(mine, incoming)


def segment_bytes() -> int:
    """The reduce-scatter segment size: ``RINGMPI_SEGMENT_BYTES`` or the measured default."""
    return positive_int("RINGMPI_SEGMENT_BYTES") or SEGMENT_BYTES


class _Ring:
    """One call's exchanges: sends right, receives from the left, checks what arrives."""

    def __init__(
        self, ctx: Context, tag: int, algorithm: str, prefix: str, peers: Sequence[int]
    ) -> None:
        self.ctx, self.tag, self.algorithm, self.prefix, self.peers = (
            ctx, tag, algorithm, prefix, peers,
        )  # fmt: skip
        self.tracing = bool(_trace._active)

    def exchange(self, st: Step, send: np.ndarray, recv: np.ndarray) -> None:
        ctx, peers = self.ctx, self.peers
        where = f"rank {peers[ctx.rank]}: {self.algorithm} {self.prefix}{st.phase} step {st.step}"
        left = peers[ctx.left]
        try:
            ctx.exchange(
                [send, MPI.BYTE], ctx.right, self.tag, [recv, MPI.BYTE], ctx.left, ctx.status
            )
        except MPI.Exception as exc:
            if exc.Get_error_class() != MPI.ERR_TRUNCATE:
                raise
            raise RingMPIError(
                f"{where}: rank {left} sent more than the {recv.nbytes} bytes expected of "
                f"chunk {st.recv_chunk}; ranks disagree on count or dtype"
            ) from None
        if self.tracing:
            _trace.record(
                self.algorithm, self.prefix + st.phase, st.step, peers[ctx.right], send.nbytes
            )
        got_tag = ctx.status.Get_tag()
        if got_tag != self.tag:
            raise RingMPIError(
                f"{where}: message from rank {left}: " + ctx.disagreement(got_tag, self.tag)
            )
        got = ctx.status.Get_count(MPI.BYTE)
        if got != recv.nbytes:
            raise RingMPIError(
                f"{where}: rank {left} sent {got} bytes, expected {recv.nbytes}; "
                "ranks disagree on count or dtype"
            )
