"""Nonblocking calls: a queue per communicator carries them out in call order.

A nonblocking call is checked on the calling thread (its errors raise there,
before any message), then queued on the communicator's :class:`Progress`.
Who carries the queue out is the ``progress`` setting: a progress thread
(``thread``), which runs the same compiled loops as a blocking call (they
release the GIL) on the communicator's private duplicate while the program
goes on; or the program's own thread (``wait``), in the first ``Wait`` or
``Test`` on one of the queued calls' requests, in call order (a ``Test``
carries the calls up to its own on only as far as each goes without waiting
for another rank, where their algorithms can stop at a wait: :class:`Job`). ``auto`` takes
the thread where the node has a spare core for it (at least twice as many
cores as ranks) and MPI allows threads, else ``wait``: a progress thread
with no core of its own only takes turns with the program, and each turn
costs more than a small call.

What the caller holds is an MPI generalized request (:class:`Request`)
completed when the call is done: ``Wait`` and ``Test`` take it;
``MPI.Request.Waitall`` and the like take it beside MPI's own requests where
a thread carries the queue, or where MPI calls back into the queue
(MPIX_Grequest_start: MPICH, Intel MPI; :class:`_Mpix`). A blocking call on
the same communicator first carries out, or waits for, the calls queued
before it, so that calls run in the order every rank made them.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import importlib
import threading
import warnings
from collections.abc import Callable
from typing import Any, Literal, cast, overload

import numba
import numpy as np
from mpi4py import MPI
from numba import types

from . import _builtins, _host, _settings, _trace
from ._capi import (
    _library_path,
    load_acquire,
    monotonic_ns,
    mpi_grequest_complete,
    mpi_status_set_cancelled,
    mpi_status_set_elements,
    mpix_grequest_start,
    peek,
    peek32,
    poke,
    py_long,
    py_vectorcall,
)
from ._comm import context

__all__ = ["Completion", "Job", "Progress", "Request", "completed", "finish", "in_job", "mode",
           "own_cores", "progressed", "set_handle", "spare_core", "threaded", "threads_allowed",
           "warm"]  # fmt: skip


# The calls queued or running, on every communicator: a remembered call repeats
# from C or Python (ringmpi._direct, ringmpi._api) only while this is empty, since a
# repeat does not first carry out, or wait for, the calls queued before it.
pending: list[Job] = []
# How many jobs are being carried out now, on any thread (one item): a call a job
# makes below 4 MiB runs no trial of auto's tuner (ringmpi.algorithms.tuner), whose
# Python, copies and agreeing collective cost more than the call a program
# overlaps; from 4 MiB (tuner.REMEMBERED_BELOW) it takes its turn in the class's
# trials as a blocking call does (its calls, in call order on every rank, are no
# remembered call's steps: a class being tried remembers none of that size).
in_job = [0]

# How long the progress thread polls for the next call before it sleeps, and a Wait
# for the thread to finish a call before it sleeps, in nanoseconds, where the thread
# has a spare core (spare_core): a thread asleep on a condition takes tens of
# microseconds to wake (a start would wake it, the thread would wake the Wait).
_POLL_NS = 1_000_000
# How long a call stays queued before the polling thread takes it, in nanoseconds:
# a Wait right after the start takes it first, without waking the thread.
_GRACE_NS = 20_000
# A threaded queue's counters (Progress._counts): calls queued, taken, finished.
_QUEUED, _TAKEN, _FINISHED = 0, 1, 2
_TRACES, _NO_TRACES = _trace._active, ()


def _none_started() -> None:
    """(Where no nonblocking call starts in C.)"""


# Hands the nonblocking call started in C and not yet carried out (ringmpi._direct's,
# whose mark is in pending) to its communicator's queue, a Job: before a call is
# queued, a queue drained or freed, or a completion call takes that call's request
# in Python. ringmpi._requests sets it.
settle: Callable[[], None] = _none_started


@numba.njit(cache=True, nogil=True)
def _next(counts, grace, ns):
    """Whether, within ``ns`` nanoseconds, a call came that stayed queued and untaken,
    no call running, for ``grace`` nanoseconds (polling without the GIL: a caller's
    Wait that takes it meanwhile leaves the thread without the GIL)."""
    start = monotonic_ns()
    since = 0
    while True:
        now = monotonic_ns()
        taken = load_acquire(counts, _TAKEN)
        if load_acquire(counts, _QUEUED) > taken and load_acquire(counts, _FINISHED) == taken:
            if since == 0:
                since = now
            elif now - since >= grace:
                return True
        else:
            since = 0
        if now - start > ns:
            return False


@numba.njit(cache=True, nogil=True)
def _poll(counts, at, target, ns):
    """Whether ``counts[at]`` reached ``target`` within ``ns`` nanoseconds, polling
    without the GIL."""
    start = monotonic_ns()
    while load_acquire(counts, at) < target:
        if monotonic_ns() - start > ns:
            return False
    return True


def _no_library(persistent: bool) -> Any:
    raise RuntimeError("this call has no request of the library's: ringmpi's own runs it")


class Job:
    """A collective checked once, by a blocking, nonblocking or persistent call, and
    carried out each time it is started (:meth:`start`): ``run()`` carries it out on
    the buffers' contents at the time, then ``then(job)`` if given, then its request
    completes. Where ``run`` is None, ``library(persistent)`` makes the library's own
    request for it (its ``*_init`` or its nonblocking call). A call that can stop at
    a wait has ``find`` too, which finds (at the first test) its ``step(wait)``: a
    test carries it on with ``step(False)`` as far as it goes without waiting for
    another rank, a wait to its end with ``step(True)``. A start does no work: on a
    core that computes meanwhile, work done at the start is moved, not hidden, and
    costs the start its speed. ``nbytes`` is what auto's choice goes by."""

    __slots__ = ("cells", "comm", "complete", "ctx", "done", "error", "find", "library", "name",
                 "nbytes", "number", "queue", "reported", "run", "settled", "step", "stepped",
                 "then", "timeout", "traces")  # fmt: skip

    def __init__(self, run: Callable[[], Any] | None, then: Callable[[Job], None] | None = None,
                 find: Callable[[], Any] | None = None, *, name: str = "", comm: Any = None,
                 ctx: Any = None, timeout: float = 0.0,
                 library: Callable[[bool], Any] = _no_library, nbytes: int = 0):  # fmt: skip
        self.run = run  # ringmpi's call, None where it is the library's
        self.then = then
        self.find = find  # () -> step(wait) -> whether done, or None: no step for its arrays
        self.name = name  # the collective, as MPI names it
        self.comm = comm  # the user's communicator
        self.ctx = ctx  # the communicator's Context, once known
        self.timeout = timeout  # seconds a rank waits without progress (0: for ever)
        self.library = library
        self.nbytes = nbytes
        # Whether auto's tuner has settled this call on the library's own collective
        # (a persistent request then starts the library's), where it can tell.
        self.settled: Callable[[], bool] | None = None
        self._arm()

    def _arm(self) -> None:
        """Ready for a start: what one start and its completion leave."""
        self.step: Any = self.find  # once begun (stepped), step(wait) itself
        self.stepped = False  # begun by step: step alone carries it on
        # a trace counts the calls started inside it
        self.traces = _trace.open_here() if _TRACES else _NO_TRACES
        self.error: BaseException | None = None
        self.done = False
        self.complete: Callable[[], Any] | None = None  # completes its request
        self.cells = 0  # else the address of its request's cells (_Mpix) that complete it
        self.reported = False  # the error was raised by Request.Wait/Test
        self.queue: Progress | None = None  # where it is queued
        self.number = 0  # its place in a threaded queue (1, 2, ...)

    @overload
    def start(self, into: Any = ..., request: Literal[True] = ..., cells: int = ...
              ) -> Request: ...  # fmt: skip
    @overload
    def start(self, into: Any, request: bool, cells: int = ...) -> Request | None: ...
    def start(self, into: Any = None, request: bool = True, cells: int = 0) -> Any:
        """Queue the call on its communicator's progress queue (made on first use);
        returns its request (``into``, a :class:`Completion`, where given; ``cells``:
        the generalized request already begun into it, in C), or None when
        ``request`` is False (``then`` reports instead)."""
        if pending and not cells:  # (a call started in C marks it)
            settle()
        ctx = self.ctx
        if ctx is None:
            ctx = self.ctx = context(self.comm, self.timeout)
        if self.queue is not None or self.traces or _TRACES:  # (started before, or traced)
            self._arm()
        progress = queue(ctx)
        req = None
        if request:
            req = Request() if into is None else into
            if cells:
                self.cells = cells
                _MPIX._jobs[cells] = self
            elif not _MPIX.usable():
                greq = MPI.Grequest.Start(self.query)
                self.complete = greq.Complete
                set_handle(req, greq.handle)
            else:
                _MPIX.start(self, req)
            req._job = self
        progress.submit(self)
        return req

    def execute(self) -> None:
        queue = self.queue
        if queue is not None and not queue.threaded and pending[0] is self:
            # Carried out here, the first of the queued: a blocking call it makes may
            # repeat from C (nothing queued before it is left to overtake).
            pending.pop(0)
            queue = None
        try:
            call = self.run
            assert call is not None  # (the library's call is the library's request)
            if self.stepped:
                call = self._to_end
            elif queue is not None and self.step is not None and not self.traces and not _TRACES:
                # Where its blocking call cannot repeat from C (calls are queued: the
                # progress thread), the remembered call's compiled step, to its end.
                step = self.step()
                if step is not None:
                    self.step, self.stepped, call = step, True, self._to_end
            in_job[0] += 1
            try:
                if self.traces or _TRACES:
                    with _trace.recording_for(self.traces):
                        call()
                else:
                    call()
            finally:
                in_job[0] -= 1
        except BaseException as exc:
            self.error = exc
        self.ended(queue is not None)

    def _to_end(self) -> None:
        step = self.step
        assert step is not None  # begun by step
        step(True)

    def ended(self, pending_still: bool) -> None:
        """Done: out of ``pending`` (where it still is), its request completed."""
        self.step = None
        if pending_still:
            pending.remove(self)
        self.done = True
        if self.then is not None:
            self.then(self)
        if self.complete is not None:
            self.complete()
        elif self.cells:
            _MPIX._jobs.pop(self.cells, None)  # (only its request holds it now)
            _grequest_end(self.cells, self.error is not None and not self.reported)

    def report_here(self) -> None:
        """Its error (if any) is raised by ringmpi's Wait or Test, not MPI's."""
        self.reported = True
        if self.cells and self.error is not None:
            _grequest_reported(self.cells)

    def query(self, status: MPI.Status) -> None:
        """The Grequest's query: an error not raised by :class:`Request` raises here,
        so that MPI's own completion calls (Waitall) report it."""
        if self.error is not None and not self.reported:
            raise self.error


class Completion:
    """``Wait`` and ``Test`` for a request whose call a :class:`Job` carries out (mixed
    into MPI's request classes): they carry it out, or wait for it, then complete the
    MPI request, and raise the call's error (the blocking call's message)."""

    _job: Job | None = None

    def Wait(self, status: MPI.Status | None = None) -> Literal[True]:
        # finish(job), report_here and _raise inline: a completion right after a
        # computation runs from cold caches, and each call of Python costs there
        job = self._job
        if job is None:
            if pending:  # (a call started in C marks it)
                settle()
            job = self._job
        if job is not None:
            queue = job.queue
            if not job.done and queue is not None:
                if queue.threaded:
                    queue.wait(job)
                else:
                    queue._run_queued(job)
            job.reported = True
            if job.cells and job.error is not None:
                _grequest_reported(job.cells)
        MPI.Request.Wait(cast(MPI.Request, self), status)
        if job is not None and self._job is job:
            self._job = None
            if job.error is not None:
                raise job.error
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        job = self._job
        if job is None:
            if pending:  # (a call started in C marks it)
                settle()
            job = self._job
        if job is not None and not progressed(job):
            return False
        if job is not None:
            job.report_here()
        done = MPI.Request.Test(cast(MPI.Request, self), status)
        self._raise(job)
        return done

    def wait(self, status: MPI.Status | None = None) -> None:
        self.Wait(status)

    def test(self, status: MPI.Status | None = None) -> tuple[bool, None]:
        return self.Test(status), None

    def _raise(self, job: Job | None) -> None:
        if job is not None and self._job is job:
            self._job = None
            if job.error is not None:
                raise job.error


class Request(Completion, MPI.Grequest):
    """A ringmpi nonblocking call: an MPI generalized request completed when its call
    is done. ``MPI.Request.Waitall`` and the like take it beside MPI's requests."""


def finish(job: Job) -> None:
    """Return once ``job`` is done: carried out here, after the calls queued before
    it, where no thread carries its queue; else waited for, sleeping (the cores go
    to the progress thread)."""
    queue = job.queue
    if job.done or queue is None:
        return
    if queue.threaded:
        queue.wait(job)
    else:
        queue._run_queued(job)


def progressed(job: Job) -> bool:
    """Whether ``job`` is done, carrying the calls queued up to it on first where no
    thread does (a test must make progress, or a loop of tests would never end):
    :meth:`Progress.towards`."""
    queue = job.queue
    if not job.done and queue is not None and not queue.threaded:
        queue.towards(job)
    return job.done


class Progress:
    """A communicator's nonblocking calls, in call order, and who carries them out:
    a progress thread (``threaded``; a caller of :meth:`wait` or :meth:`drain` takes
    the calls the thread has not taken yet), or the callers of ``Wait``, ``Test``
    and :meth:`drain`."""

    def __init__(self, threaded: bool, poll: bool = False) -> None:
        self.threaded = threaded
        # how long the thread and a Wait poll before sleeping: only where the thread
        # has a core of its own (polling ranks and threads on too few cores take turns)
        self._poll_ns = _POLL_NS if poll else 0
        self._queue: collections.deque[Job | None] = collections.deque()
        self._pending = 0
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._running: Job | None = None  # carried out now
        self._carrier = 0  # by this thread (its ident)
        self._counts = np.zeros(3, np.int64)  # calls queued, taken, finished (_QUEUED, ...)
        if threaded:
            self._thread = threading.Thread(target=self._loop, name="ringmpi-progress",
                                            daemon=True)  # fmt: skip
            self._thread.start()

    def submit(self, job: Job) -> None:
        job.queue = self
        pending.append(job)
        if not self.threaded:  # the caller's thread alone carries the queue out
            self._queue.append(job)
            self._pending += 1
            return
        with self._cv:
            self._queue.append(job)
            self._pending += 1
            job.number = self._queued()
            self._cv.notify_all()  # (the thread may be asleep: it polls only a while)

    def _queued(self) -> int:
        """Count one more call (or the end) queued for the thread; its number."""
        counts = self._counts
        counts[_QUEUED] += 1
        return int(counts[_QUEUED])

    def busy(self) -> bool:
        """Whether calls are queued or running."""
        return self._pending > 0

    def _carrying(self) -> bool:
        """Whether this thread is carrying out one of the queued calls now (where no
        progress thread carries them, only the caller's thread does)."""
        running = self._running is not None
        return running and (not self.threaded or self._carrier == threading.get_ident())

    def on_thread(self) -> bool:
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def drain(self) -> None:
        """Return once every call queued so far has run (not from the thread itself)."""
        if pending:  # (a call started in C marks it)
            settle()
        if not self._pending or self._carrying():
            return  # (the calls queued after the running one wait for it)
        if not self.threaded:
            self._run_queued(None)
            return
        self._take(None)
        with self._cv:
            self._cv.wait_for(lambda: self._pending == 0)

    def advance(self, job: Job) -> bool:
        """Carry ``job`` on as far as it goes without waiting for another rank, where it
        can stop at a wait and is the first queued (no thread carries the queue);
        whether it could. Done, it leaves the queue."""
        queue = self._queue
        if self.threaded or self._running is not None or not queue or queue[0] is not job:
            return False
        assert job.step is not None
        # (a call started inside a trace runs whole, where the trace counts it)
        step = job.step if job.stepped else None if job.traces else job.step()
        done = None
        if step is not None:
            try:
                done = step(False)
            except BaseException as exc:
                job.error, done = exc, True
        if done is None:  # no step for its arrays: run carries it out
            job.step = None
            return False
        job.step, job.stepped = step, True
        if done:
            queue.popleft()
            self._pending -= 1
            job.ended(True)
        return True

    def towards(self, job: Job) -> None:
        """Carry the queued calls on in order, up to ``job`` (no thread carries the
        queue): each that can stop at a wait as far as it goes without waiting for
        another rank (where it is not done, the others wait behind it), any other to
        its end. A test of any started call thus never waits for a rank where the
        calls before it can stop."""
        queue = self._queue
        while not job.done and queue and self._running is None:
            head = queue[0]
            if head is None:
                return
            if head.step is None or not self.advance(head):
                self._run_queued(head)
            elif not head.done:
                return

    def wait(self, job: Job) -> None:
        """Return once ``job`` is done: carried out here, with the calls queued before
        it, each as soon as the thread runs none (waking it and waiting for it costs
        more than a small call); else once the thread has carried it out. While the
        thread runs a call, the caller polls a while for its end, then sleeps."""
        counts, cv, queue = self._counts, self._cv, self._queue
        while True:
            self._take(job)
            if job.done:
                return
            if self._poll_ns:
                _poll(counts, _FINISHED, int(counts[_TAKEN]), self._poll_ns)
            with cv:
                cv.wait_for(lambda: job.done or (self._running is None and bool(queue)
                                                 and queue[0] is not None))  # fmt: skip

    def _take(self, last: Job | None) -> None:
        """Carry out the queued calls on this thread, in order, through ``last`` (None:
        all), while the progress thread runs none of them."""
        cv, queue, counts = self._cv, self._queue, self._counts
        while last is None or not last.done:
            with cv:
                job = queue[0] if queue and self._running is None else None
                if job is None:  # (None queued: the end)
                    return
                self._running = queue.popleft()
                counts[_TAKEN] += 1
                self._carrier = threading.get_ident()
            try:
                job.execute()
            finally:
                self._ended()

    def _ended(self) -> None:
        """The running call is done: the thread or a waiting caller may take the next."""
        with self._cv:
            self._running = None
            self._pending -= 1
            self._counts[_FINISHED] += 1  # (after the job is done, its request complete)
            self._cv.notify_all()

    def free(self) -> None:
        """Run what is queued, then end the thread."""
        if pending:  # (a call started in C marks it)
            settle()
        if not self.threaded:
            self._run_queued(None)
            return
        with self._cv:
            self._queue.append(None)
            self._queued()
            self._cv.notify_all()
        if not self.on_thread():
            assert self._thread is not None
            self._thread.join()

    def _run_queued(self, last: Job | None) -> None:
        """Carry out queued calls in order, through ``last`` (None: all)."""
        while self._queue and self._running is None:
            job = self._queue.popleft()
            if job is None:
                return
            self._running = job
            try:
                job.execute()
            finally:
                self._running = None
                self._pending -= 1
            if job is last:
                return

    def _loop(self) -> None:
        counts, poll_ns, cv, queue = self._counts, self._poll_ns, self._cv, self._queue
        while True:
            # the next call, polling a while before sleeping
            polled = poll_ns and _next(counts, _GRACE_NS, poll_ns)
            with cv:
                if polled and not queue:  # a waiting caller took it: poll for the next
                    continue
                cv.wait_for(lambda: queue and self._running is None)
                job = self._running = queue.popleft()
                counts[_TAKEN] += 1
                self._carrier = threading.get_ident()
            if job is None:
                return
            job.execute()
            self._ended()


def mode(ctx) -> str:
    """Who carries out ``ctx``'s nonblocking calls: ``"thread"``, ``"wait"`` (the
    completion calls), or ``"library"`` (ringmpi hands them to the library's own
    nonblocking and persistent calls). The ``progress`` setting; under auto, a thread
    where this rank has a spare core for it (two cores of its own where it is bound
    to some, else twice as many cores on the node as ranks) and MPI allows threads;
    else the completion calls where MPI's own (``MPI.Request.Waitall``) can carry
    them out too (MPIX_Grequest_start: MPICH, Intel MPI), else the library."""
    if ctx.progress is not None:
        return "thread" if ctx.progress.threaded else "wait"
    setting = _settings.current().progress
    if setting == "wait":
        return "wait"
    if not threads_allowed():
        if setting == "thread":
            warn_no_threads()
        return "wait"
    if setting == "thread" or spare_core(ctx):
        return "thread"
    return "wait" if _MPIX.usable() else "library"


@functools.cache
def _cores() -> tuple[int, int]:
    """This process's cores and the machine's, read once (each call's mode asks)."""
    return own_cores(), _host.cores()


def own_cores() -> int:
    """The cores this process may run on: its affinity (the machine's cores where that
    is not known)."""
    return len(_host.affinity())


def spare_core(ctx) -> bool:
    """Whether this rank has a core for a progress thread: two cores of its own where
    it is bound to some, else twice as many cores on the node as ranks."""
    mine, node = _cores()
    return (mine >= 2) if mine < node else (node >= 2 * ctx.node.Get_size())


def deferrable(ctx) -> bool:
    """Whether a nonblocking call on ``ctx`` may start in C, its call made by its
    completion (ringmpi._direct.nonblocking): its queue is carried out by the
    completion calls, on generalized requests MPI's own completion calls carry
    out too (MPIX)."""
    return ctx is not None and mode(ctx) == "wait" and _MPIX.usable()


def threaded(ctx) -> bool:
    """Whether a progress thread carries out ``ctx``'s nonblocking calls."""
    return mode(ctx) == "thread"


def threads_allowed() -> bool:
    """Whether MPI was initialized with MPI_THREAD_MULTIPLE (a progress thread calls
    MPI while the program's own threads may too)."""
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


_WARNED: list[bool] = []


def warn_no_threads() -> None:
    """Once per process: the progress setting asks for a thread MPI does not allow."""
    if not _WARNED:
        _WARNED.append(True)
        warnings.warn(
            "ringmpi: MPI was initialized without MPI_THREAD_MULTIPLE (mpi4py.rc.thread_level "
            "or MPI4PY_RC_THREAD_LEVEL), which a progress thread needs: ringmpi's nonblocking "
            "calls are carried out in Wait and Test instead (progress='wait')",
            RuntimeWarning,
            stacklevel=3,
        )


def completed() -> MPI.Grequest:
    """A request already complete (for a call that ran at once)."""
    greq = MPI.Grequest.Start()
    greq.Complete()
    return greq


def queue(ctx) -> Progress:
    """``ctx``'s progress queue, made on first use."""
    progress = ctx.progress
    if progress is None:
        threaded = mode(ctx) == "thread"
        progress = ctx.progress = Progress(threaded, poll=threaded and spare_core(ctx))
    return progress


# mpi4py's C API: the address of a Request object's MPI_Request handle.
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_HANDLE_AT = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.py_object)(
    _capsule_pointer(MPI.__pyx_capi__["PyMPIRequest_Get"], b"MPI_Request *(PyObject *)")
)
_HANDLE = {4: ctypes.c_uint32, 8: ctypes.c_uint64}[MPI._sizeof(MPI.Request)]
_BITS = (1 << 8 * ctypes.sizeof(_HANDLE)) - 1


def _handle_offset() -> int:
    """Where in a Request object (of any class: its C part comes first) the handle lies."""
    probe = MPI.Request()
    return _HANDLE_AT(probe) - id(probe)


_HANDLE_OFFSET = _handle_offset()


def set_handle(request: MPI.Request, handle: int) -> None:
    """Make ``request`` hold MPI handle ``handle``."""
    _HANDLE.from_address(id(request) + _HANDLE_OFFSET).value = handle & _BITS


# A generalized request's cells (int64), whose address is its extra_state: what the
# compiled query and free functions read and write, with no Python between; the
# request's handle, which completes it; and, for a call started in C and not yet
# carried out (ringmpi._direct's deferred call), the call: the address of its cells,
# its source, destination and count, the objects it holds a reference to (the
# Request, recvbuf, sendbuf, and what keeps the cells: its entry's), and the
# callable that raises its error.
(_FLAGS, _BYTE, _ERR_OTHER, _HANDLE_CELL, REQ_RUN, REQ_SBUF, REQ_RBUF, REQ_COUNT, REQ_SELF,
 REQ_RECV, REQ_SEND, REQ_KEPT, REQ_RAISE, _SLOT) = range(14)  # fmt: skip  # _SLOT: cells a request
_FAILED, _FREED = 1, 2  # _FLAGS' bits: an error for MPI to raise; MPI freed the request
_CHUNK = 1024  # requests' cells made at a time


def _greq_query(state, status):
    """The query function: an empty status, or MPI_ERR_OTHER for a failed call whose
    error was not raised by ringmpi's own Wait or Test (MPI's completion call raises)."""
    mpi_status_set_cancelled(status, 0)
    mpi_status_set_elements(status, peek(state + 8 * _BYTE), 0)
    return peek(state + 8 * _ERR_OTHER) if peek(state) & _FAILED else 0


def _greq_free(state):
    """The free function: mark the cells free (reclaimed by the next start that needs them)."""
    poke(state, peek(state) | _FREED)
    return 0


@numba.njit(cache=True)
def _grequest_begin(fns, state, at_handle, wide):
    """MPIX_Grequest_start with the five functions at ``fns`` (query, free, cancel, poll,
    wait), the cells at ``state``, the handle written at ``at_handle`` and into the
    cells; MPI's error code."""
    err = mpix_grequest_start(peek(fns), peek(fns + 8), peek(fns + 16), peek(fns + 24),
                              peek(fns + 32), state, at_handle)  # fmt: skip
    if err == 0:
        poke(state + 8 * _HANDLE_CELL, peek(at_handle) if wide else peek32(at_handle))
    return err


@numba.njit(cache=True)
def _pop_begin(stack, fns, request, offset, wide):
    """Start a generalized request into the Request object at ``request`` (its handle at
    ``offset``) on the free cells on top of ``stack`` ([count, address, ...]): the
    cells' address, 0 where the stack is empty, or minus MPI's error code."""
    n = peek(stack)
    if n == 0:
        return 0
    state = peek(stack + 8 * n)
    err = _grequest_begin(fns, state, request + offset, wide)
    if err != 0:
        return -err
    poke(stack, n - 1)
    return state


@numba.njit(cache=True)
def _pushed(stack, addresses):
    """Put ``addresses`` on ``stack`` ([count, address, ...])."""
    n = stack[0]
    for a in addresses:
        n += 1
        stack[n] = a
    stack[0] = n


@numba.njit(cache=True)
def _moved(stack, grown, cells, at):
    """Copy ``stack`` into the larger ``grown``, and point ``cells[at]`` at it."""
    grown[: stack[0] + 1] = stack[: stack[0] + 1]
    cells[at] = grown.ctypes.data


# A begin builtin's cells (see _Mpix): the stack's and the functions' addresses,
# the handle's offset in a Request object, whether a handle is 64 bits.
_B_STACK, _B_FNS, _B_OFFSET, _B_WIDE, _B_PYTHON = range(5)


def _begin_c(holder, args, nargs, kwnames):
    """The begin builtin's C function: ``begin(request)`` as :func:`_pop_begin`, an int."""
    own = peek(holder + _builtins._DATA)  # the holder array's data
    if nargs != 1 or kwnames != 0:
        return py_vectorcall(peek(own + 8 * _B_PYTHON), args, nargs, kwnames)
    return py_long(_pop_begin(peek(own + 8 * _B_STACK), peek(own + 8 * _B_FNS), peek(args),
                              peek(own + 8 * _B_OFFSET), peek(own + 8 * _B_WIDE)))  # fmt: skip


@numba.njit(cache=True)
def _grequest_end(state, failed):
    """Complete the request of the cells at ``state`` (``failed``: with an error for
    MPI's completion call to raise); MPI's error code."""
    if failed:
        poke(state, peek(state) | _FAILED)
    return mpi_grequest_complete(peek(state + 8 * _HANDLE_CELL))


@numba.njit(cache=True)
def _grequest_reported(state):
    """The call's error was raised by ringmpi's own Wait or Test: not MPI's to raise."""
    poke(state, peek(state) & ~_FAILED)


class _Mpix:
    """Generalized requests that MPI's own completion calls carry out: MPICH's (and
    Intel MPI's) ``MPIX_Grequest_start``, whose poll and wait functions MPI_Test,
    MPI_Wait and MPI_Waitall call. These functions carry out the queue up to the
    request's call, or wait for the thread that carries it out, so that
    ``MPI.Request.Waitall`` over ringmpi's requests and MPI's own completes them
    all. The start and completion, and the query and free functions that every
    completion calls, are compiled (no Python between)."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._jobs: dict[int, Job] = {}  # by the address of their cells (the extra_state)
        self._chunks: list[np.ndarray] = []

    def usable(self) -> bool:
        if self._lib is None:
            lib = ctypes.CDLL(_library_path())
            self._lib = lib if hasattr(lib, "MPIX_Grequest_start") else False
            if self._lib:
                self._make()
        return bool(self._lib)

    def _make(self) -> None:
        state, status = ctypes.c_void_p, ctypes.c_void_p
        fn = ctypes.CFUNCTYPE
        cancel = fn(ctypes.c_int, state, ctypes.c_int)
        poll = fn(ctypes.c_int, state, status)
        wait = fn(ctypes.c_int, ctypes.c_int, ctypes.POINTER(state), ctypes.c_double, status)
        self._fns = (cancel(lambda s, c: 0), poll(self._poll), wait(self._wait))
        query = numba.cfunc(types.int32(types.int64, types.int64), cache=True)(_greq_query)
        free = numba.cfunc(types.int32(types.int64), cache=True)(_greq_free)
        self._compiled = (query, free)  # kept: MPI calls their addresses
        addresses = [query.address, free.address]
        addresses += [ctypes.cast(f, ctypes.c_void_p).value or 0 for f in self._fns]
        self._fns_cells = np.array(addresses, np.int64)  # _grequest_begin's
        self._byte, self._err_other = MPI._handleof(MPI.BYTE), MPI.ERR_OTHER
        # The free cells, a stack ([count, address, ...]) that the start pops in C and
        # _refill fills; begin(request) starts a request on its top cells, a builtin
        # whose C function is compiled (no Python between), else _python_begin.
        self._stack = np.zeros(1 + _CHUNK * 4, np.int64)
        self._refilling = threading.Lock()
        cells = self._begin_cells = _builtins.holder(_B_PYTHON + 1, self._python_begin, _B_PYTHON,
                                                     _B_PYTHON)  # fmt: skip
        cells[:_B_PYTHON] = [self._stack.ctypes.data, self._fns_cells.ctypes.data,
                             _HANDLE_OFFSET, ctypes.sizeof(_HANDLE) == 8]  # fmt: skip
        self._begin = _builtins.made("begin", _begin_c, cells)

    def _refill(self) -> None:
        """Fill the stack of free cells: the cells MPI freed, else a new chunk. (The
        stack changes only in compiled calls, which hold the GIL: a start on another
        thread never sees it half changed.)"""
        with self._refilling:
            parts = []
            for chunk in self._chunks:
                flags = chunk[_FLAGS::_SLOT]
                cells = np.flatnonzero(flags & _FREED)
                flags[cells] = 0
                parts.append(chunk.ctypes.data + 8 * _SLOT * cells)
            freed = np.concatenate(parts) if parts else np.empty(0, np.int64)
            if self._jobs and freed.size:
                gone = set(freed.tolist())
                for address in [a for a in self._jobs if a in gone]:
                    del self._jobs[address]
            if not freed.size:
                chunk = np.zeros(_CHUNK * _SLOT, np.int64)
                chunk[_BYTE::_SLOT], chunk[_ERR_OTHER::_SLOT] = self._byte, self._err_other
                self._chunks.append(chunk)
                if len(self._stack) < 1 + _CHUNK * len(self._chunks):  # room for every cell
                    grown = np.zeros(len(self._stack) + _CHUNK * 4, np.int64)
                    _moved(self._stack, grown, self._begin_cells.view(np.ndarray), _B_STACK)
                    self._stack = grown
                freed = chunk.ctypes.data + 8 * _SLOT * np.arange(_CHUNK - 1, -1, -1)
            _pushed(self._stack, freed)

    def _python_begin(self, request: MPI.Request) -> int:
        """What the begin builtin does (where it cannot be made): :func:`_pop_begin`."""
        cells = self._begin_cells
        return int(_pop_begin(int(cells[_B_STACK]), int(cells[_B_FNS]), id(request),
                              _HANDLE_OFFSET, int(cells[_B_WIDE])))  # fmt: skip

    def start(self, job: Job, request: MPI.Request) -> None:
        """Start a generalized request for ``job`` into ``request`` (its handle)."""
        address = self._begin(request)
        if address == 0:  # no free cells at hand
            self._refill()
            address = self._begin(request)
        if address < 0:
            raise MPI.Exception(-address)
        self._jobs[address] = job
        job.cells = address

    def _job(self, address: int | None) -> Job | None:
        """The job of the request whose cells are at ``address`` (one started in C,
        handed to its queue first)."""
        job = self._jobs.get(address or 0)
        if job is None:
            if pending:  # (a call started in C marks it)
                settle()
            job = self._jobs.get(address or 0)
        return job

    def _carry_out(self, address: int | None) -> int:
        job = self._job(address)
        if job is not None:
            finish(job)
        return 0

    def _poll(self, address: int | None, status: int) -> int:
        job = self._job(address)
        if job is not None:
            progressed(job)
        return 0

    def _wait(self, count: int, addresses: Any, timeout: float, status: int) -> int:
        for i in range(count):
            self._carry_out(addresses[i])
        return 0


_MPIX = _Mpix()


def warm() -> None:
    """Load what a first nonblocking call runs, compiled by Numba: the generalized
    requests' callbacks and their start (its free cells made), their completion,
    and the thread's polls; and the module of the nonblocking calls."""
    if _MPIX.usable():
        _MPIX._refill()
    i64 = numba.int64
    _grequest_end.compile((i64, numba.boolean))
    _grequest_reported.compile((i64,))
    _poll.compile((numba.int64[::1], i64, i64, i64))
    _next.compile((numba.int64[::1], i64, i64))
    importlib.import_module("ringmpi._requests")
