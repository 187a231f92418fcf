"""The latency algorithms: few steps for small buffers (plans in :mod:`ringmpi.plans`).

* ``recursive_doubling``: lg p steps, each swapping and reducing the whole
  buffer with the partner ``rank xor 2^k``; lg p buffers sent per rank.
* ``rabenseifner``: reduce-scatter by recursive halving, then all-gather by
  recursive doubling: 2 lg p steps and the ring's 2(p-1)/p buffers.
* ``rabenseifner_hybrid``: the halving stopped after k of its lg p levels,
  recursive doubling on the 2^(lg p - k) blocks each group then holds, and the
  all-gather's last k levels: lg p + k steps. k = 0 is recursive doubling,
  k = lg p Rabenseifner; the cost model picks k (:func:`hybrid_depth`). It is
  hierarchical's middle choice across nodes, where a step costs a fabric's
  latency; run alone it prices with the constants of a node of p ranks.

The two halves of Rabenseifner's also run alone, on MPI's layout (rank r's
block r, any counts): :func:`halving_reduce_scatter` and
:func:`doubling_all_gather` (``ringmpi.Reduce_scatter`` and
``ringmpi.Allgather``'s latency variants).

Both fold a non-power-of-two N onto the largest power of two p <= N (two
extra steps for the first 2(N - p) ranks). Both run in the compiled step
engine; ``auto`` picks them for small buffers by the cost model.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

from .. import tuning
from ..plans import FINAL, REDUCE, THEIRS_FIRST, Plan, Rows
from ..schedule import ALL_GATHER, REDUCE_SCATTER, chunk_bounds
from .registry import FORWARDS, register

__all__ = ["doubling_all_gather", "halving_reduce_scatter", "hybrid_depth", "rabenseifner",
           "rabenseifner_hybrid", "rabenseifner_to", "recursive_doubling"]  # fmt: skip

PlanFn = Callable[[int, int, int, int], Plan]

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
    block ``newrank`` finished (:func:`_halving`), and the doubling gives every
    member every block (:func:`_doubling`).
    """
    return rabenseifner_to(None)(nranks, rank, count, itemsize)


def rabenseifner_hybrid(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
    """Rabenseifner's plan halved to the depth the cost model prices fastest for
    ``count * itemsize`` bytes (:func:`hybrid_depth`, with :func:`ringmpi.tuning.pricing`'s
    constants: every member computes the same)."""
    depth = hybrid_depth(count * itemsize, _power(nranks)[0], tuning.pricing(nranks))
    return rabenseifner_to(depth)(nranks, rank, count, itemsize)


@functools.lru_cache(maxsize=64)
def rabenseifner_to(levels: int | None) -> PlanFn:
    """The plan builder of Rabenseifner's algorithm halved ``levels`` times (None:
    all lg p). After k halvings each member holds 2^(lg p - k) blocks reduced over
    the 2^k members that differ from it in the high bits; the lg p - k members
    that differ in the low bits swap and reduce those blocks whole (recursive
    doubling), and the last k levels of the doubling gather the rest:
    lg p + k steps."""

    def build(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
        rows = Rows(nranks, rank)
        p, rem, me = _fold(nranks, rank)
        _fold_in(rows, rank, rem, count)
        if me >= 0:
            lg = p.bit_length() - 1
            k = lg if levels is None else min(levels, lg)
            blocks = chunk_bounds(count, p)
            _halving(rows, me, p, rem, blocks, k)
            _swapping(rows, me, p, rem, blocks, k)
            _doubling(rows, me, p, rem, blocks, k)
        _fold_out(rows, rank, rem, count)
        return rows.plan(count)

    return build


def _halving(rows: Rows, me: int, p: int, rem: int, blocks: list[int],
             levels: int | None = None) -> None:  # fmt: skip
    """Member ``me`` of p reduces block ``me`` of ``blocks`` (p + 1 bounds) over all p
    (or, after ``levels`` < lg p steps, its aligned group of p / 2^levels blocks over
    the 2^levels members that share its low bits).

    In step k (mask = p/2, p/4, ..., 1) the member keeps the lower half of its
    block range if its ``mask`` bit is 0, else the upper half, sends the other
    half to ``me xor mask`` and reduces the half it keeps with what the partner
    sends: lg p steps, (p-1)/p of an even buffer sent."""
    lo, hi = 0, p
    last = 1 if levels is None else p >> levels
    mask, step = p >> 1, 0
    while mask >= last:
        partner = me ^ mask
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if me & mask == 0 else ((mid, hi), (lo, mid))
        action = REDUCE | (THEIRS_FIRST if partner < me else 0) | (FINAL if mask == 1 else 0)
        peer = _real(partner, rem)
        rows.add(REDUCE_SCATTER, step, _span(peer, blocks, give), _span(peer, blocks, keep),
                 action)  # fmt: skip
        lo, hi = keep
        mask, step = mask >> 1, step + 1


def _swapping(rows: Rows, me: int, p: int, rem: int, blocks: list[int], levels: int) -> None:
    """After ``levels`` halvings: the members that share ``me``'s high bits hold the
    same aligned group of p / 2^levels blocks; they swap and reduce it whole with
    ``me xor mask``, mask = 1 .. p / 2^(levels + 1) (recursive doubling)."""
    span = p >> levels
    group = (me - me % span, me - me % span + span)
    mask, step = 1, 0
    while mask < span:
        partner = me ^ mask
        action = REDUCE | (THEIRS_FIRST if partner < me else 0) | (FINAL if 2 * mask == span else 0)
        peer = _real(partner, rem)
        rows.add(RECURSIVE_DOUBLING, step, _span(peer, blocks, group), _span(peer, blocks, group),
                 action)  # fmt: skip
        mask, step = mask << 1, step + 1


def _doubling(rows: Rows, me: int, p: int, rem: int, blocks: list[int],
              levels: int | None = None) -> None:  # fmt: skip
    """Member ``me`` of p, holding block ``me`` of ``blocks`` (or its aligned group of
    p / 2^levels), gathers all p: in step k (mask = 1, 2, ..., p/2, or from
    p / 2^levels) it swaps everything it holds with ``me xor mask``, doubling it:
    lg p steps, (p-1)/p of an even buffer sent."""
    span = 1 if levels is None else p >> levels
    lo, hi = me - me % span, me - me % span + span
    mask, step = span, 0
    while mask < p:
        partner = me ^ mask
        size = hi - lo
        theirs = (hi, hi + size) if me & mask == 0 else (lo - size, lo)
        peer = _real(partner, rem)
        rows.add(ALL_GATHER, step, _span(peer, blocks, (lo, hi)), _span(peer, blocks, theirs))
        lo, hi = min(lo, theirs[0]), max(hi, theirs[1])
        mask, step = mask << 1, step + 1


def _groups(bounds: list[int], p: int, rem: int) -> list[int]:
    """The p + 1 bounds of the members' blocks when rank r owns elements
    ``bounds[r]`` to ``bounds[r + 1]``: a member that stands for a folded pair owns
    both ranks' (adjacent) blocks."""
    return [bounds[2 * i if i < rem else i + rem] for i in range(p)] + [bounds[-1]]


@functools.lru_cache(maxsize=64)
def halving_reduce_scatter(counts: tuple[int, ...]) -> PlanFn:
    """The plan builder of MPI_Reduce_scatter by recursive halving, rank r finishing
    its ``counts[r]`` elements (rank order): lg p steps, each sending half of what
    the rank still holds, (p-1)/p of an even buffer in all, for p a power of two.
    Otherwise the first 2(N - p) ranks fold in pairs first (the even one sends
    its whole input to the odd one), and the odd one returns the even one's
    finished block last: two more steps."""
    bounds = list(itertools.accumulate(counts, initial=0))

    def build(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
        assert nranks == len(counts) and count == bounds[-1]
        rows = Rows(nranks, rank)
        p, rem, me = _fold(nranks, rank)
        _fold_in(rows, rank, rem, count)
        if me >= 0:
            _halving(rows, me, p, rem, _groups(bounds, p, rem))
        if rank < 2 * rem:
            pair = rank - rank % 2  # the even rank's block
            block = (bounds[pair], counts[pair])
            if rank % 2 == 0:
                rows.add(FOLD_OUT, 0, recv=(rank + 1, *block))
            else:
                rows.add(FOLD_OUT, 0, send=(rank - 1, *block))
        return rows.plan(count)

    return build


@functools.lru_cache(maxsize=64)
def doubling_all_gather(counts: tuple[int, ...]) -> PlanFn:
    """The plan builder of MPI_Allgather by recursive doubling from rank r holding its
    ``counts[r]`` elements (rank order): lg p steps, each swapping everything the
    rank holds, (p-1)/p of an even buffer sent, for p a power of two. Otherwise the
    first 2(N - p) ranks pair up: the even one hands its block to the odd one
    first and receives the whole buffer from it last."""
    bounds = list(itertools.accumulate(counts, initial=0))

    def build(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
        assert nranks == len(counts) and count == bounds[-1]
        rows = Rows(nranks, rank)
        p, rem, me = _fold(nranks, rank)
        if rank < 2 * rem:
            pair = rank - rank % 2
            block = (bounds[pair], counts[pair])
            if rank % 2 == 0:
                rows.add(FOLD_IN, 0, send=(rank + 1, *block))
            else:
                rows.add(FOLD_IN, 0, recv=(rank - 1, *block))
        if me >= 0:
            _doubling(rows, me, p, rem, _groups(bounds, p, rem))
        _fold_out(rows, rank, rem, count)
        return rows.plan(count)

    return build


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
    return _with_fold(_hybrid(n, q, q.bit_length() - 1), n, rem)


def _hybrid(n: float, q: int, k: int) -> dict[str, float]:
    """Halving k of lg q levels: (lg q + k) alpha; each member sends and reduces
    n(1 - 2^-k) in the halving, n 2^-k in each of the lg q - k swaps, and sends
    n(1 - 2^-k) in the doubling."""
    lg = q.bit_length() - 1
    kept = n / (1 << k)
    reduced = n - kept + (lg - k) * kept
    return {"call": 1.0, "alpha": float(lg + k), "beta": reduced + n - kept, "gamma": reduced}


def hybrid_depth(nbytes: float, q: int, costs: tuning.Costs) -> int:
    """The halvings k (0 .. lg q, q a power of two) with the least alpha, beta and
    gamma time for ``nbytes``: a further level pays one more step and saves
    sending and reducing a quarter of what each swap still moves."""
    lg = q.bit_length() - 1

    def seconds(k: int) -> float:
        t = _hybrid(nbytes, q, k)
        return costs.alpha * t["alpha"] + costs.beta * t["beta"] + costs.gamma * t["gamma"]

    return min(range(lg + 1), key=seconds)


def rabenseifner_hybrid_terms(n: float, p: int, nodes: int = 1, per_node: int = 1):
    """Rabenseifner's halved to :func:`hybrid_depth` (priced as the plan picks it),
    and the fold."""
    if p <= 1:
        return {"call": 1.0}
    q, rem = _power(p)
    return _with_fold(_hybrid(n, q, hybrid_depth(n, q, tuning.pricing(p))), n, rem)


def halving_terms(n: float, p: int, nodes: int = 1, per_node: int = 1):
    """lg p' alpha + n(p'-1)/p' (beta + gamma), and the fold."""
    if p <= 1:
        return {"call": 1.0}
    q, rem = _power(p)
    part = n * (q - 1) / q
    return _with_fold({"call": 1.0, "alpha": math.log2(q), "beta": part, "gamma": part}, n, rem)


def doubling_all_gather_terms(n: float, p: int, nodes: int = 1, per_node: int = 1):
    """lg p' alpha + n(p'-1)/p' beta, and the fold: two steps, the whole buffer."""
    if p <= 1:
        return {"call": 1.0}
    q, rem = _power(p)
    t = {"call": 1.0, "alpha": math.log2(q), "beta": n * (q - 1) / q}
    if rem:
        t["alpha"] += 2.0
        t["beta"] += n
    return t


# Each partial result they forward would round to 16 bits at every step.
register(
    "recursive_doubling",
    plan=recursive_doubling,
    terms=recursive_doubling_terms,
    summary="Recursive doubling: lg p steps swapping and reducing whole buffers.",
    no_half="it swaps and reduces partial results, rounded to 16 bits at every step",
    across=True,
)
register(
    "rabenseifner",
    plan=rabenseifner,
    terms=rabenseifner_terms,
    summary="Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling.",
    no_half="it forwards partial results, rounded to 16 bits at every step",
    across=True,
)
register(
    "rabenseifner_hybrid",
    plan=rabenseifner_hybrid,
    terms=rabenseifner_hybrid_terms,
    summary="Rabenseifner halved to the depth the cost model picks, recursive doubling below.",
    no_half="it forwards partial results, rounded to 16 bits at every step",
    auto=False,
    across=True,
)
# The halves (Rabenseifner's): from 3 ranks; at 2 they are the ring.
register("recursive_halving", collective="reduce_scatter", plan=halving_reduce_scatter,
         terms=halving_terms, summary="Recursive halving: lg p steps, each sending half of "
         "what the rank still holds.", no_half=FORWARDS, auto_from=3)  # fmt: skip
register("recursive_doubling", collective="allgather", plan=doubling_all_gather,
         terms=doubling_all_gather_terms, summary="Recursive doubling: lg p steps, each "
         "swapping everything the rank holds.", auto_from=3)  # fmt: skip


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
