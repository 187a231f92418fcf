"""The library API under MPI: buffers, communicators, the Comm wrapper, trace, errors.

Inputs are :func:`ringmpi.verify.verify_inputs` (SUM unless a test says
otherwise), so every expected value is exact. Every check collects problems and
hands them to :func:`agree`, so all ranks pass or fail a test together.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
import ringmpi._api
import ringmpi._comm
from ringmpi import algorithms, kernels, verify
from ringmpi.algorithms import shared
from ringmpi.schedule import ALL_GATHER, REDUCE_SCATTER, chunk_bounds

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
SENTINEL = -1000  # never a result: |inputs| <= 4 per rank
ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "shared_memory", "mpi", "auto")


@pytest.fixture(scope="module")
def comms():
    """COMM_SELF, COMM_WORLD, one half of WORLD (color = rank % 2) and a duplicate of WORLD."""
    half = WORLD.Split(RANK % 2, RANK)
    dup = WORLD.Dup()
    yield {"self": MPI.COMM_SELF, "world": WORLD, "half": half, "dup": dup}
    half.Free()
    dup.Free()


@pytest.fixture(scope="module")
def waiting():
    """Two duplicates of WORLD whose ringmpi contexts wait by spinning and by sleeping."""
    comms = {}
    for policy in ("spin", "sleep"):
        with ringmpi.configured(wait=policy):
            comms[policy] = WORLD.Dup()
            ringmpi._comm.context(comms[policy])  # made now, under this policy
    yield comms
    for comm in comms.values():
        comm.Free()


def inputs(shape, dtype="float64", comm=WORLD, op=MPI.SUM) -> np.ndarray:
    """This rank's input of ``shape`` in ``comm``."""
    count = int(np.prod(shape, dtype=np.int64))
    return verify.verify_inputs(op, dtype, comm.Get_rank(), count).reshape(shape)


def expected(shape, dtype="float64", comm=WORLD, op=MPI.SUM) -> np.ndarray:
    """The exact all-reduce of :func:`inputs` over ``comm``."""
    count = int(np.prod(shape, dtype=np.int64))
    return verify.verify_expected(op, dtype, comm.Get_size(), count).reshape(shape)


def mismatch(what: str, got, want) -> list[str]:
    """No problem if ``got`` has the shape, dtype and values of ``want``; else one."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return [
            f"{what}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        ]
    if not np.array_equal(got, want):
        where = np.argwhere(got != want)[:3]
        at = tuple(where.T)
        return [f"{what}: at {where.tolist()} got {got[at]}, expected {want[at]}"]
    return []


def raised(exc: type[Exception], fn: Callable[..., object], *args, **kwargs) -> str | None:
    """The message of the ``exc`` that ``fn(*args, **kwargs)`` raises, or None if it returns."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        return str(e)
    return None


# --- allreduce(array): a new array ----------------------------------------------


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((), "float64"), ((7,), "int32"), ((3, 4), "complex64"), ((2, 3, 5), "uint8")],
)
@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_allreduce_returns_a_new_array(shape, dtype, algorithm):
    x = inputs(shape, dtype)
    before = x.copy()
    out = ringmpi.allreduce(x, algorithm=algorithm)
    problems = mismatch("result", out, expected(shape, dtype))
    problems += mismatch("input after the call", x, before)
    if np.shares_memory(out, x):
        problems.append("the result shares memory with the input")
    agree(WORLD, problems)


# --- buffers: layouts, larger recvbuf, buffer specs ---------------------------------
# Each case builds its buffers on this rank and says where the result must appear
# and which memory must be left alone.


@dataclass
class Case:
    sendbuf: object  # an array, a buffer spec or MPI.IN_PLACE
    recvbuf: object
    result: np.ndarray  # a view of where the result must land
    want: np.ndarray
    untouched: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    mpi4py_too: bool = False  # mpi4py takes these buffers as well: it must agree

    def keep(self, what: str, view: np.ndarray) -> Case:
        """Check after the call that ``view`` still holds what it holds now."""
        self.untouched.append((what, view, view.copy()))
        return self


def _filled(shape, dtype="float64", order="C") -> np.ndarray:
    return np.full(shape, SENTINEL, dtype, order=order)


def _strided_send() -> Case:
    parent = _filled(22)
    parent[::2] = inputs(11)
    recv = np.empty(11)
    return Case(parent[::2], recv, recv, expected(11)).keep("sendbuf's parent", parent)


def _strided_recv() -> Case:
    parent = _filled(22)
    return Case(inputs(11), parent[::2], parent[::2], expected(11)).keep("gaps", parent[1::2])


def _fortran_2d() -> Case:
    send = np.asfortranarray(inputs((5, 7)))
    recv = _filled((5, 7), order="F")
    return Case(send, recv, recv, expected((5, 7))).keep("sendbuf", send)


def _transposed_recv() -> Case:
    parent = _filled((7, 5))
    return Case(inputs((5, 7)), parent.T, parent.T, expected((5, 7)))


def _in_place_strided() -> Case:
    parent = _filled((6, 10))
    parent[:, ::2] = inputs((6, 5))
    view = parent[:, ::2]
    return Case(MPI.IN_PLACE, view, view, expected((6, 5))).keep("gaps", parent[:, 1::2])


def _send_2d_recv_1d() -> Case:
    recv = np.empty(12)
    return Case(inputs((3, 4)), recv, recv, expected(12), mpi4py_too=True)


# recvbuf larger than sendbuf (10 elements): the first 10, in C order, are written
# (mpi4py itself insists on equal counts, so it is not compared here).


def _larger_contiguous() -> Case:
    recv = _filled(15)
    return Case(inputs(10), recv, recv[:10], expected(10)).keep("tail", recv[10:])


def _larger_strided() -> Case:
    parent = _filled(30)
    recv = parent[::2]
    case = Case(inputs(10), recv, recv[:10], expected(10))
    return case.keep("tail", recv[10:]).keep("gaps", parent[1::2])


def _larger_fortran() -> Case:
    recv = _filled((3, 5), order="F")  # C order: rows 0 and 1 are the first 10
    return Case(inputs(10), recv, recv[:2], expected((2, 5))).keep("row 2", recv[2])


def _spec_float() -> Case:
    recv = np.empty(9, np.float32)
    send = [inputs(9, "float32"), MPI.FLOAT]
    return Case(send, [recv, MPI.FLOAT], recv, expected(9, "float32"), mpi4py_too=True)


def _spec_with_count() -> Case:
    recv = _filled(12, "float32")
    send = [inputs(12, "float32"), 7, MPI.FLOAT]
    case = Case(send, [recv, 7, MPI.FLOAT], recv[:7], expected(7, "float32"), mpi4py_too=True)
    return case.keep("recvbuf past the count", recv[7:])


def _spec_bytearray() -> Case:
    send = bytearray(inputs(9, "int32").tobytes())
    recv = bytearray(len(send))
    result = np.frombuffer(recv, np.int32)
    case = Case([send, MPI.INT], [recv, MPI.INT], result, expected(9, "int32"), mpi4py_too=True)
    return case.keep("sendbuf", np.frombuffer(send, np.int32))


def _spec_in_place() -> Case:
    buf = inputs(9)
    return Case(MPI.IN_PLACE, [buf, MPI.DOUBLE], buf, expected(9), mpi4py_too=True)


def _spec_count_in_place() -> Case:
    buf = inputs(12)
    case = Case(MPI.IN_PLACE, [buf, 7, MPI.DOUBLE], buf[:7], expected(7), mpi4py_too=True)
    return case.keep("buffer past the count", buf[7:])


CASES = {
    "strided-sendbuf": _strided_send,
    "strided-recvbuf": _strided_recv,
    "fortran-2d": _fortran_2d,
    "transposed-recvbuf": _transposed_recv,
    "in-place-strided": _in_place_strided,
    "send-2d-recv-1d": _send_2d_recv_1d,
    "larger-recvbuf": _larger_contiguous,
    "larger-recvbuf-strided": _larger_strided,
    "larger-recvbuf-fortran": _larger_fortran,
    "spec-FLOAT": _spec_float,
    "spec-count-FLOAT": _spec_with_count,
    "spec-bytearray-INT": _spec_bytearray,
    "spec-in-place": _spec_in_place,
    "spec-count-in-place": _spec_count_in_place,
}


def _check_case(case: Case, label: str) -> list[str]:
    problems = mismatch(f"{label}: result", case.result, case.want)
    for what, view, before in case.untouched:
        problems += mismatch(f"{label}: {what}", view, before)
    return problems


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
@pytest.mark.parametrize("build", CASES.values(), ids=CASES.keys())
def test_buffers(build, algorithm):
    case = build()
    ringmpi.Allreduce(case.sendbuf, case.recvbuf, MPI.SUM, WORLD, algorithm=algorithm)
    problems = _check_case(case, "ringmpi")
    if case.mpi4py_too:  # the same expectations hold for MPI's own Allreduce
        ref = build()
        WORLD.Allreduce(ref.sendbuf, ref.recvbuf, MPI.SUM)
        problems += _check_case(ref, "comm.Allreduce")
    agree(WORLD, problems)


# --- communicators ------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", ["self", "world", "half", "dup"])
def test_communicators(comms, name, algorithm):
    comm = comms[name]
    x = inputs(1009, comm=comm)
    out = ringmpi.allreduce(x, comm=comm, algorithm=algorithm)
    problems = mismatch(f"{name} (N={comm.Get_size()})", out, expected(1009, comm=comm))
    if name == "self":
        problems += mismatch("COMM_SELF: the input itself", out, x)
    agree(WORLD, problems)


@pytest.mark.parametrize("make", ["Dup", "Split"])
def test_private_duplicate_is_freed_with_the_communicator(make):
    ringmpi.allreduce(np.ones(1))  # WORLD has its context before the copy is made
    comm = WORLD.Dup() if make == "Dup" else WORLD.Split(RANK % 2, RANK)
    out = ringmpi.allreduce(inputs(50, comm=comm), comm=comm)
    ctx = ringmpi._comm.context(comm)  # cached by the call above: no communication
    problems = mismatch("result", out, expected(50, comm=comm))
    if ctx is ringmpi._comm.context(WORLD):
        problems.append("the new communicator shares COMM_WORLD's private duplicate")
    if ctx.comm == MPI.COMM_NULL:
        problems.append("the private duplicate is null while the communicator lives")
    comm.Free()
    if ctx.comm != MPI.COMM_NULL:
        problems.append("the private duplicate outlived the communicator")
    problems += mismatch("WORLD afterwards", ringmpi.allreduce(inputs(50)), expected(50))
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
@pytest.mark.parametrize("name", ["world", "dup"])
def test_ringmpi_traffic_never_matches_user_receives(comms, name, algorithm):
    """A receive the user posted (ANY_SOURCE, ANY_TAG) sees only the user's message."""
    comm = comms[name]
    rank, n = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    mailbox = np.zeros(2, np.int64)
    req = comm.Irecv(mailbox, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    out = ringmpi.allreduce(inputs(1009, comm=comm), comm=comm, algorithm=algorithm)
    problems = mismatch("result", out, expected(1009, comm=comm))
    if req.Test():
        problems.append("the user's receive matched ringmpi's traffic")
    comm.Barrier()  # nobody sends the user's message before every rank has tested
    sent = comm.Isend(np.array([rank, 4242], np.int64), dest=right, tag=7)
    status = MPI.Status()
    req.Wait(status)
    sent.Wait()
    problems += mismatch("user message", mailbox, np.array([left, 4242], np.int64))
    if (status.Get_source(), status.Get_tag()) != (left, 7):
        problems.append(f"user message from {status.Get_source()} tag {status.Get_tag()}")
    agree(WORLD, problems)


# --- ringmpi.Comm ----------------------------------------------------------------------


def test_comm_wrapper_is_the_same_communicator():
    comm = ringmpi.Comm(WORLD)
    problems = []
    if not isinstance(comm, MPI.Intracomm):
        problems.append(f"ringmpi.Comm is a {type(comm).__mro__}")
    if comm.Compare(WORLD) != MPI.IDENT:
        problems.append("ringmpi.Comm(WORLD) is not COMM_WORLD itself")
    if (comm.Get_rank(), comm.Get_size()) != (RANK, SIZE):
        problems.append(f"rank/size {comm.Get_rank()}/{comm.Get_size()}")
    comm.Barrier()
    if comm.bcast("from 0" if RANK == 0 else None, root=0) != "from 0":
        problems.append("bcast")
    if ringmpi.Comm().Compare(WORLD) != MPI.IDENT:
        problems.append("ringmpi.Comm() is not COMM_WORLD")
    agree(WORLD, problems)


def test_comm_wrapper_routes_arrays_through_ringmpi():
    comm = ringmpi.Comm(WORLD)
    send, recv = inputs(1009), np.empty(1009)
    with ringmpi.trace() as upper:
        comm.Allreduce(send, recv, MPI.SUM)
    with ringmpi.trace() as lower:
        out = comm.allreduce(inputs((3, 5)))
    with ringmpi.trace() as obj:
        total = comm.allreduce(5)
        biggest = comm.allreduce(RANK, op=MPI.MAX)
    problems = mismatch("Allreduce", recv, expected(1009))
    problems += mismatch("allreduce(ndarray)", out, expected((3, 5)))
    for what, t in (("Allreduce", upper), ("allreduce(ndarray)", lower)):
        # auto may choose shared_memory: no message, but its loads from the window
        moved = bool(t.events) or t.shared_read > 0
        if t.calls != 1 or moved != (SIZE > 1):
            problems.append(
                f"{what}: {t.calls} ringmpi calls, {len(t.events)} sends and "
                f"{t.shared_read} shared-memory bytes read traced"
            )
    if (total, biggest) != (5 * SIZE, SIZE - 1):
        problems.append(f"allreduce(5) = {total!r}, allreduce(rank, MAX) = {biggest!r}")
    if obj.calls != 0:
        problems.append("allreduce of a Python object went through ringmpi")
    agree(WORLD, problems)


def test_comm_wrapper_on_a_new_communicator():
    """The first ringmpi call on a wrapped, fresh communicator duplicates the wrapper."""
    split = WORLD.Split(RANK % 2, RANK)
    half = ringmpi.Comm(split)
    out = half.allreduce(inputs(33, comm=half))
    recv = np.empty(33)
    half.Allreduce(inputs(33, comm=half), recv)
    problems = mismatch("allreduce", out, expected(33, comm=half))
    problems += mismatch("Allreduce", recv, expected(33, comm=half))
    if half.allreduce(1) != split.Get_size():
        problems.append("allreduce(1) on the wrapped split")
    split.Free()
    agree(WORLD, problems)


# --- trace: counted traffic equals the closed form -------------------------------------


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


def shared_closed_form(count: int, itemsize: int, n: int, r: int) -> tuple[int, int]:
    """(written, read) bytes of shared_memory on rank r of n: the buffer stored once;
    per piece of SET_BYTES, the n - 1 other slots read whole, or, for a piece of
    SCATTER_BYTES or more, the rank's slice of each (the fold) and their own
    slices (the copy out), 2 (n - 1) / n of the piece."""
    per = shared.SET_BYTES // itemsize
    read = 0
    for done in range(0, max(count, 1), per):
        m = min(per, count - done)
        if n > 1 and m * itemsize >= shared.SCATTER_BYTES:
            mine = (r + 1) * m // n - r * m // n
            read += (n - 1) * mine + (m - mine)
        else:
            read += (n - 1) * m
    return count * itemsize, read * itemsize


@pytest.mark.parametrize("count", [0, 1, 1009, 2048, 8191, 70_000])
def test_trace_shared_memory_counts_window_bytes(count):
    """No message; this rank's contribution written once, the others' read as the
    closed form says (whole pieces below SCATTER_BYTES, sliced from there)."""
    buf = inputs(count)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, buf, algorithm="shared_memory")
    got = (len(t.events), t.shared_written, t.shared_read)
    want = (0, *shared_closed_form(count, 8, SIZE, WORLD.Get_rank()))
    problems = [] if got == want else [f"(events, written, read) {got}, expected {want}"]
    problems += mismatch("result", buf, expected(count))
    agree(WORLD, problems)


def test_trace_records_nothing_for_the_mpi_baseline():
    with ringmpi.trace() as t:
        out = ringmpi.allreduce(inputs(1009), algorithm="mpi")
    problems = mismatch("result", out, expected(1009))
    if t.events or t.calls != 1:
        problems.append(f"{len(t.events)} events, {t.calls} calls")
    agree(WORLD, problems)


# --- bad input: raised on every rank before any communication -------------------------


def _read_only(n: int) -> np.ndarray:
    a = np.zeros(n)
    a.flags.writeable = False
    return a


_x = np.arange(10.0)
BAD_INPUT = [
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(10), np.empty(9)),
        ValueError,
        "recvbuf",
        id="recvbuf-too-small",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(10), np.empty(10, np.float32)),
        TypeError,
        "dtype",
        id="recvbuf-dtype",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(4), _read_only(4)),
        ValueError,
        "read-only",
        id="recvbuf-read-only",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, _read_only(4)),
        ValueError,
        "read-only",
        id="in-place-read-only",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4), MPI.MAXLOC, algorithm="ring"),
        TypeError,
        "op MPI.MAXLOC is not one ringmpi reduces",
        id="op-MAXLOC",
    ),
    pytest.param(lambda: ringmpi.allreduce(np.ones(4), "sum"), ValueError, "op", id="op-string"),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, np.complex64), MPI.MAX),
        TypeError,
        "MPI.MAX.*complex64",
        id="MAX-complex64",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, np.float32), MPI.BAND),
        TypeError,
        "MPI.BAND.*float32",
        id="BAND-float32",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, np.int32), ringmpi.AVG),
        TypeError,
        "AVG.*int32",
        id="AVG-int32",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, np.float16), MPI.PROD),
        TypeError,
        "MPI.PROD.*float16",
        id="PROD-float16",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, ">f2"), algorithm="ring"),
        TypeError,
        ">f2|float16",
        id="dtype-f2-swapped",
    ),
    pytest.param(lambda: ringmpi.allreduce(np.ones(4), comm=7), TypeError, "comm", id="comm-int"),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4), comm=MPI.COMM_NULL),
        TypeError,
        "intracommunicator",
        id="comm-null",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4), comm=MPI.Intracomm()),
        TypeError,
        "COMM_NULL",
        id="null-intracomm",  # what a freed communicator becomes
    ),
    pytest.param(lambda: ringmpi.Comm(7), TypeError, "comm", id="Comm-int"),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4), algorithm="tree"),
        ValueError,
        r"(?=.*\bring\b)(?=.*\bmpi\b)",
        id="algorithm-unknown",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(_x[:6], _x[4:]), ValueError, "overlap", id="overlapping-buffers"
    ),
    pytest.param(lambda: ringmpi.Allreduce(_x, _x), ValueError, "overlap", id="same-buffer-twice"),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(4), "abc"),
        TypeError,
        "recvbuf",
        id="recvbuf-not-a-buffer",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce([_x[::2], MPI.DOUBLE], np.empty(5)),
        ValueError,
        "contiguous",
        id="spec-not-contiguous",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(4), [np.empty(4), 9, MPI.DOUBLE]),
        ValueError,
        "count",
        id="spec-count-too-large",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(4), [bytearray(6), MPI.INT]),
        ValueError,
        "recvbuf",
        id="spec-partial-item",
    ),
]


@pytest.mark.parametrize(("call", "exc", "match"), BAD_INPUT)
def test_bad_input_raises_before_communicating(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# --- ranks that disagree -------------------------------------------------------------

needs_two_ranks = pytest.mark.skipif(SIZE < 2, reason="needs at least 2 ranks to disagree")

# What each rank passes when the ranks disagree on one field (rank 0 differs from rank 1).
DISAGREE = {
    "count": {"count": 10 + RANK},
    "dtype": {"dtype": "float32" if RANK % 2 else "float64"},
    "op": {"op": MPI.MAX if RANK % 2 else MPI.SUM},
    "algorithm": {"algorithm": "mpi" if RANK % 2 else "ring"},
}


def _call(count=10, dtype="float64", op=MPI.SUM, algorithm="ring", validate=None) -> None:
    send, recv = np.ones(count, dtype), np.empty(count, dtype)
    ringmpi.Allreduce(send, recv, op, WORLD, algorithm=algorithm, validate=validate)


def says(message: str | None, words: str) -> list[str]:
    """No problem if an error was raised and its ``message`` says ``words``."""
    if message is None:
        return ["no RingMPIError"]
    return [] if words in message else [f"{message!r} does not say {words!r}"]


def same_everywhere(what: str, value: object) -> list[str]:
    everyone = WORLD.allgather(value)
    return [] if all(v == everyone[0] for v in everyone) else [f"{what} differ: {everyone}"]


@needs_two_ranks
@pytest.mark.parametrize("field_name", DISAGREE.keys())
def test_validate_names_the_field_ranks_disagree_on(field_name):
    message = raised(ringmpi.RingMPIError, _call, **DISAGREE[field_name], validate=True)
    agree(WORLD, says(message, f"disagree on {field_name}") + same_everywhere("messages", message))


@needs_two_ranks
def test_validate_from_the_environment(environ):
    environ.set("RINGMPI_VALIDATE", "1")
    message = raised(ringmpi.RingMPIError, _call, **DISAGREE["count"])
    agree(WORLD, says(message, "disagree on count") + same_everywhere("messages", message))


def test_validate_passes_when_ranks_agree():
    out = np.empty(1009)
    ringmpi.Allreduce(inputs(1009), out, validate=True)
    agree(WORLD, mismatch("result", out, expected(1009)))


# Without validation the ring notices at its first step, on every rank, when every
# rank's left neighbour disagrees with it. count = 10 + N*rank makes each rank's
# first received chunk a different size from what it expects. (count = 10 + rank
# would not: at N = 2, rank 0 expects chunk 1 of 10 elements, 5, and rank 1 sends
# chunk 1 of 11, also 5; rank 0 then waits forever for rank 1, which has raised.)
INT32_OPS = [spec.op for spec in kernels._OPS if np.dtype("int32") in spec.dtypes]
UNVALIDATED = {
    "count": (10 + SIZE * RANK, MPI.SUM, "disagree on count"),
    "op": (10, INT32_OPS[RANK % len(INT32_OPS)], "disagree on op"),
}


@needs_two_ranks
@pytest.mark.parametrize("policy", ["spin", "sleep"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("what", UNVALIDATED.keys())
@pytest.mark.parametrize(
    "algorithm", ["ring", "recursive_doubling", "rabenseifner", "shared_memory"]
)
def test_detects_disagreement_without_validation(environ, what, in_place, policy, algorithm):
    # The latency algorithms' fold makes a folded rank send and then wait for a
    # partner that may have raised: only where no rank folds (N a power of two)
    # does every rank notice at its first step (a timeout is what ends the rest:
    # test_disagreement_never_returns_a_result). shared_memory: every rank reads
    # every slot's header, so all notice.
    if algorithm in ("recursive_doubling", "rabenseifner") and SIZE & (SIZE - 1):
        pytest.skip("the latency algorithms fold ranks at this N")
    environ.set("RINGMPI_WAIT", policy)
    comm = WORLD.Dup()  # a failed call breaks its communicator off: a fresh one per test
    ringmpi._comm.context(comm)  # made now, under this policy
    count, op, words = UNVALIDATED[what]
    memory = np.full(count + 64, SENTINEL, np.int32)
    recv = memory[:count]
    recv[...] = 1
    send = MPI.IN_PLACE if in_place else np.ones(count, np.int32)
    message = raised(
        ringmpi.RingMPIError,
        ringmpi.Allreduce,
        send,
        recv,
        op,
        comm,
        algorithm=algorithm,
        validate=False,
    )
    problems = says(message, words)  # each rank names its own step: messages differ
    problems += mismatch("memory past recvbuf", memory[count:], np.full(64, SENTINEL, np.int32))
    # The step engine breaks the communicator off (messages may be in flight): every
    # later call on it raises, on every rank. shared_memory's ranks all stop at the
    # same flag, with nothing in flight: its next call just works.
    after = raised(ringmpi.RingMPIError, ringmpi.allreduce, inputs(1009), comm=comm,
                   algorithm=algorithm)  # fmt: skip
    if algorithm == "shared_memory":
        problems += [] if after is None else [f"the next call raised: {after}"]
    else:
        problems += says(after, "no longer uses this communicator")
    comm.Free()
    again = WORLD.Dup()
    problems += mismatch("a call on a new communicator", ringmpi.allreduce(
        inputs(1009), comm=again, algorithm=algorithm), expected(1009))  # fmt: skip
    again.Free()
    agree(WORLD, problems)


# The algorithms where some ranks cannot notice the disagreement themselves: the
# latency algorithms' folded ranks (N not a power of two), the chain (only the rank
# after the odd one sees its message), the hierarchical algorithm (its node
# announcement and, across emulated nodes, its rails). With a timeout every rank
# raises, either the disagreement or the timeout of waiting for a rank that raised.
TIMED_CASES = {
    "recursive_doubling": {},
    "rabenseifner": {},
    "chain": {},
    "hierarchical": {},
    "hierarchical-2-per-node": {"RINGMPI_RANKS_PER_NODE": "2"},
}


@needs_two_ranks
@pytest.mark.parametrize("what", UNVALIDATED.keys())
@pytest.mark.parametrize("case", TIMED_CASES.keys())
def test_disagreement_never_returns_a_result(environ, what, case):
    for key, value in TIMED_CASES[case].items():
        environ.set(key, value)
    algorithm = case.split("-")[0]
    comm = WORLD.Dup()  # a timeout breaks the communicator off: a fresh one per test
    ringmpi.allreduce(inputs(1009), comm=comm, algorithm=algorithm)  # set up, windows made
    count, op, words = UNVALIDATED[what]
    memory = np.full(count + 64, SENTINEL, np.int32)
    recv = memory[:count]
    recv[...] = 1
    message = raised(ringmpi.RingMPIError, ringmpi.Allreduce, np.ones(count, np.int32), recv,
                     op, comm, algorithm=algorithm, validate=False, timeout=1.0)  # fmt: skip
    problems = [] if message is not None else ["returned instead of raising"]
    problems += mismatch("memory past recvbuf", memory[count:], np.full(64, SENTINEL, np.int32))
    everyone = WORLD.allgather(message)
    if not any(words in m for m in everyone if m):
        problems.append(f"no rank says {words!r}: {everyone}")
    for m in everyone:
        if m and words not in m and "(timeout)" not in m:
            problems.append(f"neither the disagreement nor a timeout: {m!r}")
    comm.Free()
    # The job goes on, on another communicator.
    again = WORLD.Dup()
    problems += mismatch("the next call", ringmpi.allreduce(inputs(1009), comm=again,
                         algorithm=algorithm), expected(1009))  # fmt: skip
    again.Free()
    agree(WORLD, problems)


@needs_two_ranks
@pytest.mark.parametrize("field_name", ["count", "dtype", "op"])
@pytest.mark.parametrize("algorithm", sorted(set(ringmpi.algorithms.names()) - {"auto"}))
def test_validate_catches_every_algorithm(field_name, algorithm):
    fields = {**DISAGREE[field_name], "algorithm": algorithm}
    message = raised(ringmpi.RingMPIError, _call, **fields, validate=True)
    agree(WORLD, says(message, f"disagree on {field_name}") + same_everywhere("messages", message))


# --- RINGMPI_ALGORITHM ----------------------------------------------------------------


def test_algorithm_from_the_environment(environ):
    environ.set("RINGMPI_ALGORITHM", "mpi")
    with ringmpi.trace() as auto:
        out = ringmpi.allreduce(inputs(1009))
    with ringmpi.trace() as ring:
        ringmpi.allreduce(inputs(1009), algorithm="ring")  # an explicit name wins
    problems = mismatch("result", out, expected(1009))
    if auto.events or auto.calls != 1:
        problems.append(f"auto with RINGMPI_ALGORITHM=mpi traced {len(auto.events)} sends")
    if bool(ring.events) != (SIZE > 1):
        problems.append(f"algorithm='ring' traced {len(ring.events)} sends")
    if (auto.ran, ring.ran) != (["mpi"], ["ring"]):
        problems.append(f"the traces say auto ran {auto.ran} and the ring {ring.ran}")
    agree(WORLD, problems)


def test_unknown_algorithm_in_the_environment(environ):
    environ.set("RINGMPI_ALGORITHM", "tree")
    with pytest.raises(ValueError, match="tree"):
        ringmpi.allreduce(np.ones(4))


# --- RINGMPI_WAIT: how a waiting rank waits --------------------------------------------


def _crowded() -> bool:
    """Many more ranks on this node than it has cores: where "auto" polls and yields."""
    node = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    crowded = node.Get_size() >= ringmpi._comm._CROWDED * (os.cpu_count() or 1)
    node.Free()
    return crowded


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner"])
@pytest.mark.parametrize("count", [7, 4099, 300_001])
@pytest.mark.parametrize("policy", ["spin", "sleep"])
def test_both_ways_of_waiting_give_the_result(waiting, policy, count, algorithm):
    comm = waiting[policy]
    got = ringmpi.allreduce(inputs(count), comm=comm, algorithm=algorithm)
    problems = mismatch("result", got, expected(count))
    if ringmpi._comm.context(comm).sleepy != (policy == "sleep"):
        problems.append(f"RINGMPI_WAIT={policy} was not followed")
    agree(WORLD, problems)


def test_wait_auto_sleeps_only_on_a_crowded_node(environ):
    environ.set("RINGMPI_WAIT", "auto")
    comm = WORLD.Dup()
    ringmpi.allreduce(np.ones(3), comm=comm)
    sleepy = ringmpi._comm.context(comm).sleepy
    comm.Free()
    agree(WORLD, [] if sleepy == _crowded() else [f"sleepy is {sleepy} on this node"])


def test_wait_unknown_policy(environ):
    environ.set("RINGMPI_WAIT", "fast")
    comm = WORLD.Dup()
    message = raised(ValueError, ringmpi.allreduce, np.ones(3), comm=comm)
    comm.Free()
    problems = [] if message and "RINGMPI_WAIT" in message else [f"raised {message!r}"]
    agree(WORLD, problems)


# --- edge sizes: count 0, one rank -------------------------------------------------------


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", ["self", "world", "half"])
def test_count_zero(comms, name, algorithm, validate):
    comm = comms[name]
    recv = _filled(3)
    empty = np.empty(0)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(empty, recv, MPI.SUM, comm, algorithm=algorithm, validate=validate)
        ringmpi.Allreduce(
            MPI.IN_PLACE, empty, MPI.SUM, comm, algorithm=algorithm, validate=validate
        )
    problems = mismatch("recvbuf", recv, _filled(3))
    problems += mismatch("in place", empty, np.empty(0))
    if t.bytes_sent != 0 or t.calls != 2:
        problems.append(f"{t.bytes_sent} bytes traced in {t.calls} calls")
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        (MPI.SUM, "float64"),
        (ringmpi.AVG, "float64"),
        (ringmpi.AVG, "complex128"),
        (MPI.PROD, "int8"),
        (MPI.LXOR, "bool"),
    ],
)
def test_one_rank_returns_the_input(comms, op, dtype, algorithm):
    """On COMM_SELF the result is this rank's input; AVG divides by 1."""
    x = inputs(1009, dtype, op=op)
    if np.dtype(dtype).kind in "fc":
        x = x / 7  # not small integers: AVG must divide by exactly 1
    out = ringmpi.allreduce(x, op, comms["self"], algorithm=algorithm)
    problems = mismatch("result", out, x)
    if out.tobytes() != x.tobytes():
        problems.append("result is not bitwise the input")
    agree(WORLD, problems)


# --- calls that repeat: the remembered path must see every change ---------------------

REPEATED = ["ring", "recursive_doubling", "rabenseifner", "hierarchical", "shared_memory", "mpi",
            "auto"]  # fmt: skip


@pytest.mark.parametrize("shape", [(1009,), (7, 13)], ids=["1-D", "2-D"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("algorithm", REPEATED)
def test_repeated_calls_on_the_same_arrays(algorithm, in_place, shape):
    count = shape
    send = np.empty(count)
    recv = np.empty(count)
    problems = []
    for k in range(4):  # the third and fourth take the remembered path
        x = inputs(count) * (k + 1)
        if in_place:
            recv[...] = x
            ringmpi.Allreduce(MPI.IN_PLACE, recv, algorithm=algorithm)
        else:
            send[...] = x
            ringmpi.Allreduce(send, recv, algorithm=algorithm)
        problems += mismatch(f"call {k}", recv, expected(count) * (k + 1))
    if not any(e[0]() is recv for e in ringmpi._api._repeats.values()):
        problems.append("the calls were not remembered: the repeat path was not taken")
    agree(WORLD, problems)


@needs_two_ranks  # one rank has no step to segment, and reads no segment setting
def test_a_repeat_sees_a_new_setting(environ):
    buf = inputs(64)
    for _ in range(3):
        ringmpi.Allreduce(MPI.IN_PLACE, buf.copy(), algorithm="ring")
    out = buf.copy()
    for _ in range(3):
        ringmpi.Allreduce(MPI.IN_PLACE, out, algorithm="ring")
    environ.set("RINGMPI_SEGMENT_BYTES", "lots")
    message = raised(ValueError, ringmpi.Allreduce, MPI.IN_PLACE, out, algorithm="ring")
    agree(WORLD, says(message, "RINGMPI_SEGMENT_BYTES must be a whole number"))


# "mpi" repeats from compiled code, which checks the arrays itself; the others in Python.
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "mpi"])
def test_a_repeat_sees_the_array_change_in_place(algorithm):
    count = 64
    a = np.empty(count, np.float32)
    problems = []
    for _ in range(3):
        a[...] = verify.verify_inputs(MPI.SUM, "float32", RANK, count)
        ringmpi.Allreduce(MPI.IN_PLACE, a, algorithm=algorithm)
    a.dtype = np.int32  # the same memory, now 64 int32
    a[...] = verify.verify_inputs(MPI.SUM, "int32", RANK, count)
    ringmpi.Allreduce(MPI.IN_PLACE, a, algorithm=algorithm)
    problems += mismatch("as int32", a, verify.verify_expected(MPI.SUM, "int32", SIZE, count))
    a.flags.writeable = False
    message = raised(ValueError, ringmpi.Allreduce, MPI.IN_PLACE, a, algorithm=algorithm)
    problems += says(message, "read-only")
    a.flags.writeable = True
    a.shape = (8, 8)
    a[...] = verify.verify_inputs(MPI.SUM, "int32", RANK, count).reshape(8, 8)
    ringmpi.Allreduce(MPI.IN_PLACE, a, algorithm=algorithm)
    want = verify.verify_expected(MPI.SUM, "int32", SIZE, count).reshape(8, 8)
    problems += mismatch("as 8x8", a, want)
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "mpi"])
def test_a_repeat_out_of_place_sees_the_arrays_change(algorithm):
    count = 64
    send, recv = np.empty(count, np.float64), np.empty(count, np.float64)
    x = verify.verify_inputs(MPI.SUM, "float64", RANK, count)
    want = verify.verify_expected(MPI.SUM, "float64", SIZE, count)
    problems = []
    for k in range(3):
        send[...] = x
        ringmpi.Allreduce(send, recv, algorithm=algorithm)
        problems += mismatch(f"call {k}", recv, want)
    send.flags.writeable = False  # a read-only contribution is still read
    recv[...] = SENTINEL
    ringmpi.Allreduce(send, recv, algorithm=algorithm)
    problems += mismatch("read-only sendbuf", recv, want)
    send.flags.writeable = True
    send.dtype = np.int64  # sendbuf's dtype no longer recvbuf's: refused, nothing sent
    message = raised(TypeError, ringmpi.Allreduce, send, recv, algorithm=algorithm)
    problems += says(message, "dtype")
    agree(WORLD, problems)


def counted(work, red, ctx, source=None, timeout=0.0):
    """The ring, counting its calls on this rank."""
    COUNTED.append(work.size)
    algorithms.get("ring").run(work, red, ctx, source, timeout)


COUNTED: list[int] = []


def test_a_repeat_sees_configure(settings):
    algorithms.register("counted", counted)
    try:
        COUNTED.clear()
        buf = inputs(64)
        settings(algorithm="mpi")
        for _ in range(3):  # remembered, running the library's call
            ringmpi.Allreduce(MPI.IN_PLACE, buf)
        settings(algorithm="counted")
        problems = []
        for k in range(2):
            buf[...] = inputs(64)
            ringmpi.Allreduce(MPI.IN_PLACE, buf)
            problems += mismatch(f"call {k}", buf, expected(64))
        problems += [] if COUNTED == [64, 64] else [f"'counted' ran {COUNTED}, not twice"]
    finally:
        algorithms.unregister("counted")
    agree(WORLD, problems)


def test_a_repeat_inside_a_trace_is_counted():
    buf = inputs(1009)
    for _ in range(3):
        ringmpi.Allreduce(MPI.IN_PLACE, buf, algorithm="ring")
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, buf, algorithm="ring")
    want = (1, 2 * (SIZE - 1))
    problems = [] if (t.calls, t.steps) == want else [f"(calls, steps) {(t.calls, t.steps)}"]
    agree(WORLD, problems)


def test_a_repeat_on_a_freed_communicator_is_refused():
    comm = WORLD.Dup()
    buf = inputs(16)
    for _ in range(3):
        ringmpi.Allreduce(MPI.IN_PLACE, buf.copy(), comm=comm)
        ringmpi.Allreduce(MPI.IN_PLACE, buf, comm=comm)
    comm.Free()
    message = raised(TypeError, ringmpi.Allreduce, MPI.IN_PLACE, buf, comm=comm)
    agree(WORLD, says(message, "COMM_NULL"))
