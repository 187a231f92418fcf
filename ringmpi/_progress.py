"""Nonblocking calls: a progress thread per communicator runs them in call order.

A nonblocking call is checked on the calling thread (its errors raise there,
before any message), then queued on the communicator's progress thread, which
runs the same compiled loops as a blocking call (they release the GIL) on the
communicator's private duplicate. What the caller holds is an ``MPI.Grequest``
(:class:`Request`) that the thread completes: ``Wait``, ``Test`` and
``MPI.Request.Waitall`` take it beside MPI's own requests. A blocking call on
the same communicator first waits for the calls queued before it, so that calls
run in the order every rank made them.
"""

from __future__ import annotations

import collections
import threading
import warnings
from collections.abc import Callable
from typing import Any, Literal, overload

from mpi4py import MPI

from . import _cache, _trace

__all__ = ["Job", "Progress", "Request", "completed", "start", "threads_allowed"]


class Job:
    """One queued call: ``run()`` on the progress thread, then ``then(job)`` if given."""

    __slots__ = ("done", "error", "greq", "reported", "run", "then", "traces")

    def __init__(self, run: Callable[[], Any], then: Callable[[Job], None] | None = None):
        self.run: Callable[[], Any] | None = run
        self.then = then
        self.traces = _trace.open_here()  # a trace counts the calls started inside it
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.greq: MPI.Grequest | None = None
        self.reported = False  # the error was raised by Request.Wait/Test

    def execute(self) -> None:
        try:
            with _trace.recording_for(self.traces):
                assert self.run is not None  # a job runs once
                self.run()
        except BaseException as exc:
            self.error = exc
        self.run = None  # the arrays go as soon as the call is done
        self.done.set()
        if self.then is not None:
            self.then(self)
        if self.greq is not None:
            self.greq.Complete()

    def query(self, status: MPI.Status) -> None:
        """The Grequest's query: an error not raised by :class:`Request` raises here,
        so that MPI's own completion calls (Waitall) report it."""
        if self.error is not None and not self.reported:
            raise self.error


class Request(MPI.Grequest):
    """A ringmpi nonblocking call: an MPI generalized request its progress thread
    completes. ``Wait`` and ``Test`` raise the call's error (the blocking call's
    message); ``MPI.Request.Waitall`` and the like take it beside MPI's requests."""

    _job: Job | None = None

    def Wait(self, status: MPI.Status | None = None) -> bool:  # type: ignore[override]
        job = self._job
        if job is not None:
            job.done.wait()  # sleeps: the cores go to the progress thread
            job.reported = True
        super().Wait(status)
        self._raise(job)
        return True

    def Test(self, status: MPI.Status | None = None) -> bool:
        job = self._job
        if job is not None and not job.done.is_set():
            return False
        if job is not None:
            job.reported = True
        done = super().Test(status)
        self._raise(job)
        return done

    def wait(self, status: MPI.Status | None = None) -> None:
        self.Wait(status)

    def test(self, status: MPI.Status | None = None) -> tuple[bool, None]:
        return self.Test(status), None

    def _raise(self, job: Job | None) -> None:
        self._job = None
        if job is not None and job.error is not None:
            raise job.error


class Progress:
    """A communicator's progress thread and the calls queued on it."""

    def __init__(self) -> None:
        self._queue: collections.deque[Job | None] = collections.deque()
        self._pending = 0
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="ringmpi-progress", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cv:
            self._queue.append(job)
            self._pending += 1
            self._cv.notify_all()

    def busy(self) -> bool:
        """Whether calls are queued or running."""
        return self._pending > 0

    def on_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def drain(self) -> None:
        """Wait until every call queued so far has run (not from the thread itself)."""
        if self._pending and not self.on_thread():
            with self._cv:
                self._cv.wait_for(lambda: self._pending == 0)

    def free(self) -> None:
        """Run what is queued, then end the thread."""
        with self._cv:
            self._queue.append(None)
            self._cv.notify_all()
        if not self.on_thread():
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue)
                job = self._queue.popleft()
            if job is None:
                return
            job.execute()
            with self._cv:
                self._pending -= 1
                self._cv.notify_all()


def threads_allowed() -> bool:
    """Whether MPI was initialized with MPI_THREAD_MULTIPLE (a progress thread calls
    MPI while the program's own threads may too)."""
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


_WARNED: list[bool] = []


def warn_no_threads() -> None:
    """Once per process: nonblocking calls go to the library's MPI_Iallreduce."""
    if not _WARNED:
        _WARNED.append(True)
        warnings.warn(
            "ringmpi: MPI was initialized without MPI_THREAD_MULTIPLE (mpi4py.rc.thread_level "
            "or MPI4PY_RC_THREAD_LEVEL), which ringmpi's progress thread needs: its "
            "nonblocking calls go to the MPI library's own nonblocking collectives",
            RuntimeWarning,
            stacklevel=3,
        )


def completed() -> MPI.Grequest:
    """A request already complete (for a call that ran at once)."""
    greq = MPI.Grequest.Start()
    greq.Complete()
    return greq


@overload
def start(ctx, job: Job, request: Literal[True] = ...) -> Request: ...
@overload
def start(ctx, job: Job, request: bool) -> Request | None: ...
def start(ctx, job: Job, request: bool = True) -> Request | None:
    """Queue ``job`` on ``ctx``'s progress thread (made on first use); returns its
    request, or None when ``request`` is False (``job.then`` reports instead)."""
    if ctx.progress is None:
        ctx.progress = Progress()
    # Remembered repeats skip the wait for queued calls: forget them while any is queued
    # (a loop of nonblocking calls alone has none to forget).
    _cache.changed()
    req = None
    if request:
        job.greq = MPI.Grequest.Start(job.query)
        req = Request(job.greq)
        req._job = job
    ctx.progress.submit(job)
    return req
