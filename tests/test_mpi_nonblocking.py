"""Iallreduce: the all-reduce queued on the communicator, behind an MPI request.

Every result is checked exactly (verify's inputs), for each algorithm, op and
dtype family, sizes from 0 to large, several calls in flight at once, mixed with
MPI's own requests and with blocking calls on the same communicator.
"""

from __future__ import annotations

import sys
import time
import weakref

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import _capi, _direct, _progress, _requests, verify

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
SIZES = [0, 1, SIZE + 1, 1009, 1 << 18]


def inputs(count: int, dtype: str = "float64", op=MPI.SUM, k: int = 0) -> np.ndarray:
    return (verify.verify_inputs(op, dtype, RANK, count) + k).astype(dtype)


def expected(count: int, dtype: str = "float64", op=MPI.SUM, k: int = 0) -> np.ndarray:
    return (verify.verify_expected(op, dtype, SIZE, count) + k * SIZE).astype(dtype)


def mismatch(what: str, got: np.ndarray, want: np.ndarray) -> list[str]:
    if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
        return [f"{what}: got {got.ravel()[:4]}..., expected {want.ravel()[:4]}..."]
    return []


@pytest.mark.parametrize("algorithm", ["auto", "ring", "recursive_doubling", "shared_memory",
                                       "mpi"])  # fmt: skip
@pytest.mark.parametrize(("op", "dtype"), [(MPI.SUM, "float64"), (MPI.SUM, "int32"),
                                           (MPI.MAX, "float32"), (MPI.PROD, "int64")])  # fmt: skip
def test_results_are_exact(algorithm, op, dtype):
    problems = []
    for count in SIZES:
        for k in range(2):  # each call twice: the second repeats the first
            send = inputs(count, dtype, op, k if op == MPI.SUM else 0)
            recv = np.empty(count, dtype)
            req = ringmpi.Iallreduce(send, recv, op, algorithm=algorithm)
            req.Wait()
            want = expected(count, dtype, op, k if op == MPI.SUM else 0)
            problems += mismatch(f"{count} {dtype} call {k}", recv, want)
    agree(WORLD, problems)


def test_many_in_flight_with_mpi_requests_and_blocking_calls():
    bufs = [inputs(n, k=k) for k, n in enumerate([7, 1 << 16, 3, 1 << 12, 0])]
    reqs: list[MPI.Request] = [ringmpi.Iallreduce(MPI.IN_PLACE, b) for b in bufs]
    theirs = np.full(5, RANK + 1.0)
    reqs.append(WORLD.Iallreduce(MPI.IN_PLACE, theirs))
    # a blocking call on the same communicator runs after the ones started before it
    blocking = inputs(100, k=9)
    ringmpi.Allreduce(MPI.IN_PLACE, blocking)
    more = inputs(1 << 14, k=4)
    reqs.append(ringmpi.Comm(WORLD).Iallreduce(None, more))
    MPI.Request.Waitall(reqs)
    problems = []
    for k, (n, b) in enumerate(zip([7, 1 << 16, 3, 1 << 12, 0], bufs, strict=True)):
        problems += mismatch(f"call {k}", b, expected(n, k=k))
    problems += mismatch("MPI's request", theirs, np.full(5, SIZE * (SIZE + 1) / 2))
    problems += mismatch("blocking", blocking, expected(100, k=9))
    problems += mismatch("via Comm", more, expected(1 << 14, k=4))
    problems += [] if all(r == MPI.REQUEST_NULL for r in reqs) else ["a request is not null"]
    agree(WORLD, problems)


def test_test_completes_it():
    buf = inputs(1 << 15)
    req = ringmpi.Iallreduce(MPI.IN_PLACE, buf)
    start, done = time.monotonic(), False
    while not done and time.monotonic() - start < 60:
        done = req.Test()
    problems = [] if done else ["Test never returned True"]
    problems += [] if req == MPI.REQUEST_NULL else ["the request is not null after Test"]
    agree(WORLD, problems + mismatch("Test", buf, expected(1 << 15)))


def test_a_trace_counts_the_calls_started_inside_it():
    count = 64 * SIZE  # even chunks: the ring's closed form is exact
    buf = inputs(count, "float32")
    with ringmpi.trace() as t:
        req = ringmpi.Iallreduce(MPI.IN_PLACE, buf, algorithm="ring")
    before = ringmpi.Iallreduce(MPI.IN_PLACE, inputs(count, "float32"), algorithm="ring")
    with ringmpi.trace() as later:  # opened after: counts nothing of the calls before it
        req.Wait()
        before.Wait()
    want = (1, 2 * (SIZE - 1) * count // SIZE * 4, 2 * (SIZE - 1))
    got = (t.calls, t.bytes_sent, t.steps)
    problems = [] if got == want else [f"(calls, bytes, steps) {got}, expected {want}"]
    problems += [] if later.calls == 0 and not later.events else [f"later counted {later}"]
    agree(WORLD, problems + mismatch("traced", buf, expected(count, "float32")))


def test_bad_input_raises_at_the_call():
    recv = np.ones(4)
    recv.flags.writeable = False
    with pytest.raises(ValueError, match="recvbuf is read-only"):
        ringmpi.Iallreduce(MPI.IN_PLACE, recv)
    with pytest.raises(TypeError, match="same"):
        ringmpi.Iallreduce(np.ones(4), np.ones(4, np.float32))


def test_what_ringmpi_cannot_reduce_goes_to_the_library():
    x = np.arange(5, dtype=np.longdouble) + RANK
    req = ringmpi.Iallreduce(MPI.IN_PLACE, x)
    problems = [] if type(req) is MPI.Request else [f"a {type(req).__name__}"]
    req.Wait()
    want = SIZE * np.arange(5, dtype=np.longdouble) + SIZE * (SIZE - 1) // 2
    problems += [] if np.array_equal(x, want) else [f"long double: got {x}, expected {want}"]
    agree(WORLD, problems)


@pytest.mark.skipif(SIZE < 2, reason="a rank must be late")
def test_a_timeout_surfaces_at_wait_naming_the_rank():
    comm = WORLD.Dup()  # a timeout breaks the communicator off: a fresh one (kept)
    late = SIZE - 1
    buf = inputs(1000)
    ringmpi.Allreduce(MPI.IN_PLACE, buf, comm=comm)  # sets the communicator up
    buf = inputs(1000)
    message = None
    if late == RANK:
        time.sleep(1.5)  # the others have given up by now
    req = ringmpi.Iallreduce(MPI.IN_PLACE, buf, comm=comm, timeout=1.0)
    try:
        req.Wait()
    except ringmpi.RingMPIError as e:
        message = str(e)
    problems = []
    if late != RANK and (message is None or f"rank {late}" not in message
                         or "(timeout)" not in message):  # fmt: skip
        problems.append(f"the timeout does not name rank {late}: {message!r}")
    WORLD.Barrier()
    agree(WORLD, problems)


def test_the_progress_thread_ends_with_the_communicator(settings):
    settings(progress="thread")
    comm = WORLD.Dup()
    buf = inputs(1 << 18)  # 2 MiB: ringmpi's, not the library's, in every family
    ringmpi.Iallreduce(MPI.IN_PLACE, buf, comm=comm).Wait()
    threads = _progress.threading.enumerate()
    before = sum(1 for t in threads if t.name == "ringmpi-progress")
    comm.Free()
    after = sum(1 for t in _progress.threading.enumerate() if t.name == "ringmpi-progress")
    problems = [] if after == before - 1 else [f"progress threads {before} -> {after}"]
    agree(WORLD, problems + mismatch("freed", buf, expected(1 << 18)))


@pytest.mark.parametrize("progress", ["thread", "wait"])
def test_a_repeat_never_overtakes_a_queued_call(settings, progress):
    settings(progress=progress)
    comm = WORLD.Dup()  # a queue of its own, made under this setting
    buf = inputs(64)
    for k in range(3):  # remembered: from the third call on, a repeat
        buf[...] = inputs(64, k=k)
        ringmpi.Allreduce(MPI.IN_PLACE, buf, comm=comm)
    big = inputs(1 << 18, k=7)  # 2 MiB: ringmpi's own request in every family
    queued = ringmpi.Iallreduce(MPI.IN_PLACE, big, comm=comm)
    buf[...] = inputs(64, k=3)
    ringmpi.Allreduce(MPI.IN_PLACE, buf, comm=comm)  # the queued call runs first
    problems = [] if queued._job.done else ["the blocking repeat overtook the queued call"]
    queued.Wait()
    for k in range(4, 6):  # and the repeat comes back once nothing is queued
        buf[...] = inputs(64, k=k)
        ringmpi.Allreduce(MPI.IN_PLACE, buf, comm=comm)
    comm.Free()
    problems += mismatch("queued", big, expected(1 << 18, k=7))
    agree(WORLD, problems + mismatch("repeat", buf, expected(64, k=5)))


def _started_in_c() -> bool:
    """Whether the last start left a call started in C (not yet carried out)."""
    holder = _direct._state.get("holder")
    return holder is not None and bool(holder[_direct.DEFERRED])


def _starts_in_c(buf: np.ndarray, comm: MPI.Intracomm) -> bool:
    """Whether the C table remembers the blocking call of ``buf`` on ``comm`` with its
    cells and MPI carries generalized requests' polls (MPIX: MPICH, Intel MPI)."""
    holder = _direct._state.get("holder")
    if holder is None or not _progress._MPIX.usable():
        return False
    return holder[_direct._HEADER + _direct._WIDTH * _direct.slot(buf, comm) + _direct.RECV] == id(
        buf
    )


N = 1 << 18  # 2 MiB of float64: ringmpi's own request in every family


def _starts(kind: str, buf: np.ndarray, comm: MPI.Intracomm):
    """A function that starts an in-place SUM of ``buf`` on ``comm`` (``kind``:
    ``Iallreduce``, or ``Allreduce_init``'s request started again) and returns its
    request."""
    if kind == "Iallreduce":
        return lambda: ringmpi.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM, comm)
    persistent = ringmpi.Allreduce_init(MPI.IN_PLACE, buf, MPI.SUM, comm)

    def start() -> MPI.Request:
        persistent.Start()
        return persistent

    return start


@pytest.mark.parametrize("kind", ["Iallreduce", "Allreduce_init"])
def test_a_repeated_start_runs_in_c_and_completes_exactly(settings, kind):
    settings(progress="wait")
    comm = WORLD.Dup()  # a queue of its own, carried out by the completion calls
    buf = np.empty(N)
    start = _starts(kind, buf, comm)
    problems, in_c = [], []
    for k in range(8):
        buf[...] = inputs(N, k=k)
        refs = sys.getrefcount(buf)
        req = start()
        in_c.append(_started_in_c())
        req.Wait()
        problems += mismatch(f"call {k}", buf, expected(N, k=k))
        problems += [] if req == MPI.REQUEST_NULL else [f"call {k}: the request is not null"]
        problems += [] if sys.getrefcount(buf) == refs else [f"call {k}: a reference kept"]
        if kind == "Iallreduce":  # nothing else holds a completed request
            gone = weakref.ref(req)
            del req
            problems += [] if gone() is None else [f"call {k}: the request kept"]
    # The first start is checked in Python; from the second or third on (once the job's
    # blocking call is remembered: at once where counted off auto's lead's calls) they start in C.
    if _starts_in_c(buf, comm):
        problems += [] if not in_c[0] and in_c[2:] == [True] * 6 else [f"started in C: {in_c}"]
    if kind == "Allreduce_init":
        start().Wait()
        start().Free()
    comm.Free()
    agree(WORLD, problems)


def test_a_call_started_in_c_runs_before_later_calls(settings):
    settings(progress="wait")
    comm = WORLD.Dup()
    buf, small = np.empty(N), np.empty(64)
    for k in range(4):  # both remembered: buf's start and small's blocking call from C
        buf[...] = inputs(N, k=k)
        ringmpi.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM, comm).Wait()
        small[...] = inputs(64, k=k)
        ringmpi.Allreduce(MPI.IN_PLACE, small, MPI.SUM, comm)
    problems = []
    buf[...] = inputs(N, k=5)
    started = ringmpi.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM, comm)
    in_c = _started_in_c()
    small[...] = inputs(64, k=6)
    ringmpi.Allreduce(MPI.IN_PLACE, small, MPI.SUM, comm)  # the started call runs first
    problems += [] if started._job is not None and started._job.done else ["overtaken"]
    started.Wait()
    problems += mismatch("started, then a blocking call", buf, expected(N, k=5))
    problems += mismatch("the blocking call", small, expected(64, k=6))
    buf[...] = inputs(N, k=7)
    first = ringmpi.Iallreduce(MPI.IN_PLACE, buf, MPI.SUM, comm)
    small[...] = inputs(64, k=8)
    second = ringmpi.Iallreduce(MPI.IN_PLACE, small, MPI.SUM, comm)  # queued behind it
    second.Wait()  # carries the first out before it
    first.Wait()
    problems += mismatch("first of two", buf, expected(N, k=7))
    problems += mismatch("second of two", small, expected(64, k=8))
    if _starts_in_c(buf, comm) and not in_c:
        problems.append("the fifth start was not made in C")
    comm.Free()
    agree(WORLD, problems)


@pytest.mark.parametrize("kind", ["Iallreduce", "Allreduce_init"])
@pytest.mark.parametrize(
    "completion", ["Test", "Waitall", "Wait(status)", "Free the comm", "start again"]
)
def test_every_completion_carries_out_a_call_started_in_c(settings, completion, kind):
    if completion == "Waitall" and not _progress._MPIX.usable():
        pytest.skip("MPI's Waitall carries out no call of progress='wait' without MPIX")
    if completion == "start again" and kind == "Iallreduce":
        pytest.skip("a persistent request's")
    settings(progress="wait")
    comm = WORLD.Dup()
    buf = np.empty(N)
    start = _starts(kind, buf, comm)
    for k in range(4):
        buf[...] = inputs(N, k=k)
        start().Wait()
    buf[...] = inputs(N, k=9)
    req = start()
    problems = [] if _started_in_c() or not _starts_in_c(buf, comm) else ["not started in C"]
    if completion == "start again":  # an active request: an error, the call still carried out
        try:
            req.Start()
            problems.append("an active request started again")
        except ringmpi.RingMPIError as e:
            problems += [] if "is active" in str(e) else [f"started again: {e}"]
        req.Wait()
    elif completion == "Test":
        while not req.Test():
            pass
    elif completion == "Waitall":
        MPI.Request.Waitall([req])
    elif completion == "Wait(status)":
        req.Wait(MPI.Status())
    else:
        comm.Free()  # its queued calls run first
        req.Wait()
    problems += mismatch(completion, buf, expected(N, k=9))
    problems += [] if req == MPI.REQUEST_NULL else ["the request is not null"]
    problems += [] if not _started_in_c() and not _progress.pending else ["left started"]
    if kind == "Allreduce_init":
        req.Free()
    if completion != "Free the comm":
        comm.Free()
    agree(WORLD, problems)


def test_a_small_iallreduce_of_arrays_is_ringmpis_where_it_starts_in_c(settings):
    settings(progress="wait")
    comm = WORLD.Dup()
    small = _requests.own_from_bytes() > 8  # below it auto takes the library's otherwise
    x, spec, y = (np.full(1, RANK + 1.0) for _ in range(3))
    req = ringmpi.Iallreduce(MPI.IN_PLACE, x, MPI.SUM, comm)
    theirs = ringmpi.Iallreduce(MPI.IN_PLACE, [spec, MPI.DOUBLE], MPI.SUM, comm)  # not an array
    persistent = ringmpi.Allreduce_init(MPI.IN_PLACE, y, MPI.SUM, comm)
    persistent.Start()
    kinds = (isinstance(req, _progress.Request), isinstance(theirs, _progress.Request),
             persistent._library is None)  # fmt: skip
    MPI.Request.Waitall([req, theirs, persistent])
    persistent.Free()
    comm.Free()
    in_c = _progress._MPIX.usable()
    want = (in_c or not small, not small, in_c or not small)
    problems = [] if kinds == want else [f"ringmpi's (Iallreduce, spec, persistent): {kinds}"]
    for name, got in (("array", x), ("spec", spec), ("persistent", y)):
        problems += mismatch(name, got, np.full(1, SIZE * (SIZE + 1) / 2))
    agree(WORLD, problems)


def test_a_start_in_c_of_the_librarys_own_call(settings):
    if not _progress._MPIX.usable() or _direct._state.get("nonblocking") is None:
        pytest.skip("no start in C here: no MPIX generalized requests, or no builtins")
    settings(progress="wait")
    comm = WORLD.Dup()
    ctx = ringmpi._comm.context(comm)
    x = np.empty(4, np.float32)
    # the blocking call remembered as the library's MPI_Allreduce (CELL_FN 0), where no
    # counted call (whose C function a start runs uncounted) was made yet
    cells = np.array([int(MPI.IN_PLACE), _capi.handle(MPI.FLOAT), _capi.handle(MPI.SUM),
                      _capi.handle(ctx.comm), 4, _direct.number(x.dtype), 0, 0], np.int64)  # fmt: skip
    call = ringmpi.algorithms.Call(None, None, None, cells)
    _direct.install(MPI.IN_PLACE, x, MPI.SUM, comm, call, ringmpi._settings.current())
    _progress.queue(ctx)
    _direct.defer(MPI.IN_PLACE, x, MPI.SUM, comm)
    holder = _direct._state["holder"]
    counted, holder[_direct.COUNTED] = holder[_direct.COUNTED], 0
    try:
        x[...] = RANK + 1
        req = ringmpi.Iallreduce(MPI.IN_PLACE, x, MPI.SUM, comm)
        in_c = _started_in_c()
        req.Wait()
    finally:
        holder[_direct.COUNTED] = counted
    comm.Free()
    problems = [] if in_c else ["not started in C"]
    agree(
        WORLD,
        problems + mismatch("the library's", x, np.full(4, SIZE * (SIZE + 1) / 2, np.float32)),
    )
