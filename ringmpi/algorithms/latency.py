"""The latency algorithms: few steps for small buffers (plans in :mod:`ringmpi.plans`).

* ``recursive_doubling``: lg p steps, each swapping and reducing the whole
  buffer with the partner ``rank xor 2^k``; lg p buffers sent per rank.
* ``rabenseifner``: reduce-scatter by recursive halving, then all-gather by
  recursive doubling: 2 lg p steps and the ring's 2(p-1)/p buffers.

Both fold a non-power-of-two N onto the largest power of two p <= N (two
extra steps for the first 2(N - p) ranks). Both run in the compiled step
engine; ``auto`` picks them for small buffers by the cost model.
"""

from __future__ import annotations

import math

from ..plans import FINAL, REDUCE, THEIRS_FIRST, Plan, Rows
from ..schedule import ALL_GATHER, REDUCE_SCATTER, chunk_bounds
from .registry import register

__all__ = ["rabenseifner", "recursive_doubling"]

FOLD_IN, FOLD_OUT = "fold-in", "fold-out"
RECURSIVE_DOUBLING = "recursive-doubling"


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


def _fold_in(rows: Rows, rank: int, rem: int, count: int) -> None:
    if rank < 2 * rem:
        whole = (0, count)
        if rank % 2 == 0:
            rows.add(FOLD_IN, 0, send=(rank + 1, *whole))
        else:
            rows.add(FOLD_IN, 0, recv=(rank - 1, *whole), action=REDUCE | THEIRS_FIRST)


def _fold_out(rows: Rows, rank: int, rem: int, count: int) -> None:
    if rank < 2 * rem:
        whole = (0, count)
        if rank % 2 == 0:
            rows.add(FOLD_OUT, 0, recv=(rank + 1, *whole))
        else:
            rows.add(FOLD_OUT, 0, send=(rank - 1, *whole))


def recursive_doubling(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
    """Partners ``newrank xor 2^k`` swap and reduce whole buffers, k = 0 .. lg p - 1."""
    rows = Rows(nranks, rank)
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


def rabenseifner(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
    """Reduce-scatter by recursive halving, all-gather by recursive doubling.

    The buffer is cut into p blocks; member ``newrank`` ends the halving with
    block ``newrank`` finished. In halving step k (mask = p/2, p/4, ..., 1) the
    member keeps the lower half of its block range if its ``mask`` bit is 0,
    else the upper half, sends the other half to ``newrank xor mask`` and
    reduces the half it keeps with what the partner sends. The all-gather
    retraces the steps: each member swaps everything it holds with the
    partner, doubling it.
    """
    rows = Rows(nranks, rank)
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


def _span(peer: int, blocks: list[int], blockrange: tuple[int, int]) -> tuple[int, int, int]:
    a, b = blockrange
    return peer, blocks[a], blocks[b] - blocks[a]


def _power(p: int) -> tuple[int, int]:
    """(p', rem): the power of two the plans run on, and the folded ranks."""
    q = 1 << (p.bit_length() - 1)
    return q, p - q


def _with_fold(t: dict[str, float], n: float, rem: int) -> dict[str, float]:
    """The fold of the ``rem`` other ranks: two more steps moving the whole buffer."""
    if rem:
        for k, v in {"alpha": 2.0, "beta": 2.0 * n, "gamma": n}.items():
            t[k] = t.get(k, 0.0) + v
    return t


def recursive_doubling_terms(n: float, p: int, nodes: int = 1, per_node: int = 1):
    """lg p' (alpha + n beta + n gamma), and the fold."""
    if p <= 1:
        return {"call": 1.0}
    q, rem = _power(p)
    lg = math.log2(q)
    return _with_fold({"call": 1.0, "alpha": lg, "beta": n * lg, "gamma": n * lg}, n, rem)


def rabenseifner_terms(n: float, p: int, nodes: int = 1, per_node: int = 1):
    """2 lg p' alpha + 2n(p'-1)/p' beta + n(p'-1)/p' gamma, and the fold."""
    if p <= 1:
        return {"call": 1.0}
    q, rem = _power(p)
    lg = math.log2(q)
    t = {"call": 1.0, "alpha": 2 * lg, "beta": 2 * n * (q - 1) / q, "gamma": n * (q - 1) / q}
    return _with_fold(t, n, rem)


# Each partial result they forward would round to 16 bits at every step.
register(
    "recursive_doubling",
    plan=recursive_doubling,
    terms=recursive_doubling_terms,
    summary="Recursive doubling: lg p steps swapping and reducing whole buffers.",
    no_half="it swaps and reduces partial results, rounded to 16 bits at every step",
)
register(
    "rabenseifner",
    plan=rabenseifner,
    terms=rabenseifner_terms,
    summary="Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling.",
    no_half="it forwards partial results, rounded to 16 bits at every step",
)
