"""The plans (pure data) of every engine algorithm, checked by simulating every rank."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import numpy as np
import pairwise
import pytest

from ringmpi import algorithms, plans, tuning
from ringmpi.algorithms import chain, latency, ring
from ringmpi.schedule import chunk_bounds

# Every registered algorithm that runs a plan, one registered from outside the package
# too (tests/pairwise.py): a new algorithm is simulated here with no line of this file.
with pairwise.registered():
    ALGORITHMS = [a.name for a in algorithms.records() if a.plan is not None]
BUILT_IN = ["ring", "recursive_doubling", "rabenseifner", "chain"]


@pytest.fixture(autouse=True, scope="module")
def _pairwise():
    with pairwise.registered():
        yield


def test_an_algorithm_from_outside_is_simulated_with_the_rest():
    assert "pairwise" in ALGORITHMS and set(BUILT_IN) <= set(ALGORITHMS)
    # the ring's bytes and steps, partners changing every step
    sim = plans.simulate(build("pairwise"), 5, 5 * 7, itemsize=4)
    assert sim.bytes_sent == [2 * 4 * 7 * 4] * 5 and sim.steps == [2 * 4] * 5


COUNTS = [0, 1, 2, 3, 7, 8, 13, 64]


def build(name: str, **options):
    """The plan builder of algorithm ``name`` (the chain's ``pieces`` fixed if given)."""
    make = algorithms.get(name).plan
    return functools.partial(make, **options) if options else make


def plan(name: str, nranks: int, rank: int, count: int, itemsize: int = 1, **options):
    return build(name, **options)(nranks, rank, count, itemsize)


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("nranks", range(1, 10))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_rank_ends_with_every_contribution(algorithm, nranks, count):
    # simulate() raises AssertionError on a deadlock, a length mismatch, a
    # contribution counted twice or one missing at the end.
    plans.simulate(build(algorithm), nranks, count)


def _expected_steps(algorithm: str, n: int, r: int) -> int:
    """Serial steps (rows) of rank r, in closed form."""
    if n == 1:
        return 0
    if algorithm == "ring":
        return 2 * (n - 1)
    if algorithm == "chain":
        return _chain_rows(n, r, chain.chain_pieces(n, 16 * 9 * 5 * 7 * 11 * 13, 4))
    p = 1 << int(math.log2(n))
    rem, lg = n - p, int(math.log2(p))
    per = lg if algorithm == "recursive_doubling" else 2 * lg
    if r < 2 * rem:
        return 2 if r % 2 == 0 else per + 2
    return per


@pytest.mark.parametrize("nranks", range(1, 17))  # hierarchical's rails: M nodes up to 16
@pytest.mark.parametrize("algorithm", BUILT_IN)
def test_steps_and_bytes_equal_the_closed_form(algorithm, nranks):
    count = 16 * 9 * 5 * 7 * 11 * 13  # divisible by every N and p here
    sim = plans.simulate(build(algorithm), nranks, count, itemsize=4)
    assert [plan(algorithm, nranks, r, count, 4).steps for r in range(nranks)] == [
        _expected_steps(algorithm, nranks, r) for r in range(nranks)
    ]
    p = 1 << int(math.log2(nranks))
    rem = nranks - p
    for r in range(nranks):
        folded_even = r < 2 * rem and r % 2 == 0
        folded_odd = r < 2 * rem and r % 2 == 1
        if algorithm == "ring":
            want = 2 * count * (nranks - 1) // nranks
        elif algorithm == "chain":  # a partial and a finished copy; N-2 and N-1 one
            want = 0 if nranks == 1 else count * (2 if r <= nranks - 3 else 1)
        elif folded_even:
            want = count
        elif algorithm == "recursive_doubling":
            want = count * (int(math.log2(p)) + folded_odd)
        else:  # the ring's 2(p-1)/p over the p members, and the fold
            want = 2 * count * (p - 1) // p + count * folded_odd
        assert sim.bytes_sent[r] == 4 * want, (r, sim.bytes_sent)


def test_the_busiest_rank_sends_what_the_docs_say():
    # Per rank the ring moves 2(N-1)/N of the buffer (1.50 at 4, 1.97 at 64);
    # recursive doubling lg p buffers; Rabenseifner the ring's share.
    count = 64 * 4
    ring4 = plans.simulate(build("ring"), 4, count)
    assert max(ring4.bytes_sent) / count == 1.5
    assert max(plans.simulate(build("recursive_doubling"), 8, count).bytes_sent) / count == 3
    assert max(plans.simulate(build("rabenseifner"), 8, count).bytes_sent) / count == 2 * 7 / 8


@pytest.mark.parametrize("nranks", range(2, 10))
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner"])
def test_partners_reduce_in_one_order(algorithm, nranks):
    """Both partners of a swap put the lower rank's operand first (bitwise equal results)."""
    count = 16
    tables = [plan(algorithm, nranks, r, count).table for r in range(nranks)]
    for r, table in enumerate(tables):
        for row in table:
            if row[plans.ACTION] & plans.REDUCE:
                peer = int(row[plans.RECV_FROM])
                theirs_first = bool(row[plans.ACTION] & plans.THEIRS_FIRST)
                # the fold's odd rank and the higher member of a pair take the other's first
                assert theirs_first == (peer < r), (r, row)


@pytest.mark.parametrize("nranks", [4, 5, 8])
def test_rabenseifner_halves_then_doubles(nranks):
    count = 40
    p = 1 << int(math.log2(nranks))
    blocks = chunk_bounds(count, p)
    table = plan("rabenseifner", nranks, nranks - 1, count).table  # a member, no fold
    lengths = [int(row[plans.SEND_LEN]) for row in table]
    lg = int(math.log2(p))
    block = blocks[1] - blocks[0]
    assert lengths == [block * p >> (k + 1) for k in range(lg)] + [block << k for k in range(lg)]
    final = [bool(row[plans.ACTION] & plans.FINAL) for row in table]
    assert final == [k == lg - 1 for k in range(lg)] + [False] * lg


def _halved_bytes(count: int, q: int, me: int, k: int) -> int:
    """Elements member ``me`` of q sends halving k of lg q levels, in closed form:
    every block outside its aligned group of 2^(lg q - k) (the halving), that group
    lg q - k times (the swaps), and the doubling's aligned groups of 2^s blocks,
    s = lg q - k .. lg q - 1 (an even split: count divisible by q)."""
    lg = q.bit_length() - 1
    block = count // q

    def group(s: int) -> int:
        return block << s

    return (
        count - group(lg - k) + (lg - k) * group(lg - k) + sum(group(s) for s in range(lg - k, lg))
    )


@pytest.mark.parametrize("nranks", range(1, 17))
def test_rabenseifner_halved_part_of_the_way(nranks):
    """Every depth k from 0 (recursive doubling) to lg p (Rabenseifner): every rank
    ends with every contribution, in lg p + k steps (and the fold's two), sending
    the closed form's elements; partners reduce in one order."""
    count = 16 * 9 * 5 * 7 * 11 * 13
    q = 1 << (nranks.bit_length() - 1)
    rem, lg = nranks - q, q.bit_length() - 1
    for k in range(lg + 1):
        build = latency.rabenseifner_to(k)
        for c in COUNTS:
            plans.simulate(build, nranks, c)
        sim = plans.simulate(build, nranks, count, itemsize=4)
        for r in range(nranks):
            if r < 2 * rem and r % 2 == 0:
                want, steps = count, (2 if nranks > 1 else 0)
            else:
                odd = int(r < 2 * rem)
                me = r // 2 if odd else r - rem
                want = _halved_bytes(count, q, me, k) + odd * count
                steps = lg + k + 2 * odd
            assert (sim.bytes_sent[r], build(nranks, r, count, 4).steps) == (4 * want, steps)
            for row in build(nranks, r, 16).table:
                if row[plans.ACTION] & plans.REDUCE:
                    theirs_first = bool(row[plans.ACTION] & plans.THEIRS_FIRST)
                    assert theirs_first == (int(row[plans.RECV_FROM]) < r), (k, r, row)
    # the two ends are the algorithms of those names, row for row
    for r in range(nranks):
        ends = [latency.rabenseifner_to(0), latency.rabenseifner_to(lg)]
        got = [b(nranks, r, count).table[:, plans.SEND_TO :] for b in ends]
        for table, name in zip(got, ("recursive_doubling", "rabenseifner"), strict=True):
            assert np.array_equal(table, plan(name, nranks, r, count).table[:, plans.SEND_TO :])


def test_the_hybrid_halves_to_the_depth_the_model_prices_fastest():
    # a fabric of 17 us and 0.78 ns/B (docs/scaling.md): 512 nodes
    fabric = dataclasses.replace(tuning.DEFAULTS, alpha=17e-6, beta=0.78e-9, gamma=0.03e-9)

    def seconds(n, k):
        t = latency._hybrid(n, 512, k)
        return sum(getattr(fabric, c) * v for c, v in t.items() if c != "call")

    for n in (8, 4 << 10, 32 << 10, 256 << 10, 16 << 20):
        k = latency.hybrid_depth(n, 512, fabric)
        assert seconds(n, k) == min(seconds(n, j) for j in range(10)), n
    assert latency.hybrid_depth(8, 512, fabric) == 0  # recursive doubling
    # the last halving and the doubling's first step send what one swap sends:
    # at 16 MiB the step saved outweighs the reduce of the 1/512 more it costs
    assert latency.hybrid_depth(16 << 20, 512, fabric) == 8
    assert latency.hybrid_depth(16 << 20, 512, dataclasses.replace(fabric, gamma=1e-9)) == 9
    assert latency.hybrid_depth(32 << 10, 512, fabric) == 3  # in between
    # the record's plan is the halving at that depth, as the model prices it
    with tuning.pricing_with(fabric):
        got = plan("rabenseifner_hybrid", 512, 5, 8 << 10, 4).table
        t = algorithms.get("rabenseifner_hybrid").terms(32 << 10, 512)
    assert np.array_equal(got, latency.rabenseifner_to(3)(512, 5, 8 << 10, 4).table)
    assert t["alpha"] == 9 + 3


def test_plan_rejects_a_rank_outside():
    for name in ALGORITHMS:
        with pytest.raises(ValueError, match="rank 4 is not one of 4"):
            plan(name, 4, 4, 10)


def test_tables_are_int64_with_nine_columns():
    t = plan("rabenseifner", 6, 3, 100).table
    assert t.dtype == np.int64 and t.shape[1] == plans.COLUMNS


def _chain_rows(n: int, r: int, pieces: int) -> int:
    """The chain's rows on rank r, in closed form (chain.chain's docstring)."""
    if n == 1:
        return 0
    if n == 2:
        return pieces + 1
    if r == 0:  # slot A: partials out at ticks 0 .. P-1, finished in at N-1 ..; slot B: P
        return min(n + pieces - 1, 2 * pieces) + pieces
    if r == n - 1:
        return pieces + 1
    return 2 * pieces + (2 if r < n - 2 else 1)


@pytest.mark.parametrize("pieces", [1, 2, 3, 7, 13])
@pytest.mark.parametrize("nranks", range(1, 10))
def test_chain_folds_in_rank_order_on_every_rank(nranks, pieces):
    """Every element on every rank is ((x0 op x1) op x2) ... op x(N-1), the partial
    always the left operand; rows and bytes as the closed form says."""
    count = 41
    sim = plans.simulate(build("chain", pieces=pieces), nranks, count, 8)
    left = functools.reduce(lambda acc, x: (acc, x), range(nranks))
    assert all(e == left for result in sim.results for e in result)
    steps = [plan("chain", nranks, r, count, pieces=pieces).steps for r in range(nranks)]
    assert steps == [_chain_rows(nranks, r, pieces) for r in range(nranks)]
    sends = [0 if nranks == 1 else 2 if r <= nranks - 3 else 1 for r in range(nranks)]
    assert sim.bytes_sent == [8 * count * k for k in sends]
    assert sim.messages == [pieces * k for k in sends]


@pytest.mark.parametrize("nranks", range(2, 8))
def test_chain_rows_reduce_only_pieces_they_do_not_send(nranks):
    """A row never sends the elements it reduces or stores (the engine would have to
    wait for the send first), only the last rank's reduce is FINAL, and every reduce
    takes the received partial first."""
    count = 30
    for r in range(nranks):
        for row in plan("chain", nranks, r, count, pieces=5).table:
            if row[plans.SEND_TO] >= 0 and row[plans.RECV_FROM] >= 0:
                s0, s1 = row[plans.SEND_OFF], row[plans.SEND_OFF] + row[plans.SEND_LEN]
                r0, r1 = row[plans.RECV_OFF], row[plans.RECV_OFF] + row[plans.RECV_LEN]
                assert s1 <= r0 or r1 <= s0, (r, row)
            if row[plans.ACTION] & plans.REDUCE:
                assert row[plans.ACTION] & plans.THEIRS_FIRST and row[plans.RECV_FROM] == r - 1
                assert bool(row[plans.ACTION] & plans.FINAL) == (r == nranks - 1)


def test_chain_pieces():
    # one piece for small buffers; more, never more than the elements, as bytes grow
    assert chain.chain_pieces(4, 0, 4) == chain.chain_pieces(4, 1, 4) == 1
    assert chain.chain_pieces(2, 3, 1 << 30) == 3
    assert chain.chain_pieces(2, (64 << 20) // 4, 4) == 64 << 20 >> 22  # 4 MiB at most
    sizes = [chain.chain_pieces(8, n, 4) for n in (1 << 10, 1 << 16, 1 << 20, 1 << 24)]
    assert sizes == sorted(sizes) and sizes[0] == 1 < sizes[-1]


HALF_COUNTS = [
    lambda n: (3,) * n,
    lambda n: tuple(range(n)),
    lambda n: tuple(k * 7 % 5 for k in range(n)),
]


@pytest.mark.parametrize("nranks", range(1, 10))
@pytest.mark.parametrize("layout", HALF_COUNTS, ids=["even", "rising", "uneven"])
def test_the_halves_alone(nranks, layout):
    """The ring's reduce-scatter alone leaves rank r with every contribution to chunk r,
    and its all-gather alone gives every rank every chunk; each rank sends every chunk
    but one (its own, or chunk r + 1), in N - 1 steps."""
    counts = layout(nranks)
    total, bounds = sum(counts), [0, *itertools.accumulate(counts)]
    rs = plans.simulate(ring.reduce_scatter(counts), nranks, total, 4, complete=False)
    ag = plans.simulate(ring.all_gather_owned(counts), nranks, total, 4, complete=False)
    for r in range(nranks):
        mine = range(bounds[r], bounds[r + 1])
        assert all(rs.held[r][e] == frozenset(range(nranks)) for e in mine)
        assert rs.bytes_sent[r] == 4 * (total - counts[r])
        assert ag.results[r] == [k for k in range(nranks) for _ in range(counts[k])]
        assert ag.bytes_sent[r] == 4 * (total - counts[(r + 1) % nranks])
        assert rs.steps[r] == ag.steps[r] == nranks - 1


@pytest.mark.parametrize("nranks", range(1, 17))
@pytest.mark.parametrize("layout", HALF_COUNTS, ids=["even", "rising", "uneven"])
def test_the_halves_by_recursive_halving_and_doubling(nranks, layout):
    """Rabenseifner's halves alone on MPI's layout: rank r ends with every contribution
    to its own counts[r] elements (reduce-scatter) or with every rank's (all-gather),
    in lg p steps for p = 2^k ranks, two more for the 2(N - p) ranks folded in pairs.
    A rank sends every block but its own group's while halving; folded, the even rank
    sends its whole input, the odd one hands back the even one's finished block."""
    counts = layout(nranks)
    total, bounds = sum(counts), [0, *itertools.accumulate(counts)]
    p = 1 << (nranks.bit_length() - 1)
    rem, lg = nranks - p, p.bit_length() - 1
    rs = plans.simulate(latency.halving_reduce_scatter(counts), nranks, total, 4, complete=False)
    ag = plans.simulate(latency.doubling_all_gather(counts), nranks, total, 4, complete=False)
    for r in range(nranks):
        mine = range(bounds[r], bounds[r + 1])
        assert all(rs.held[r][e] == frozenset(range(nranks)) for e in mine)
        assert ag.results[r] == [k for k in range(nranks) for _ in range(counts[k])]
        if r < 2 * rem and r % 2 == 0:  # folded: its input out, its block back
            assert (rs.steps[r], rs.bytes_sent[r]) == (2, 4 * total)
            assert (ag.steps[r], ag.bytes_sent[r]) == (2, 4 * counts[r])
            continue
        group = counts[r] + (counts[r - 1] if r < 2 * rem else 0)
        extra = 2 if r < 2 * rem else 0
        assert rs.steps[r] == ag.steps[r] == lg + extra
        assert rs.bytes_sent[r] == 4 * (total - group + (counts[r - 1] if extra else 0))
        if layout is HALF_COUNTS[0] and not rem:  # p even blocks: (p-1)/p of the buffer
            assert ag.bytes_sent[r] == 4 * (total - counts[r])
