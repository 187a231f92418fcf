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

The buffer goes in **pieces** (:func:`chain_pieces`), pipelined:
while rank r folds piece t, rank r - 1 folds piece t + 1. Each message is sent
in segments like every other (``RINGMPI_SEGMENT_BYTES``).

Cost, D the buffer: ranks 0 .. N-3 send 2 D, ranks N-2 and N-1 send D; the
ring sends 2(N-1)/N D from every rank. Over all ranks both move 2(N-1) D.
P + K ticks (K = 1 at 2 ranks, 2N - 4 beyond) of one piece each, two rows
each beyond 2 ranks: the pipeline's fill makes the chain slow for small
buffers, where auto prefers shared_memory on one node.
"""

from __future__ import annotations

import math

from ..plans import FINAL, REDUCE, STORE, THEIRS_FIRST, Plan, Rows
from ..schedule import chunk_bounds
from .registry import register

__all__ = ["chain", "chain_pieces", "terms"]

REDUCE_CHAIN, BROADCAST_CHAIN = "reduce-chain", "broadcast-chain"


# The chain's pieces: P = sqrt(K * nbytes / CHAIN_BREAK_EVEN), K the pipeline's fill
# in ticks; CHAIN_BREAK_EVEN is the bytes whose transfer costs what one more row
# costs (docs/performance.md, "Reproducible mode", has the measurement behind it).
CHAIN_BREAK_EVEN = 512 << 10
CHAIN_MAX_PIECE = 4 << 20


def chain_pieces(nranks: int, count: int, itemsize: int = 1) -> int:
    """How many pieces the chain cuts ``count`` elements of ``itemsize`` bytes into.

    The chain takes P + K ticks (K = 1 at 2 ranks, 2N - 4 beyond) of one piece
    each: more pieces fill the pipeline better, each costs a row's latency. P
    minimises (P + K)(alpha + beta n / P): P = sqrt(K n beta / alpha), pieces of
    at most CHAIN_MAX_PIECE bytes, at most one per element, at least one.
    """
    nbytes = count * itemsize
    fill = 1 if nranks <= 2 else 2 * nranks - 4
    best = round(math.sqrt(fill * nbytes / CHAIN_BREAK_EVEN))
    least = -(-nbytes // CHAIN_MAX_PIECE)
    return max(1, min(count, max(best, least)))


def chain(nranks: int, rank: int, count: int, itemsize: int = 1, pieces: int | None = None) -> Plan:
    """The reproducible chain: every element is ``((x0 (op) x1) (op) x2) ... (op) x(N-1)``.

    ::

        reduce:     rank 0 --> rank 1 --> rank 2 --> ... --> rank N-1   (partials)
        broadcast:  rank N-1 --> rank 0 --> rank 1 --> ... --> rank N-2 (finished)

    The buffer is cut into P **pieces** (:func:`chain_pieces`). Partial t is
    piece t folded over ranks 0 .. r: rank r receives it from r - 1, folds its
    own piece in (``THEIRS_FIRST``: the partial is the left operand) and sends
    it on; rank N-1's fold finishes it (AVG divides there, once). The finished
    piece then goes once along N-1 -> 0 -> 1 -> ... -> N-2, stored by each.

    The rows keep every rank in step: each message is sent and received in the
    same (tick, slot) on both sides, so a rank waiting in a row waits only for
    ranks at the same row or behind it, and the messages between two ranks come
    in the order both expect. In tick ``tau`` there are two slots, A then B:

    * slot A: partial t from r to r + 1 at tick t + r (r = 0 .. N-2), and
      finished t from N-1 to 0 at tick t + N - 1;
    * slot B: finished t from r to r + 1 at tick t + N - 1 + r (r = 0 .. N-3).

    Rank r's row A of tick tau thus sends partial tau - r and receives partial
    tau - r + 1 -- different pieces, one rank each way at once, as in the
    ring's steps. A slot a rank has nothing in is no row. At 2 ranks there is no
    slot B: the partials go 0 -> 1 while the finished pieces come back 1 -> 0.

    Cost: ranks 0 .. N-3 send the buffer twice (once a partial, once finished),
    ranks N-2 and N-1 once: 2 D at most, against the ring's 2(N-1)/N D, and the
    same 2(N-1) D over all ranks. Rows: P + 1 at rank N-1, 2P + 2 at the middle
    ranks; P + K ticks.
    """
    rows = Rows(nranks, rank)
    if nranks == 1:
        return rows.plan(count)
    if pieces is None:
        pieces = chain_pieces(nranks, count, itemsize)
    bounds = chunk_bounds(count, pieces)
    last = nranks - 1

    def piece(t: int) -> tuple[int, int] | None:
        return (bounds[t], bounds[t + 1] - bounds[t]) if 0 <= t < pieces else None

    fill = 1 if nranks == 2 else 2 * nranks - 4
    for tau in range(pieces + fill):
        # Slot A: the partials, and the finished pieces' first hop (N-1 -> 0).
        if rank < last:
            send = piece(tau - rank), rank + 1, REDUCE_CHAIN
        else:
            send = piece(tau - last), 0, BROADCAST_CHAIN
        if rank > 0:
            recv = piece(tau - rank + 1), rank - 1, REDUCE | THEIRS_FIRST
            if rank == last:
                recv = recv[0], recv[1], recv[2] | FINAL
        else:
            recv = piece(tau - last), last, STORE
        _chain_row(rows, tau, send, recv)
        # Slot B: the finished pieces along 0 -> 1 -> ... -> N-2.
        if nranks > 2:
            send = piece(tau - last - rank), rank + 1, BROADCAST_CHAIN
            recv = piece(tau - last - rank + 1), rank - 1, STORE
            _chain_row(rows, tau, send if rank <= last - 2 else (None,),
                       recv if 1 <= rank <= last - 1 else (None,))  # fmt: skip
    return rows.plan(count)


def _chain_row(rows: Rows, tau: int, send: tuple, recv: tuple) -> None:
    """One row of the chain, unless it has neither a send nor a receive. Its phase is
    the send's (the trace's phase for it), else the receive's."""
    out = (send[1], *send[0]) if send[0] is not None else (-1, 0, 0)
    into = (recv[1], *recv[0]) if recv[0] is not None else (-1, 0, 0)
    if out[0] < 0 and into[0] < 0:
        return
    kind = send[2] if out[0] >= 0 else BROADCAST_CHAIN if recv[2] == STORE else REDUCE_CHAIN
    rows.add(kind, tau, out, into, recv[2] if into[0] >= 0 else STORE)


def terms(n: float, p: int, nodes: int = 1, per_node: int = 1) -> dict[str, float]:
    """(P + K)(r alpha + r n/P beta + n/P gamma): P + K ticks of one piece of n/P
    bytes, K = 1 at 2 ranks and 2p - 4 beyond, r = 1 row a tick at 2 ranks, 2 beyond."""
    if p <= 1:
        return {"call": 1.0}
    pieces = chain_pieces(p, max(1, int(n)))
    ticks, rows = pieces + (1 if p == 2 else 2 * p - 4), 1 if p == 2 else 2
    return {"call": 1.0, "alpha": float(rows * ticks), "beta": rows * ticks * n / pieces,
            "gamma": ticks * n / pieces}  # fmt: skip


# It never wins against the ring (more rows, as many bytes or more), so auto
# considers it only where the rank order must be kept.
register(
    "chain",
    plan=chain,
    terms=terms,
    auto=False,
    keeps_order=True,
    summary="Chain: the left fold in rank order, pipelined in pieces (bitwise reproducible).",
    no_half="it forwards partial results along the chain, rounded to 16 bits at every rank",
)


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
