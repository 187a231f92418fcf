"""ringmpi.trace under MPI: the traffic each algorithm counts equals its closed form."""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest
from api_helpers import RANK, SIZE, WORLD, communicators, expected, inputs, mismatch
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi._comm import context
from ringmpi.algorithms import shared
from ringmpi.schedule import ALL_GATHER, REDUCE_SCATTER, chunk_bounds

pytestmark = pytest.mark.mpi

comms = pytest.fixture(scope="module")(communicators)


def chunk_sizes(count: int, n: int) -> list[int]:
    b = chunk_bounds(count, n)
    return [b[c + 1] - b[c] for c in range(n)]


def ring_closed_form(count: int, itemsize: int, n: int, r: int) -> int:
    """Bytes rank r sends: every chunk but (r+1) in reduce-scatter, but (r+2) in all-gather."""
    if n == 1:
        return 0
    size = chunk_sizes(count, n)
    return itemsize * (2 * count - size[(r + 1) % n] - size[(r + 2) % n])


def ring_steps_closed_form(count: int, itemsize: int, n: int, r: int) -> dict:
    """Bytes sent in each (phase, step): chunk r - s in reduce-scatter, r - s + 1 in all-gather."""
    size = chunk_sizes(count, n)
    steps = {(REDUCE_SCATTER, s): itemsize * size[(r - s) % n] for s in range(n - 1)}
    steps.update({(ALL_GATHER, s): itemsize * size[(r - s + 1) % n] for s in range(n - 1)})
    return steps


def traced_steps(t: ringmpi.Trace) -> dict:
    """Bytes sent in each (phase, step) of a trace's events, in the order they happened."""
    steps: dict = {}
    for e in t.events:
        steps[(e.phase, e.step)] = steps.get((e.phase, e.step), 0) + e.nbytes
    return steps


@pytest.mark.parametrize("dtype", ["uint8", "float32", "complex128"])
@pytest.mark.parametrize("count", [0, 1, 2, 4, 7, 1009, 4096])
@pytest.mark.parametrize("name", ["world", "half"])
def test_trace_matches_closed_form(comms, name, count, dtype):
    comm = comms[name]
    r, n, itemsize = comm.Get_rank(), comm.Get_size(), np.dtype(dtype).itemsize
    buf = np.zeros(count, dtype)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, buf, MPI.SUM, comm, algorithm="ring")
    got = (t.bytes_sent, t.messages, t.steps, t.calls)
    want = (ring_closed_form(count, itemsize, n, r), 2 * (n - 1), 2 * (n - 1), 1)
    problems = [] if got == want else [f"(bytes, messages, steps, calls) {got}, expected {want}"]
    phases = [(e.phase, e.step) for e in t.events]
    rounds = list(range(n - 1))
    if phases != [(REDUCE_SCATTER, s) for s in rounds] + [(ALL_GATHER, s) for s in rounds]:
        problems.append(f"phases and steps {phases}")
    if traced_steps(t) != ring_steps_closed_form(count, itemsize, n, r):
        problems.append(f"bytes per step {traced_steps(t)}")
    if {(e.peer, e.algorithm, e.call) for e in t.events} - {((r + 1) % n, "ring", 0)}:
        problems.append(f"peers {[e.peer for e in t.events]}")
    agree(WORLD, problems)


@pytest.mark.parametrize("segment_bytes", [64, 1000])
def test_trace_counts_every_segment(environ, segment_bytes):
    """Every message goes in segments of at most RINGMPI_SEGMENT_BYTES (whole elements)."""
    environ.set("RINGMPI_SEGMENT_BYTES", str(segment_bytes))
    count, itemsize = 1009, 8
    buf = inputs(count)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, buf, algorithm="ring")
    sizes, per = chunk_sizes(count, SIZE), segment_bytes // itemsize
    sent = [sizes[(RANK - s) % SIZE] for s in range(SIZE - 1)]  # reduce-scatter
    sent += [sizes[(RANK - s + 1) % SIZE] for s in range(SIZE - 1)]  # all-gather
    segments = sum(max(1, -(-size // per)) for size in sent)
    got = (t.bytes_sent, t.messages, t.steps)
    want = (ring_closed_form(count, itemsize, SIZE, RANK), segments, 2 * (SIZE - 1))
    problems = mismatch("result", buf, expected(count))
    if got != want:
        problems.append(f"(bytes, messages, steps) {got}, expected {want}")
    if traced_steps(t) != ring_steps_closed_form(count, itemsize, SIZE, RANK):
        problems.append(f"bytes per step {traced_steps(t)}")
    agree(WORLD, problems)


@pytest.mark.parametrize("name", ["self", "world", "half"])
def test_trace_bandwidth_ratio_and_two_calls(comms, name):
    """For a count divisible by N, each rank sends exactly 2(N-1)/N of the buffer per call."""
    comm = comms[name]
    n = comm.Get_size()
    count, itemsize = 60 * n, 8
    with ringmpi.trace() as t:
        for _ in range(2):
            ringmpi.Allreduce(MPI.IN_PLACE, np.ones(count), MPI.SUM, comm, algorithm="ring")
    problems = []
    if Fraction(t.bytes_sent, 2 * count * itemsize) != Fraction(2 * (n - 1), n):
        problems.append(f"{t.bytes_sent} bytes for two calls of {count * itemsize}")
    if (t.messages, t.steps, t.calls) != (4 * (n - 1), 4 * (n - 1), 2):
        problems.append(f"messages {t.messages}, steps {t.steps}, calls {t.calls}")
    if [e.call for e in t.events] != [0] * (2 * (n - 1)) + [1] * (2 * (n - 1)):
        problems.append(f"calls of the events {[e.call for e in t.events]}")
    agree(WORLD, problems)


def latency_closed_form(algorithm: str, count: int, itemsize: int, n: int, r: int):
    """(bytes, messages, steps) rank r sends in recursive doubling or Rabenseifner.

    p is the largest power of two <= n and rem = n - p. Ranks below 2 rem fold:
    an even one sends its buffer to the odd one after it and is sent the result;
    the odd ones stand for member r // 2, the others for member r - rem. Recursive
    doubling: lg p swaps of the whole buffer. Rabenseifner over p blocks: member m
    sends, in halving step k, the half of its range that m's bit (lg p - 1 - k)
    does not select (everything but block m in all), and in doubling step k the
    2^k blocks it holds.
    """
    p = 1 << (n.bit_length() - 1)
    rem, lg = n - p, p.bit_length() - 1
    if r < 2 * rem and r % 2 == 0:
        return count * itemsize, 1, 1
    m = r // 2 if r < 2 * rem else r - rem
    folded = 1 if r < 2 * rem else 0
    if algorithm == "recursive_doubling":
        sent = (lg + folded) * count
        return sent * itemsize, lg + folded, lg + folded
    blocks = chunk_sizes(count, p)
    halving = count - blocks[m]
    doubling = sum(sum(blocks[(m >> k) << k : ((m >> k) + 1) << k]) for k in range(lg))
    sent = halving + doubling + folded * count
    return sent * itemsize, 2 * lg + folded, 2 * lg + folded


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "rabenseifner"])
@pytest.mark.parametrize("count", [0, 1, 7, 1009])
@pytest.mark.parametrize("name", ["world", "half"])
def test_trace_latency_matches_closed_form(comms, name, count, algorithm):
    comm = comms[name]
    r, n = comm.Get_rank(), comm.Get_size()
    buf = inputs(count, comm=comm)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, buf, MPI.SUM, comm, algorithm=algorithm)
    got = (t.bytes_sent, t.messages, t.steps)
    want = latency_closed_form(algorithm, count, 8, n, r) if n > 1 else (0, 0, 0)
    problems = [] if got == want else [f"(bytes, messages, steps) {got}, expected {want}"]
    problems += mismatch("result", buf, expected(count, comm=comm))
    if {e.algorithm for e in t.events} - {algorithm}:
        problems.append(f"algorithms {[e.algorithm for e in t.events]}")
    agree(WORLD, problems)


def shared_closed_form(count: int, itemsize: int, n: int, r: int,
                       set_bytes: int) -> tuple[int, int]:  # fmt: skip
    """(written, read) bytes of shared_memory on rank r of n: the buffer stored once;
    per piece of ``set_bytes`` (the window's), the n - 1 other slots read whole, or,
    for a piece of SCATTER_BYTES or more, the rank's slice of each (the fold) and
    their own slices (the copy out), 2 (n - 1) / n of the piece."""
    per = set_bytes // itemsize
    read = 0
    for done in range(0, max(count, 1), per):
        m = min(per, count - done)
        if n > 1 and m * itemsize >= shared.SCATTER_BYTES:
            mine = (r + 1) * m // n - r * m // n
            read += (n - 1) * mine + (m - mine)
        else:
            read += (n - 1) * m
    return count * itemsize, read * itemsize


@pytest.mark.parametrize("count", [0, 1, 1009, 2048, 8191, 70_000, 600_000])
def test_trace_shared_memory_counts_window_bytes(count):
    """No message; this rank's contribution written once, the others' read as the
    closed form says (whole pieces below SCATTER_BYTES, sliced from there), in
    pieces of the window's sets: SET_BYTES, or larger ones where the node's ranks
    outnumber its cores (600,000 float64: two of CROWDED_SET_BYTES)."""
    buf = inputs(count)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, buf, algorithm="shared_memory")
    got = (len(t.events), t.shared_written, t.shared_read)
    set_bytes = context(WORLD).state(shared.SHARED_MEMORY).set_bytes
    crowded = len(frozenset().union(*WORLD.allgather(os.sched_getaffinity(0)))) < SIZE
    problems = (
        []
        if set_bytes == (shared.CROWDED_SET_BYTES if crowded else shared.SET_BYTES)
        else [f"sets of {set_bytes} bytes"]
    )
    want = (0, *shared_closed_form(count, 8, SIZE, WORLD.Get_rank(), set_bytes))
    problems += [] if got == want else [f"(events, written, read) {got}, expected {want}"]
    problems += mismatch("result", buf, expected(count))
    agree(WORLD, problems)


def test_trace_records_nothing_for_the_mpi_baseline():
    with ringmpi.trace() as t:
        out = ringmpi.allreduce(inputs(1009), algorithm="mpi")
    problems = mismatch("result", out, expected(1009))
    if t.events or t.calls != 1:
        problems.append(f"{len(t.events)} events, {t.calls} calls")
    agree(WORLD, problems)
