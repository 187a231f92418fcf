"""Nonblocking and persistent collectives: one prepared call, started and completed.

A call is prepared once from checked arguments (:class:`ringmpi._progress.Job`, as
the blocking halves prepare theirs): either the MPI library's own
persistent request (small buffers, which the library's log-depth call serves
best; what ringmpi cannot reduce; MPI without MPI_THREAD_MULTIPLE), or a
ringmpi algorithm that each start queues on the communicator's progress
thread (:mod:`ringmpi._progress`). Starting never
waits for another rank. ``Iallreduce`` & co. start a prepared call once;
``Allreduce_init`` & co. return a :class:`Prequest` that starts it again and
again, as MPI-4's persistent collectives do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from . import _api, _direct, _halves, _progress, _repeat, _settings, _trace, algorithms
from ._comm import check_comm, context
from ._errors import RingMPIError
from ._progress import Job
from .kernels import AVG, Reduction

__all__ = ["Allgather_init", "Allreduce_init", "Iallgather", "Iallreduce", "Ireduce_scatter",
           "Ireduce_scatter_block", "Prequest", "Reduce_scatter_block_init",
           "Reduce_scatter_init", "start", "started"]  # fmt: skip

# Below this many bytes auto's nonblocking or persistent call is the library's own
# request, by MPI family, unless its repeats start in C: a request of ringmpi's made
# in Python costs 5.5-10.3 us more than its blocking call up to 256 KiB, which
# MPICH's own requests outweigh from 64 KiB on, Intel MPI's only from 2 MiB (at 1 MiB
# its own cost 6-14 % less than ringmpi's; 2 ranks, docs/performance.md); others
# (Open MPI), 1 MiB.
OWN_FROM_BYTES = {"MPICH": 64 << 10, "Intel": 2 << 20}
_OWN_FROM_OTHERS = 1 << 20
_own_from: list[int] = []  # this process's, once known


def own_from_bytes() -> int:
    """Auto's smallest nonblocking or persistent call that is ringmpi's own, in bytes,
    under this MPI family."""
    if not _own_from:
        version = MPI.Get_library_version()
        found = [n for family, n in OWN_FROM_BYTES.items() if version.startswith(family)]
        _own_from.append(found[0] if found else _OWN_FROM_OTHERS)
    return _own_from[0]


_TRACES, _IN_PLACE, _PENDING = _trace._active, MPI.IN_PLACE, _progress.pending


def _own(comm: MPI.Intracomm, nbytes: int, op: Any, algorithm: str, timeout: float,
         red: Reduction | None = None, ordered: bool = False, validate: bool = False,
         in_c: bool = False) -> bool:  # fmt: skip
    """Whether ringmpi's call, not the library's request, carries out a call of ``nbytes``
    of ``red`` it can run (:func:`_own_known`, else whether a thread or the
    completion calls can carry it out: :func:`_progress.mode`): under auto, from
    :func:`own_from_bytes`, or at every size where its repeats start in C
    (``in_c``: an all-reduce of arrays that may, carried out by the completion
    calls on MPIX requests: :func:`ringmpi._direct.nonblocking`)."""
    known = _own_known(nbytes, op, algorithm, timeout, red, ordered, validate)
    if known is not None:
        return known
    mode = _progress.mode(context(comm, timeout))
    if mode == "library":
        return False
    return nbytes >= own_from_bytes() or (in_c and mode == "wait" and _progress._MPIX.usable())


def _own_known(nbytes: int, op: Any, algorithm: str, timeout: float, red: Reduction | None,
               ordered: bool, validate: bool) -> bool | None:  # fmt: skip
    """Whose a call of ``nbytes`` of ``red`` is, where that does not depend on who can
    carry calls out (None where it does). The algorithm is the argument, else the
    ``algorithm`` setting, as for the blocking call: "mpi" never, a named one always.
    Under auto, ringmpi's call wherever the blocking call would not run the
    library's: with a timeout (which the library's request cannot honour),
    validation, the rank-order fold of ``ordered`` (reproducible) floating data,
    AVG, and reductions whose answer the library's call does not give
    (:func:`~ringmpi.algorithms.library_agrees`)."""
    settings = _settings.current()
    if algorithm == "auto":
        algorithm = settings.algorithm
    if algorithm != "auto":
        return algorithm != "mpi"
    if (op is AVG or timeout or validate or not algorithms.library_agrees(red)
            or (ordered and red is not None and algorithms.order_matters(red))):  # fmt: skip
        return True
    return None


class Prequest(_progress.Completion, MPI.Prequest):
    """A persistent collective that runs ringmpi's algorithm: ``Start`` it, complete it
    with ``Wait`` or ``Test``, start it again, as often as wanted; ``Free`` it at the
    end. Between a start and its completion the buffers are the call's; between a
    completion and the next start their contents may change.

    ``ringmpi.Prequest.Startall`` starts a list that mixes these with MPI's own
    persistent requests; MPI's ``Startall`` cannot start ringmpi's. ``MPI.Request.Waitall``
    and the like complete them beside MPI's own requests, except under
    ``progress="wait"`` with Open MPI (:mod:`ringmpi._progress`)."""

    # The addresses of an all-reduce's sendbuf, recvbuf, op and comm (an int64 array),
    # where its starts may be made in C (ringmpi._direct.persistent); unset otherwise.
    __slots__ = ("_objects",)
    _objects: np.ndarray
    _call: Job | None = None
    _library: Any = None  # the library's persistent request, once auto settled on it

    @classmethod
    def made(cls, call: Job) -> Prequest:
        """The persistent request of ``call``: one of these, which starts the library's
        own persistent request where it is the library's call."""
        request = cls()
        request._call = call
        if call.run is None:
            request._settle(call.library(True))
        return request

    def _settle(self, library: MPI.Prequest) -> None:
        """Start the library's persistent request ``library`` from now on, and complete
        as it."""
        self._library, self._job = library, None
        _progress.set_handle(self, library.handle)

    def Start(self) -> None:
        if _PENDING:  # this request's start made in C, if any: its job now
            _progress.settle()
        library = self._library
        if library is not None:  # the library's own request: it alone starts
            if _TRACES:
                _trace.record_call("mpi")
            MPI.Prequest.Start(library)
            return
        call = self._call
        if call is None:
            raise RingMPIError("Start: the request was freed")
        if self._job is not None and self:  # started, not completed by a Wait or Test (MPI's too)
            raise RingMPIError(f"Start: this {call.name} request is active: complete it "
                               "(Wait, Test) before starting it again")  # fmt: skip
        if call.settled is not None and call.settled():
            # The request keeps the library's persistent request from now on, as an
            # MPI persistent collective keeps the algorithm it was made with.
            self._settle(call.library(True))
            self.Start()
            return
        call.start(self)

    @classmethod
    def Startall(cls, requests: list[MPI.Prequest]) -> None:
        """Start every request: ringmpi's own and MPI's alike."""
        theirs = []
        for request in requests:
            if isinstance(request, Prequest):
                request.Start()
            else:
                theirs.append(request)
        if theirs:
            MPI.Prequest.Startall(theirs)

    def Free(self) -> None:
        """Release the request (completing a started call first)."""
        if _PENDING:
            _progress.settle()
        if self._job is not None:
            self.Wait()
        if self._library is not None:
            MPI.Prequest.Free(self._library)
        self._library = None
        _progress.set_handle(self, MPI.REQUEST_NULL.handle)
        self._call = None


def started(call: Job) -> MPI.Request:
    """Start ``call`` once: its request (a nonblocking collective)."""
    if call.run is None:
        if _trace._active:
            _trace.record_call("mpi")
        return call.library(False)
    return call.start()


# --- the collectives ------------------------------------------------------------------


class Decided(NamedTuple):
    """What was checked and decided for a nonblocking or persistent all-reduce on some
    objects: kept in their :class:`ringmpi._repeat.Entry`, beside their blocking call,
    so that a later call on the same ones takes it."""

    nbytes: int  # recvbuf's bytes
    op: Any  # the reduction as MPI takes it
    comm: Any  # the checked communicator
    timeout: float
    own: bool  # ringmpi's run, not the library's request
    keywords: dict[str, Any]  # the blocking call's keywords that differ from auto
    ctx: Any  # the communicator's Context, where ringmpi's (its progress queue)


def _decided(sendbuf: Any, recvbuf: Any, args: tuple) -> Decided:
    """What was checked and decided for a nonblocking or persistent all-reduce on these
    very objects (``sendbuf`` MPI.IN_PLACE: in place; ``args``: (op, comm, algorithm,
    validate, timeout, reproducible), op not None): remembered, or checked now."""
    entry = _repeat.found(sendbuf, recvbuf, args)
    if entry is not None and entry.started is not None and entry.started.nbytes == recvbuf.nbytes:
        return entry.started
    op, comm, algorithm, validate, timeout, reproducible = args
    call = _api._parse(sendbuf, recvbuf, op, comm, algorithm, validate, timeout, reproducible)
    given = {"algorithm": algorithm, "validate": validate, "timeout": timeout,
             "reproducible": reproducible}  # fmt: skip
    keywords = {k: v for k, v in given.items() if v is not None and v != "auto"}
    own, ctx = False, None
    arrays = isinstance(recvbuf, np.ndarray) and (
        sendbuf is MPI.IN_PLACE or isinstance(sendbuf, np.ndarray)
    )
    if not call.library:
        assert call.recv is not None and call.red is not None
        assert isinstance(call.comm, MPI.Intracomm)
        own = _own(call.comm, call.nitems * call.recv.itemsize, op, algorithm, call.timeout,
                   call.red, call.ordered, call.validate, arrays and args[2:] == _AUTO)  # fmt: skip
        ctx = context(call.comm, call.timeout) if own else None
    decided = Decided(-1, op, call.comm, call.timeout, own, keywords, ctx)
    if arrays:
        decided = decided._replace(nbytes=recvbuf.nbytes)
        _repeat.keep(sendbuf, recvbuf, args, decided)
    return decided


def _job(decided: Decided, sendbuf: Any, recvbuf: Any, args: tuple,
         then: Callable[[Job], None] | None = None) -> Job:  # fmt: skip
    """ringmpi's call of ``decided`` on these objects: carried out as the blocking call
    given (where it repeats, the arrays' checks and auto's choice are remembered, and
    it runs from C); its step that of the call remembered for them (:func:`_step`)."""
    run = functools.partial(_api.Allreduce, sendbuf, recvbuf, decided.op, args[1],
                            **decided.keywords)  # fmt: skip
    return Job(run, then, functools.partial(_step, sendbuf, recvbuf, args), name="Allreduce",
               comm=decided.comm, ctx=decided.ctx, timeout=decided.timeout,
               nbytes=decided.nbytes)  # fmt: skip


def _allreduce(sendbuf: Any, recvbuf: Any, op: Any, comm: Any, algorithm: str,
               validate: bool | None, timeout: float | None,
               reproducible: bool | None) -> Job:  # fmt: skip
    send = _IN_PLACE if sendbuf is None else sendbuf
    args = (MPI.SUM if op is None else op, comm, algorithm, validate, timeout, reproducible)
    decided = _decided(send, recvbuf, args)

    def library(persistent: bool) -> MPI.Request:
        make = MPI.Comm.Allreduce_init if persistent else MPI.Comm.Iallreduce
        return make(decided.comm, send, recvbuf, decided.op)

    if decided.own:
        call = _job(decided, send, recvbuf, args)
    else:
        call = Job(None, name="Allreduce", comm=decided.comm, timeout=decided.timeout)
    call.library = library
    return call


def _step(sendbuf: Any, recvbuf: Any, args: tuple) -> Callable[[bool], bool | None] | None:
    """The step of a started all-reduce: that of the blocking call remembered for these
    very objects (once it repeated, with auto settled), where its algorithm can stop at
    a wait; None otherwise."""
    entry = _repeat.found(sendbuf, recvbuf, args)
    recv, send = recvbuf, sendbuf  # (the arrays, as the checks below leave them typed)
    in_place = send is MPI.IN_PLACE
    if (
        entry is None
        or entry.call.step is None
        or _TRACES
        or not recv.flags.carray
        or (not in_place and not send.flags.c_contiguous)
    ):  # fmt: skip
        return None
    work = recv if recv.ndim == 1 else recv.reshape(-1)
    source = work if in_place else (send if send.ndim == 1 else send.reshape(-1))
    return functools.partial(entry.call.step, work, source)


def Iallreduce(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM, comm: MPI.Intracomm | None = None,
               *, algorithm: str = "auto", validate: bool | None = None,
               timeout: float | None = None, reproducible: bool | None = None
               ) -> MPI.Request:  # fmt: skip
    """Start :func:`~ringmpi.Allreduce` and return its request, like ``comm.Iallreduce``.

    The arguments are checked here (errors raise before any message; a call on the
    same objects as an earlier one takes what was checked then); the call is then
    carried out in the order the calls were made, by a progress thread or by the
    completion calls (the ``progress`` setting). ``Wait``/``Test`` on the request
    (or ``MPI.Request.Waitall`` among MPI's own requests) complete it, and raise its
    error (a timeout, ranks that disagree) with the blocking call's message.
    Leave the buffers alone until then. A blocking call on the same communicator
    first waits for the nonblocking ones started before it. A call on the very
    objects of an earlier one, with ``op`` and ``comm`` alone, starts in compiled
    code where the completion calls carry it out (MPICH, Intel MPI) and its
    ``Wait()`` makes it there. Under auto, buffers below :func:`own_from_bytes`
    (64 KiB under MPICH, 2 MiB under Intel MPI, 1 MiB under the others; not arrays
    whose calls start so: ringmpi's then cost less) go to the library's own
    ``comm.Iallreduce``, as do calls ringmpi cannot reduce itself and, where
    neither a thread nor the completion calls can carry the call out, every call.
    """
    send = _IN_PLACE if sendbuf is None else sendbuf
    args = (MPI.SUM if op is None else op, comm, algorithm, validate, timeout, reproducible)
    decided = _decided(send, recvbuf, args)
    if not decided.own:  # the library's
        if _TRACES:
            _trace.record_call("mpi")
        return MPI.Comm.Iallreduce(decided.comm, send, recvbuf, decided.op)
    return _job(decided, send, recvbuf, args).start()


_AUTO = _repeat._AUTO  # the keywords of a call the C table takes


def _settle() -> None:
    """Hand the nonblocking call started in C and not yet carried out, if any
    (:func:`ringmpi._direct.take_deferred`), to its communicator's queue, the job a
    start in Python makes, its request's cells and request its own."""
    taken = _direct.take_deferred()
    if taken is None:
        return
    cells, request, send, recvbuf, op, comm = taken
    checked = check_comm(comm)
    decided = Decided(recvbuf.nbytes, op, checked, 0.0, True, {}, context(checked))
    _job(decided, send, recvbuf, (op, comm, *_AUTO)).start(request, cells=cells)


# Iallreduce's repeats start in C, and their requests' Wait completes them there.
_progress.settle = _settle
_python_iallreduce = Iallreduce
Iallreduce = _direct.nonblocking(_python_iallreduce, _progress.Request, _progress.pending)
_progress.Request.Wait = _direct.completion(  # type: ignore[method-assign]
    _progress.Completion.Wait, _progress.pending
)
_python_start = Prequest.Start
Prequest.Start = _direct.persistent(  # type: ignore[method-assign]
    _python_start, _direct.slot_offset(Prequest, "_objects"), _progress.pending
)
Prequest.Wait = _direct.completion(  # type: ignore[method-assign]
    _progress.Completion.Wait, _progress.pending
)


def start(recvbuf: Any, op: Any, comm: MPI.Intracomm | None, then: Callable[[Any], None],
          timeout: float | None = None) -> None:  # fmt: skip
    """An in-place all-reduce of ``recvbuf`` started as :func:`Iallreduce` starts it,
    which calls ``then(error)`` (None when it succeeded) once it is done: for callers
    that hold a future rather than an MPI request. Carried out at once, on this
    thread, where it is the library's or no progress thread would carry it out."""
    args = (MPI.SUM if op is None else op, comm, "auto", None, timeout, None)
    decided = _decided(_IN_PLACE, recvbuf, args)
    if not decided.own or not _progress.threaded(decided.ctx):
        try:
            _api.Allreduce(_IN_PLACE, recvbuf, decided.op, comm, timeout=timeout)
        except Exception as exc:  # the future carries it
            then(exc)
        else:
            then(None)
        return
    _job(decided, _IN_PLACE, recvbuf, args, lambda job: then(job.error)).start(None, False)


def Allreduce_init(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                   comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                   validate: bool | None = None, timeout: float | None = None,
                   reproducible: bool | None = None) -> MPI.Prequest:  # fmt: skip
    """A persistent all-reduce, like MPI-4's ``comm.Allreduce_init``: checked and
    prepared here, carried out at each ``Start`` and completed by ``Wait``/``Test``.

    Each start runs as :func:`Iallreduce` would (the same choice of ringmpi's
    algorithm or the library's persistent request); the arrays' contents may change
    between completions and the next start. See :class:`~ringmpi.Prequest`.
    """
    call = _allreduce(sendbuf, recvbuf, op, comm, algorithm, validate, timeout, reproducible)
    request = Prequest.made(call)
    send, op = (_IN_PLACE if sendbuf is None else sendbuf), (MPI.SUM if op is None else op)
    if (call.run is not None and (algorithm, validate, timeout, reproducible) == _AUTO
            and isinstance(recvbuf, np.ndarray)
            and (send is _IN_PLACE or isinstance(send, np.ndarray))):  # fmt: skip
        # (the call's run keeps the objects: their addresses stay theirs)
        request._objects = np.array([id(send), id(recvbuf), id(op), id(comm)], np.int64)
    return request


def _half(name: str, comm: Any, algorithm: str, call: Job | None,
          library: Callable[[bool], Any], op: Any = MPI.SUM) -> Job:  # fmt: skip
    """A reduce-scatter or all-gather prepared (``call``, checked once as the blocking
    call checks it, so that a start runs it with no checks): ringmpi's where it pays
    (:func:`_own`), else the library's request (``library``)."""
    if call is None:  # an inter-communicator, or what ringmpi cannot reduce
        return Job(None, name=name, comm=comm, library=library)
    call.library = library
    if not _own(check_comm(call.comm), call.nbytes, op, algorithm, call.timeout):
        call.run = None
    return call


_NONBLOCKING: dict[str, Any] = {
    "Reduce_scatter_block": MPI.Comm.Ireduce_scatter_block,
    "Reduce_scatter": MPI.Comm.Ireduce_scatter,
    "Allgather": MPI.Comm.Iallgather,
}
_PERSISTENT: dict[str, Any] = {"Reduce_scatter_block": MPI.Comm.Reduce_scatter_block_init,
               "Reduce_scatter": MPI.Comm.Reduce_scatter_init,
               "Allgather": MPI.Comm.Allgather_init}  # fmt: skip


def _library(name: str, comm: Any, *args: Any) -> Callable[[bool], Any]:
    """The library's persistent or nonblocking request for collective ``name``."""
    comm = MPI.COMM_WORLD if comm is None else comm
    return lambda persistent: (_PERSISTENT if persistent else _NONBLOCKING)[name](comm, *args)


def _rsb(sendbuf, recvbuf, op, comm, algorithm, timeout) -> Job:
    send = MPI.IN_PLACE if sendbuf is None else sendbuf
    name = "Reduce_scatter_block"
    ready = _halves.prepare_reduce_scatter(True, send, recvbuf, None, op, comm, algorithm,
                                           timeout, started=True)  # fmt: skip
    call = _half(name, comm, algorithm, ready, _library(name, comm, send, recvbuf, op), op)
    return _settles(call, algorithm, comm, send, recvbuf, op)


def _rs(sendbuf, recvbuf, recvcounts, op, comm, algorithm, timeout) -> Job:
    send = MPI.IN_PLACE if sendbuf is None else sendbuf
    name = "Reduce_scatter"
    ready = _halves.prepare_reduce_scatter(False, send, recvbuf, recvcounts, op, comm, algorithm,
                                           timeout, started=True)  # fmt: skip
    call = _half(name, comm, algorithm, ready,
                 _library(name, comm, send, recvbuf, recvcounts, op), op)  # fmt: skip
    return _settles(call, algorithm, comm, send, recvbuf, op)


def _allgather(sendbuf, recvbuf, comm, algorithm, timeout) -> Job:
    send = MPI.IN_PLACE if sendbuf is None else sendbuf
    ready = _halves.prepare_allgather(send, recvbuf, comm, algorithm, timeout, started=True)
    call = _half("Allgather", comm, algorithm, ready, _library("Allgather", comm, send, recvbuf))
    return _settles(call, algorithm, comm, None, recvbuf)


def _settles(call: Job, algorithm: str, comm: Any, sendbuf: Any, recvbuf: Any,
             op: Any = MPI.SUM) -> Job:  # fmt: skip
    """``call``, told how to see that auto's tuner settled it on the library's call (as
    the blocking half asks first: the all-gather by its ``recvbuf``)."""
    if call.run is not None and algorithm == "auto":
        call.settled = lambda: _halves._to_library(comm, call.name, sendbuf, recvbuf, op)
    return call


def Ireduce_scatter_block(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                          comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                          timeout: float | None = None) -> MPI.Request:  # fmt: skip
    """Start :func:`~ringmpi.Reduce_scatter_block`; its request, as :func:`Iallreduce`'s."""
    return started(_rsb(sendbuf, recvbuf, op, comm, algorithm, timeout))


def Ireduce_scatter(sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM,
                    comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                    timeout: float | None = None) -> MPI.Request:  # fmt: skip
    """Start :func:`~ringmpi.Reduce_scatter`; its request, as :func:`Iallreduce`'s."""
    return started(_rs(sendbuf, recvbuf, recvcounts, op, comm, algorithm, timeout))


def Iallgather(sendbuf: Any, recvbuf: Any, comm: MPI.Intracomm | None = None, *,
               algorithm: str = "auto", timeout: float | None = None) -> MPI.Request:  # fmt: skip
    """Start :func:`~ringmpi.Allgather`; its request, as :func:`Iallreduce`'s."""
    return started(_allgather(sendbuf, recvbuf, comm, algorithm, timeout))


def Reduce_scatter_block_init(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                              comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                              timeout: float | None = None) -> MPI.Prequest:  # fmt: skip
    """A persistent :func:`~ringmpi.Reduce_scatter_block`, as :func:`Allreduce_init`."""
    return Prequest.made(_rsb(sendbuf, recvbuf, op, comm, algorithm, timeout))


def Reduce_scatter_init(sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM,
                        comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                        timeout: float | None = None) -> MPI.Prequest:  # fmt: skip
    """A persistent :func:`~ringmpi.Reduce_scatter`, as :func:`Allreduce_init`."""
    return Prequest.made(_rs(sendbuf, recvbuf, recvcounts, op, comm, algorithm, timeout))


def Allgather_init(sendbuf: Any, recvbuf: Any, comm: MPI.Intracomm | None = None, *,
                   algorithm: str = "auto",
                   timeout: float | None = None) -> MPI.Prequest:  # fmt: skip
    """A persistent :func:`~ringmpi.Allgather`, as :func:`Allreduce_init`."""
    return Prequest.made(_allgather(sendbuf, recvbuf, comm, algorithm, timeout))
