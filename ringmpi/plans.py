"""Every algorithm's steps as a table: the plan the step engine carries out.

A **plan** is one rank's steps, one row each, in order. In a row the rank
sends ``SEND_LEN`` elements from ``SEND_OFF`` of its buffer to rank
``SEND_TO`` and receives ``RECV_LEN`` elements from rank ``RECV_FROM``, which
it stores at ``RECV_OFF`` or reduces into the elements there (``ACTION``); -1
means no send or no receive in that row. The rows are pure data, built here
from the schedules and nowhere else: the engine (:mod:`ringmpi._engine`) only
carries them out, and :func:`simulate` runs every rank's plan without MPI to
check them and to count their cost.

The plans:

* ``ring`` -- the schedule of :func:`ringmpi.schedule.ring_steps`: N - 1
  reduce-scatter steps, then N - 1 all-gather steps; 2(N-1) steps, 2(N-1)/N of
  the buffer sent per rank.
* ``recursive_doubling`` -- lg p steps in which partners ``r`` and ``r xor 2^k``
  swap their whole buffers and reduce them: few steps, lg p buffers sent.
* ``rabenseifner`` -- reduce-scatter by recursive halving (each step sends half
  of what is left), then all-gather by recursive doubling: 2 lg p steps and
  2(p-1)/p of the buffer, the ring's bandwidth in lg p steps each way.

* ``direct_exchange`` and ``all_gather`` -- the half types' ring (see
  :func:`direct_exchange`): every rank receives the other ranks' own 16-bit
  inputs for the chunk it finishes (no partial result travels, so the one
  rounding happens on that rank), then the ring's all-gather.

* ``chain`` -- the reproducible one: the buffer cut into P **pieces** goes
  along a chain 0 -> 1 -> ... -> N-1, each rank folding its contribution into
  the partial it receives, so every element is the left fold in rank order;
  the finished pieces then go along N-1 -> 0 -> 1 -> ... -> N-2 (see
  :func:`chain`).

Both latency plans need a power of two, p, of ranks. With N = p + rem ranks
(rem < p), the standard fold (MPICH's): each of the first rem even ranks sends
its buffer to the odd rank after it ("fold-in") and sits out; the odd rank
reduces the two, the p remaining ranks run the plan, and the odd ranks send
the result back ("fold-out"). Two extra steps, and the buffer once more.

Every reduce combines the two operands in one order on both partners (the
lower-numbered partner's operand first, ``THEIRS_FIRST`` on the higher one),
and every finished element is then only copied, so the result is bitwise the
same on every rank.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .schedule import REDUCE_SCATTER, chunk_bounds, ring_steps

__all__ = ["PLANS", "Plan", "all_gather", "chain", "chain_pieces", "direct_exchange",
           "direct_slots", "plan", "simulate"]  # fmt: skip

# The columns of a plan's table.
PHASE, STEP, SEND_TO, SEND_OFF, SEND_LEN, RECV_FROM, RECV_OFF, RECV_LEN, ACTION = range(9)
COLUMNS = 9
# ACTION: store what arrives, or reduce it into the elements there; flags on REDUCE:
STORE, REDUCE = 0, 1
THEIRS_FIRST = 2  # the received operand is the left one: ``acc = inp (op) acc``
FINAL = 4  # these elements are complete after this reduce (AVG divides them here)

FOLD_IN, FOLD_OUT = "fold-in", "fold-out"
DIRECT_EXCHANGE = "direct-exchange"
ALL_GATHER = "all-gather"
RECURSIVE_DOUBLING = "recursive-doubling"
REDUCE_CHAIN, BROADCAST_CHAIN = "reduce-chain", "broadcast-chain"


@dataclass(frozen=True)
class Plan:
    """One rank's steps (``table``, int64, one row per step) for a buffer of
    ``count`` elements, and the phase names that column ``PHASE`` indexes."""

    table: np.ndarray
    phases: tuple[str, ...]
    count: int

    @property
    def steps(self) -> int:
        return len(self.table)


class _Rows:
    def __init__(self) -> None:
        self.rows: list[list[int]] = []
        self.phases: list[str] = []

    def add(self, phase: str, step: int, send=(-1, 0, 0), recv=(-1, 0, 0), action=STORE):
        if phase not in self.phases:
            self.phases.append(phase)
        self.rows.append([self.phases.index(phase), step, *send, *recv, action])

    def plan(self, count: int) -> Plan:
        table = np.array(self.rows, np.int64).reshape(-1, COLUMNS)
        return Plan(table, tuple(self.phases), count)


def ring(nranks: int, rank: int, count: int) -> Plan:
    """The ring: rank r sends to r + 1 and receives from r - 1 (see ringmpi.schedule)."""
    rows = _Rows()
    bounds = chunk_bounds(count, nranks)
    right, left = (rank + 1) % nranks, (rank - 1) % nranks
    for st in ring_steps(nranks, rank):
        s0, s1 = bounds[st.send_chunk], bounds[st.send_chunk + 1]
        r0, r1 = bounds[st.recv_chunk], bounds[st.recv_chunk + 1]
        action = (REDUCE | (FINAL if st.last else 0)) if st.phase == REDUCE_SCATTER else STORE
        rows.add(st.phase, st.step, (right, s0, s1 - s0), (left, r0, r1 - r0), action)
    return rows.plan(count)


def direct_exchange(nranks: int, rank: int, count: int) -> Plan:
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
    (:meth:`ringmpi.kernels.Reduction.fold_inputs`, :func:`direct_slots`).
    """
    rows = _Rows()
    bounds = chunk_bounds(count, nranks)
    mine = (rank + 1) % nranks
    length = bounds[mine + 1] - bounds[mine]
    for s in range(1, nranks):
        theirs = (rank + 1 + s) % nranks
        send = ((rank + s) % nranks, bounds[theirs], bounds[theirs + 1] - bounds[theirs])
        recv = ((rank - s) % nranks, count + (s - 1) * length, length)
        rows.add(DIRECT_EXCHANGE, s - 1, send, recv)
    return rows.plan(count)


def direct_slots(nranks: int, rank: int, count: int) -> np.ndarray:
    """Where rank k's contribution to the chunk rank ``rank`` finishes starts in the
    working buffer of :func:`direct_exchange`, for k = 0 .. N-1 (rank order)."""
    bounds = chunk_bounds(count, nranks)
    mine = (rank + 1) % nranks
    length = bounds[mine + 1] - bounds[mine]
    return np.array([bounds[mine] if k == rank else count + ((rank - k) % nranks - 1) * length
                     for k in range(nranks)], np.int64)  # fmt: skip


def all_gather(nranks: int, rank: int, count: int) -> Plan:
    """The ring's all-gather alone (rank r starts with chunk r + 1 finished)."""
    rows = _Rows()
    bounds = chunk_bounds(count, nranks)
    right, left = (rank + 1) % nranks, (rank - 1) % nranks
    for st in ring_steps(nranks, rank):
        if st.phase != REDUCE_SCATTER:
            s0, s1 = bounds[st.send_chunk], bounds[st.send_chunk + 1]
            r0, r1 = bounds[st.recv_chunk], bounds[st.recv_chunk + 1]
            rows.add(st.phase, st.step, (right, s0, s1 - s0), (left, r0, r1 - r0))
    return rows.plan(count)


def _fold(nranks: int, rank: int) -> tuple[int, int, int]:
    """(p, rem, newrank): the power of two that runs the plan, the folded ranks'
    count, and this rank's number among the p (-1: folded, it sits out)."""
    p = 1 << (nranks.bit_length() - 1)
    rem = nranks - p
    if rank < 2 * rem:
        return p, rem, -1 if rank % 2 == 0 else rank // 2
    return p, rem, rank - rem


def _real(newrank: int, rem: int) -> int:
    """The communicator rank of plan member ``newrank``."""
    return 2 * newrank + 1 if newrank < rem else newrank + rem


def _fold_in(rows: _Rows, rank: int, rem: int, count: int) -> None:
    if rank < 2 * rem:
        whole = (0, count)
        if rank % 2 == 0:
            rows.add(FOLD_IN, 0, send=(rank + 1, *whole))
        else:
            rows.add(FOLD_IN, 0, recv=(rank - 1, *whole), action=REDUCE | THEIRS_FIRST)


def _fold_out(rows: _Rows, rank: int, rem: int, count: int) -> None:
    if rank < 2 * rem:
        whole = (0, count)
        if rank % 2 == 0:
            rows.add(FOLD_OUT, 0, recv=(rank + 1, *whole))
        else:
            rows.add(FOLD_OUT, 0, send=(rank - 1, *whole))


def recursive_doubling(nranks: int, rank: int, count: int) -> Plan:
    """Partners ``newrank xor 2^k`` swap and reduce whole buffers, k = 0 .. lg p - 1."""
    rows = _Rows()
    p, rem, me = _fold(nranks, rank)
    _fold_in(rows, rank, rem, count)
    if me >= 0:
        mask, step = 1, 0
        while mask < p:
            partner = me ^ mask
            action = (
                REDUCE | (THEIRS_FIRST if partner < me else 0) | (FINAL if 2 * mask == p else 0)
            )
            peer = _real(partner, rem)
            rows.add(RECURSIVE_DOUBLING, step, (peer, 0, count), (peer, 0, count), action)
            mask, step = mask << 1, step + 1
    _fold_out(rows, rank, rem, count)
    return rows.plan(count)


def rabenseifner(nranks: int, rank: int, count: int) -> Plan:
    """Reduce-scatter by recursive halving, all-gather by recursive doubling.

    The buffer is cut into p blocks; member ``newrank`` ends the halving with
    block ``newrank`` finished. In halving step k (mask = p/2, p/4, ..., 1) the
    member keeps the lower half of its block range if its ``mask`` bit is 0,
    else the upper half, sends the other half to ``newrank xor mask`` and
    reduces the half it keeps with what the partner sends. The all-gather
    retraces the steps: each member swaps everything it holds with the
    partner, doubling it.
    """
    rows = _Rows()
    p, rem, me = _fold(nranks, rank)
    _fold_in(rows, rank, rem, count)
    if me >= 0:
        blocks = chunk_bounds(count, p)
        lo, hi = 0, p
        mask, step = p >> 1, 0
        while mask >= 1:
            partner = me ^ mask
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if me & mask == 0 else ((mid, hi), (lo, mid))
            action = REDUCE | (THEIRS_FIRST if partner < me else 0) | (FINAL if mask == 1 else 0)
            peer = _real(partner, rem)
            rows.add(REDUCE_SCATTER, step, _span(peer, blocks, give), _span(peer, blocks, keep),
                     action)  # fmt: skip
            lo, hi = keep
            mask, step = mask >> 1, step + 1
        mask, step = 1, 0
        while mask < p:
            partner = me ^ mask
            size = hi - lo
            theirs = (hi, hi + size) if me & mask == 0 else (lo - size, lo)
            peer = _real(partner, rem)
            rows.add(ALL_GATHER, step, _span(peer, blocks, (lo, hi)), _span(peer, blocks, theirs))
            lo, hi = min(lo, theirs[0]), max(hi, theirs[1])
            mask, step = mask << 1, step + 1
    _fold_out(rows, rank, rem, count)
    return rows.plan(count)


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
    rows = _Rows()
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


def _chain_row(rows: _Rows, tau: int, send: tuple, recv: tuple) -> None:
    """One row of the chain, unless it has neither a send nor a receive. Its phase is
    the send's (the trace's phase for it), else the receive's."""
    out = (send[1], *send[0]) if send[0] is not None else (-1, 0, 0)
    into = (recv[1], *recv[0]) if recv[0] is not None else (-1, 0, 0)
    if out[0] < 0 and into[0] < 0:
        return
    kind = send[2] if out[0] >= 0 else BROADCAST_CHAIN if recv[2] == STORE else REDUCE_CHAIN
    rows.add(kind, tau, out, into, recv[2] if into[0] >= 0 else STORE)


def _span(peer: int, blocks: list[int], blockrange: tuple[int, int]) -> tuple[int, int, int]:
    a, b = blockrange
    return peer, blocks[a], blocks[b] - blocks[a]


# The whole all-reduces (simulate checks them); then the half types' ring in its two parts.
PLANS = {"ring": ring, "recursive_doubling": recursive_doubling, "rabenseifner": rabenseifner,
         "chain": chain}  # fmt: skip
PARTS = {"direct_exchange": direct_exchange, "all_gather": all_gather}


def plan(algorithm: str, nranks: int, rank: int, count: int, **options) -> Plan:
    """Rank ``rank``'s plan of ``algorithm`` for ``count`` elements on ``nranks`` ranks;
    ``options`` go to the plan's function (the chain's ``itemsize`` and ``pieces``)."""
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} is not one of {nranks} ranks")
    return (PLANS.get(algorithm) or PARTS[algorithm])(nranks, rank, count, **options)


@dataclass
class Simulated:
    """What :func:`simulate` counted: per rank, bytes sent, messages and serial steps
    (rows); and per rank and element the expression it ends with: a rank number,
    or (left, right) for a reduce, left the operand first."""

    bytes_sent: list[int]
    messages: list[int]
    steps: list[int]
    results: list[list] = field(default_factory=list, repr=False)


def simulate(algorithm: str, nranks: int, count: int, itemsize: int = 1, **options) -> Simulated:
    """Run every rank's plan without MPI, each element a set of contributions and the
    expression that combines them (``options`` go to :func:`plan`).

    A row's sends leave when the row starts; its receive completes when the
    matching message (the next one from that peer, in order) is there. Raises
    AssertionError if the plans deadlock, a message's length differs from what
    its receiver expects, a reduce would count a contribution twice, or any
    rank ends without every contribution in every element.
    """
    plans = [plan(algorithm, nranks, r, count, **options) for r in range(nranks)]
    held = [[frozenset([r])] * count for r in range(nranks)]
    exprs: list[list] = [[r] * count for r in range(nranks)]
    queues: dict[tuple[int, int], deque] = {}
    row_of = [0] * nranks
    posted = [False] * nranks
    sent = Simulated([0] * nranks, [0] * nranks, [0] * nranks)
    while True:
        moved = False
        for r in range(nranks):
            table = plans[r].table
            if row_of[r] == len(table):
                continue
            row = table[row_of[r]]
            if not posted[r]:
                if row[SEND_TO] >= 0:
                    at = slice(row[SEND_OFF], row[SEND_OFF] + row[SEND_LEN])
                    data = list(zip(held[r][at], exprs[r][at], strict=True))
                    queues.setdefault((r, int(row[SEND_TO])), deque()).append(data)
                    sent.bytes_sent[r] += int(row[SEND_LEN]) * itemsize
                    sent.messages[r] += 1
                    sent.steps[r] += 1
                posted[r] = True
                moved = True
            if row[RECV_FROM] >= 0:
                q = queues.get((int(row[RECV_FROM]), r))
                if not q:
                    continue
                data = q.popleft()
                assert len(data) == row[RECV_LEN], (
                    f"rank {r} row {row_of[r]}: got {len(data)} elements, expects {row[RECV_LEN]}"
                )
                off = int(row[RECV_OFF])
                for i, (got, expr) in enumerate(data):
                    if row[ACTION] & REDUCE:
                        assert not (held[r][off + i] & got), f"rank {r}: element {off + i} twice"
                        held[r][off + i] = held[r][off + i] | got
                        mine = exprs[r][off + i]
                        theirs_first = row[ACTION] & THEIRS_FIRST
                        exprs[r][off + i] = (expr, mine) if theirs_first else (mine, expr)
                    else:
                        held[r][off + i] = got
                        exprs[r][off + i] = expr
                if row[SEND_TO] < 0:
                    sent.steps[r] += 1
            row_of[r] += 1
            posted[r] = False
            moved = True
        if all(row_of[r] == len(plans[r].table) for r in range(nranks)):
            break
        assert moved, f"{algorithm} deadlocks at rows {row_of}"
    everyone = frozenset(range(nranks))
    for r in range(nranks):
        missing = [i for i in range(count) if held[r][i] != everyone]
        assert not missing, f"rank {r} ends without every contribution in elements {missing[:5]}"
    assert all(not q for q in queues.values()), "messages left unreceived"
    sent.results = exprs
    return sent
