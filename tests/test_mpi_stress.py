"""The hard cases that take time or memory: counts past 2^31, many tiny calls, two
communicators at once, the user's own messages on the same communicator.

Every algorithm that :func:`ringmpi.algorithms.names` gives at run time is run
(shared_memory only where COMM_WORLD is one node). Every outcome goes through
:func:`agree`, so all ranks pass or fail each test together.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from conftest import agree, mpi_family
from mpi4py import MPI

import ringmpi
import ringmpi._comm
from ringmpi import algorithms, kernels, verify

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
ALGORITHMS = tuple(algorithms.names())


def _one_node(comm: MPI.Intracomm) -> bool:
    """Whether every rank of ``comm`` is on one node (the same answer on all of them)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    here = node.Get_size() == comm.Get_size()
    node.Free()
    return comm.allreduce(here, op=MPI.LAND)


def _skip_shared_memory_across_nodes(algorithm: str) -> None:
    if algorithm == "shared_memory" and not _one_node(WORLD):
        pytest.skip("shared_memory: COMM_WORLD spans nodes")


# --- counts above 2^31 ---------------------------------------------------------------
# 2.5 GiB of int8 at 2 ranks, in place: 2,684,354,560 elements and bytes, past both
# 2^31 (a C int) and 2^31 bytes. Every element is checked: rank r's value at i is
# pattern_r[i % 251], and 251 is a prime, so an element taken from any other offset
# (a 32-bit wrap of an index, a chunk shifted by a power of two) differs from it
# unless the shift is a multiple of 251. The values span int8, so the sums wrap too.
#
# Every algorithm runs: all of them together take about 1.5 minutes at 2 ranks on 2
# cores (measured: ring, hierarchical and recursive_doubling 1.1-1.2 s a call, chain
# 1.9 s, the MPI baseline 5.9 s, shared_memory 20 s for its 40,960 window passes of
# 64 KiB; about 4 s more each to fill and check, and 20 s to touch the buffer first),
# and up to 3 minutes with other jobs on the cores (hierarchical 24 s, shared_memory
# 42 s), within the 3 minutes that would call for running a subset.

BIG_COUNT = 5 * 2**29
BIG_PERIOD = 251
# ringmpi's own algorithms reduce in place through buffers of a segment or a piece,
# never a second copy of the data: 1 GiB above the buffer is far more than they need
# (about 0.15 GiB measured) and far less than a copy (2.5 GiB).
BIG_EXTRA_BYTES = 1 << 30
# Open MPI 5.0's MPI_Allreduce refuses a count of 2^31 or more (MPI_ERR_ARG, measured
# with 5.0.11), and Intel MPI 2021's large-count MPI_Allreduce_c returns wrong sums on
# some machines and right ones on others (README, "The three MPI families"), so the MPI
# baseline cannot be relied on there; ringmpi's own algorithms send in segments and run
# it under every family. MPICH takes the count.
if mpi_family() == "Open MPI" and MPI.Get_library_version().startswith("Open MPI v5."):
    BIG_REFUSED = pytest.mark.xfail(
        raises=MPI.Exception, strict=True,
        reason="Open MPI 5.0's MPI_Allreduce refuses counts of 2^31 and more (MPI_ERR_ARG)",
    )  # fmt: skip
elif mpi_family() == "Intel(R) MPI":
    BIG_REFUSED = pytest.mark.xfail(
        raises=AssertionError, strict=False,
        reason="Intel MPI 2021's MPI_Allreduce_c sums counts of 2^31 and more wrong on "
        "some machines",
    )  # fmt: skip
else:
    BIG_REFUSED = []


def _pattern(rank: int) -> np.ndarray:
    return ((np.arange(BIG_PERIOD) * (7 + 2 * rank) + 3 * rank) % 256 - 128).astype(np.int8)


def _fill(buf: np.ndarray, rank: int) -> None:
    whole = BIG_COUNT - BIG_COUNT % BIG_PERIOD
    buf[:whole].reshape(-1, BIG_PERIOD)[...] = _pattern(rank)
    buf[whole:] = _pattern(rank)[: BIG_COUNT - whole]


def _count_wrong(buf: np.ndarray, table: np.ndarray) -> tuple[int, int]:
    """(elements unlike the table, the first such index or -1), in blocks of 256 MiB."""
    whole = BIG_COUNT - BIG_COUNT % BIG_PERIOD
    rows, block = whole // BIG_PERIOD, 1 << 20
    wrong, first = 0, -1
    for start in range(0, rows, block):
        part = buf[start * BIG_PERIOD : min(rows, start + block) * BIG_PERIOD]
        bad = part.reshape(-1, BIG_PERIOD) != table
        n = int(np.count_nonzero(bad))
        if n and first < 0:
            first = start * BIG_PERIOD + int(np.flatnonzero(bad)[0])
        wrong += n
    tail = buf[whole:] != table[: BIG_COUNT - whole]
    if tail.any() and first < 0:
        first = whole + int(np.flatnonzero(tail)[0])
    return wrong + int(np.count_nonzero(tail)), first


def _memory() -> dict[str, int]:
    """This process's resident and peak resident bytes (VmRSS, VmHWM)."""
    found = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) * 1024
    return found


def _reset_peak() -> bool:
    """Start VmHWM again from the current resident size (Linux 4.0+)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(scope="module")
def big_buffer():
    """One 2.5 GiB buffer per rank, reused by every algorithm (first touch costs seconds)."""
    if SIZE != 2:
        pytest.skip("the 2.5 GiB case runs at exactly 2 ranks")
    # Both ranks' buffers and the MPI baseline's 1.25 GiB temporaries, with room to spare.
    enough = WORLD.allreduce(_available() >= 2 * (BIG_COUNT + (3 << 30)), op=MPI.LAND)
    if not enough:
        pytest.skip("not enough free memory here for two 2.5 GiB buffers")
    buf = np.empty(BIG_COUNT, np.int8)
    yield buf
    del buf


@pytest.mark.matrix  # under MPICH only (Makefile: MATRIX_RANKS)
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "algorithm", [pytest.param(a, marks=BIG_REFUSED) if a == "mpi" else a for a in ALGORITHMS]
)
def test_count_above_2_31(big_buffer, algorithm, capsys):
    """2.5 GiB of int8 summed in place at 2 ranks: every element exact (int8 wrapping),
    and ringmpi's own algorithms stay within BIG_EXTRA_BYTES of the buffer's memory."""
    _skip_shared_memory_across_nodes(algorithm)
    buf = big_buffer
    _fill(buf, RANK)
    table = (_pattern(0).astype(np.int16) + _pattern(1)).astype(np.int8)  # wraps as int8
    peaked = _reset_peak()
    before = _memory()
    WORLD.Barrier()
    start = time.perf_counter()
    ringmpi.Allreduce(MPI.IN_PLACE, buf, MPI.SUM, WORLD, algorithm=algorithm)
    seconds = time.perf_counter() - start
    after = _memory()
    wrong, first = _count_wrong(buf, table)
    problems = []
    if wrong:
        problems.append(f"{wrong} wrong elements, the first at index {first}")
    extra = after["VmHWM"] - before["VmRSS"] if peaked else after["VmRSS"] - before["VmRSS"]
    if algorithm != "mpi" and extra > BIG_EXTRA_BYTES:
        problems.append(f"{extra / 2**30:.2f} GiB above the buffer at the peak")
    timings = WORLD.gather((seconds, extra))
    if RANK == 0:
        slowest = max(t for t, _ in timings)
        most = max(e for _, e in timings) / 2**30
        with capsys.disabled():
            print(f"\n  2.5 GiB int8 SUM in place at 2 ranks, {algorithm}: {slowest:.1f} s, "
                  f"peak {most:.2f} GiB above the buffer per rank")  # fmt: skip
    agree(WORLD, problems)


# --- many tiny calls: resident memory stays flat -----------------------------------
# MPICH's allredmany: 10,000 back-to-back one-element calls. Both ways a program
# makes them: the same array again and again (the repeat path) and a new array each
# time (the full path). A leak grows with every call; the allocators (Python's, the
# MPI library's pools) grow in steps, now and then. So after a warm-up the 10,000 calls
# are measured as WINDOWS windows of 2,500, and the window that grew least may grow by
# FLAT_BYTES at most: 8 pages, less than 14 bytes a call, so even the smallest leak a
# call could make -- one Python object (16 bytes and more), one NumPy array or MPI
# request (about 100 bytes and more) -- grows every window above it, while a pool's
# steps land in few (Open MPI's own call on new arrays: 160 KiB over one run's 10,000
# calls; in windows of 2,500, 0-12 KiB and once 52 KiB). Where every window grew
# more, the library's own calls are measured the same way in the same process (once
# Open MPI's call on new arrays at 3 ranks grew 48-80 KiB in every window): ringmpi's
# least window may then exceed the library's least by FLAT_BYTES at most.

MANY = 10_000
WINDOWS = 4
WARM_UP = 2_000
FLAT_BYTES = 8 * 4096


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# What leaks would leak at any rank count: checked once per family, at 3 ranks.
@pytest.mark.skipif(SIZE != 3, reason="memory over many calls: checked at 3 ranks")
@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", ["same-array", "new-arrays", "started-new-arrays"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_many_tiny_calls_keep_memory_flat(algorithm, path):
    """10,000 calls of one float64 each (blocking, or Iallreduce and Wait): every
    result exact, resident memory flat."""
    _skip_shared_memory_across_nodes(algorithm)
    want = SIZE * (SIZE + 1) / 2
    buf = np.empty(1)

    def calls(k: int) -> int:
        wrong = 0
        for _ in range(k):
            if path == "same-array":
                buf[0] = RANK + 1
                ringmpi.Allreduce(MPI.IN_PLACE, buf, MPI.SUM, WORLD, algorithm=algorithm)
                out = buf
            elif path == "new-arrays":
                out = ringmpi.allreduce(np.full(1, RANK + 1.0), MPI.SUM, WORLD, algorithm=algorithm)
            else:
                out = np.full(1, RANK + 1.0)
                ringmpi.Iallreduce(MPI.IN_PLACE, out, MPI.SUM, WORLD, algorithm=algorithm).Wait()
            wrong += out[0] != want
        return wrong

    def library(k: int) -> int:
        """The same calls, the library's own (mpi4py's)."""
        for _ in range(k):
            if path == "same-array":
                WORLD.Allreduce(MPI.IN_PLACE, buf)
            elif path == "new-arrays":
                WORLD.Allreduce(np.full(1, RANK + 1.0), np.empty(1))
            else:
                WORLD.Iallreduce(MPI.IN_PLACE, np.full(1, RANK + 1.0)).Wait()
        return 0

    def windows(run) -> tuple[int, list[int]]:
        wrong = run(WARM_UP)
        grown = []
        for _ in range(WINDOWS):
            start = _resident()
            wrong += run(MANY // WINDOWS)
            grown.append(_resident() - start)
        return wrong, grown

    wrong, grown = windows(calls)
    problems = [f"{wrong} wrong results"] if wrong else []
    allowed = FLAT_BYTES
    if WORLD.allreduce(min(grown), op=MPI.MAX) > FLAT_BYTES:  # every rank measures it
        allowed += min(windows(library)[1])
    if min(grown) > allowed:
        problems.append(f"resident memory grew in every window of {MANY // WINDOWS} calls "
                        f"(KiB: {', '.join(str(g // 1024) for g in grown)}; allowed "
                        f"{allowed // 1024})")  # fmt: skip
    agree(WORLD, problems)


# --- two communicators in turn ----------------------------------------------------------


@pytest.mark.parametrize("shift", [0, 1, 3], ids=["same-algorithm", "next", "third-next"])
def test_two_communicators_interleaved(shift):
    """A duplicate of WORLD and an even/odd split called alternately, every algorithm in
    turn on each (the split's ``shift`` places further along the list), with counts that
    change from call to call: the halves run ahead of each other into the next call on
    the duplicate, whose messages must not meet the split's. Every result exact."""
    dup = WORLD.Dup()
    half = WORLD.Split(RANK % 2, RANK)
    names = [a for a in ALGORITHMS if a != "shared_memory" or _one_node(WORLD)]
    members = {"dup": dup.allgather(RANK), "half": half.allgather(RANK)}
    problems = []
    for i in range(4 * len(names)):
        for name, comm, algorithm in (
            ("dup", dup, names[i % len(names)]),
            ("half", half, names[(i + shift) % len(names)]),
        ):
            count = 1 + (i * 977 + (name == "half") * 4099) % 20_000
            j = np.arange(count)
            x = (RANK + 1) * (i + 1) + (j % 7) - 3.0  # small integers: exact in any order
            got = ringmpi.allreduce(x, MPI.SUM, comm, algorithm=algorithm)
            want = sum((r + 1) * (i + 1) for r in members[name]) + len(members[name]) * (
                j % 7 - 3.0
            )
            if not np.array_equal(got, want):
                at = int(np.flatnonzero(got != want)[0])
                problems.append(f"call {i} on {name} ({algorithm}, count {count}): "
                                f"[{at}] {got[at]}, expected {want[at]}")  # fmt: skip
    half.Free()
    dup.Free()
    agree(WORLD, problems)


# --- the user's own messages on the same communicator -----------------------------------
# First the user posts a receive for ANY_SOURCE and ANY_TAG before ringmpi's calls and
# sends the matching message only after them; then the user leaves a message in flight
# across the calls, with the very tag and size of ringmpi's first message. Neither may
# meet ringmpi's traffic. The calls send many messages: several counts, 4 KiB
# segments, and emulated nodes of one rank for hierarchical and auto (so that
# hierarchical's rings between nodes send messages).

TRAFFIC = [(1, MPI.SUM, "float64"), (1009, MPI.MAX, "int32"), (20_000, ringmpi.AVG, "float64")]


def _wait_a_while(req: MPI.Request, seconds: float = 30.0) -> MPI.Status | None:
    """The request's status once it completes, or None (cancelled) after ``seconds``."""
    status = MPI.Status()
    deadline = time.monotonic() + seconds
    while not req.Test(status):
        if time.monotonic() > deadline:
            req.Cancel()
            req.Wait()
            return None
        time.sleep(0.001)
    return status


def _traffic(comm: MPI.Intracomm, algorithm: str) -> list[str]:
    rank, n = comm.Get_rank(), comm.Get_size()
    problems = []
    for count, op, dtype in TRAFFIC:
        x = verify.verify_inputs(op, dtype, rank, count)
        got = ringmpi.allreduce(x, op, comm, algorithm=algorithm)
        if not np.array_equal(got, verify.verify_expected(op, dtype, n, count)):
            problems.append(f"count {count}: wrong result")
    return problems


# Emulated nodes change only what hierarchical (and auto, which may choose it) does.
USER_CASES = [pytest.param(a, None, id=a) for a in ALGORITHMS] + [
    pytest.param(a, 1, id=f"{a}-one-rank-nodes") for a in ("hierarchical", "auto")
]


@pytest.mark.parametrize("fresh", [False, True], ids=["used-comm", "fresh-comm"])
@pytest.mark.parametrize(("algorithm", "nodes"), USER_CASES)
def test_user_messages_never_meet_ringmpi_traffic(environ, algorithm, nodes, fresh):
    """``fresh``: the receive is posted on a communicator ringmpi has not used yet, so
    ringmpi sets it up while the receive is pending."""
    _skip_shared_memory_across_nodes(algorithm)
    environ.set("RINGMPI_SEGMENT_BYTES", "4096")
    if nodes is not None:
        environ.set("RINGMPI_RANKS_PER_NODE", str(nodes))
    comm = WORLD.Dup()
    if not fresh:
        ringmpi.allreduce(np.ones(3), comm=comm, algorithm=algorithm)
    rank, n = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % n, (rank - 1) % n

    # A receive the user posted, for anything from anyone, across the calls.
    mailbox = np.zeros(2, np.int64)
    posted = comm.Irecv(mailbox, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    problems = _traffic(comm, algorithm)
    if posted.Test():
        problems.append(f"the user's ANY_SOURCE/ANY_TAG receive matched ringmpi's: {mailbox}")
    comm.Barrier()  # every rank has tested before the user's own message goes
    sent = comm.Isend(np.array([rank, 4242], np.int64), dest=right, tag=7)
    status = _wait_a_while(posted)
    got = (status.Get_source(), status.Get_tag(), mailbox.tolist()) if status else None
    if got != (left, 7, [left, 4242]):
        problems.append(f"the user's receive got (source, tag, data) {got}")
    sent.Wait()

    # A message the user sent, with the tag and size of ringmpi's first message, in
    # flight across the calls and received only after them.
    red = kernels.reduction(MPI.SUM, "float64")
    tag = ringmpi._comm.context(comm).tag(red, 1)
    sent = comm.Isend(np.array([1000.0 + rank]), dest=right, tag=tag)
    problems += _traffic(comm, algorithm)
    early = np.zeros(1)
    if _wait_a_while(comm.Irecv(early, source=left, tag=tag)) is None:
        problems.append("the user's message with ringmpi's tag never arrived")
    elif early[0] != 1000.0 + left:
        problems.append(f"the user's message with ringmpi's tag holds {early[0]}")
    sent.Wait()
    comm.Free()
    agree(WORLD, problems)
