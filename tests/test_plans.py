"""The plans (pure data) of every engine algorithm, checked by simulating every rank."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ringmpi import plans
from ringmpi.schedule import chunk_bounds

ALGORITHMS = list(plans.PLANS)
COUNTS = [0, 1, 2, 3, 7, 8, 13, 64]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("nranks", range(1, 10))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_rank_ends_with_every_contribution(algorithm, nranks, count):
    # simulate() raises AssertionError on a deadlock, a length mismatch, a
    # contribution counted twice or one missing at the end.
    plans.simulate(algorithm, nranks, count)


def _expected_steps(algorithm: str, n: int, r: int) -> int:
    """Serial steps (rows) of rank r, in closed form."""
    if n == 1:
        return 0
    if algorithm == "ring":
        return 2 * (n - 1)
    p = 1 << int(math.log2(n))
    rem, lg = n - p, int(math.log2(p))
    per = lg if algorithm == "recursive_doubling" else 2 * lg
    if r < 2 * rem:
        return 2 if r % 2 == 0 else per + 2
    return per


@pytest.mark.parametrize("nranks", range(1, 10))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_steps_and_bytes_equal_the_closed_form(algorithm, nranks):
    count = 8 * 9 * 5 * 7  # divisible by every N and p here
    sim = plans.simulate(algorithm, nranks, count, itemsize=4)
    assert [plans.plan(algorithm, nranks, r, count).steps for r in range(nranks)] == [
        _expected_steps(algorithm, nranks, r) for r in range(nranks)
    ]
    p = 1 << int(math.log2(nranks))
    rem = nranks - p
    for r in range(nranks):
        folded_even = r < 2 * rem and r % 2 == 0
        folded_odd = r < 2 * rem and r % 2 == 1
        if algorithm == "ring":
            want = 2 * count * (nranks - 1) // nranks
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
    ring4 = plans.simulate("ring", 4, count)
    assert max(ring4.bytes_sent) / count == 1.5
    assert max(plans.simulate("recursive_doubling", 8, count).bytes_sent) / count == 3
    assert max(plans.simulate("rabenseifner", 8, count).bytes_sent) / count == 2 * 7 / 8


@pytest.mark.parametrize("nranks", range(2, 10))
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner"])
def test_partners_reduce_in_one_order(algorithm, nranks):
    """Both partners of a swap put the lower rank's operand first (bitwise equal results)."""
    count = 16
    tables = [plans.plan(algorithm, nranks, r, count).table for r in range(nranks)]
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
    table = plans.plan("rabenseifner", nranks, nranks - 1, count).table  # a member, no fold
    lengths = [int(row[plans.SEND_LEN]) for row in table]
    lg = int(math.log2(p))
    block = blocks[1] - blocks[0]
    assert lengths == [block * p >> (k + 1) for k in range(lg)] + [block << k for k in range(lg)]
    final = [bool(row[plans.ACTION] & plans.FINAL) for row in table]
    assert final == [k == lg - 1 for k in range(lg)] + [False] * lg


def test_plan_rejects_a_rank_outside():
    with pytest.raises(ValueError, match="rank 4 is not one of 4"):
        plans.plan("ring", 4, 4, 10)


def test_tables_are_int64_with_nine_columns():
    t = plans.plan("rabenseifner", 6, 3, 100).table
    assert t.dtype == np.int64 and t.shape[1] == plans.COLUMNS
