"""The ring's two halves as collectives: Reduce_scatter_block, Reduce_scatter, Allgather.

Each is one phase of the ring all-reduce run alone (:func:`ringmpi.algorithms.ring.
reduce_scatter`, :func:`~ringmpi.algorithms.ring.all_gather_owned`): N - 1 steps
with the ring neighbours, each rank sending (N-1)/N of the buffer (nccl-tests'
busbw = algbw·(N-1)/N). ``algorithm`` is ``"auto"``, ``"ring"`` or ``"mpi"``
(the library's own call, with the arguments as given). Below
:data:`RING_FROM_BYTES` of buffer, where a call is latency-bound and the
library's log-depth algorithms win, auto hands a NumPy buffer to the library at
once. From there it tunes itself per communicator and size class (a power of
two of the buffer's bytes): its first
calls of a class take turns between the two, timed, then every rank keeps the
one whose slowest rank's median is lower (the library's unless the ring is 5 %
faster); with the tuner off (``RINGMPI_TUNER=off``) it runs the ring. What
ringmpi cannot do itself goes to the library under ``auto`` and ``mpi``, as for
:func:`ringmpi.Allreduce`. The library's calls take no ``timeout``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _cache, _engine, _settings, _trace
from ._buffers import _as_array, _kind
from ._cache import Bounded
from ._comm import check_comm, ready
from ._errors import UnsupportedError
from .algorithms.ring import all_gather_owned, reduce_scatter
from .kernels import AVG, reduction

__all__ = ["RING_FROM_BYTES", "Allgather", "Reduce_scatter", "Reduce_scatter_block"]

# auto with the tuner off: the ring from this size of the whole buffer, the library's
# call below it (docs/performance.md, "The ring's halves").
RING_FROM_BYTES = 64 << 10
# auto's tuner: timed calls of each candidate per size class; the library's call stays
# unless the ring's are this much faster (as for the all-reduce).
TRIALS = 4
MARGIN = 0.05
_ALGORITHMS = ("auto", "ring", "mpi")


def Reduce_scatter_block(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                         comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                         timeout: float | None = None) -> None:  # fmt: skip
    """Reduce ``sendbuf`` (N blocks of k elements) over ``comm``; rank r receives the
    reduced block r in ``recvbuf`` (k elements), like ``comm.Reduce_scatter_block``.
    ``sendbuf`` ``MPI.IN_PLACE`` or None: the N blocks are in ``recvbuf``, whose
    first block receives the result (the ring leaves the rest as it was)."""
    if algorithm == "auto" and _small(recvbuf if sendbuf is None or sendbuf is _IN_PLACE
                                      else sendbuf, op):  # fmt: skip
        return _RSB(_WORLD if comm is None else comm, sendbuf, recvbuf, op)
    if algorithm == "auto" and _settled(comm, "Reduce_scatter_block", sendbuf, recvbuf, op):
        return _RSB(_WORLD if comm is None else comm, sendbuf, recvbuf, op)
    _reduce_scatter(True, sendbuf, recvbuf, None, op, comm, algorithm, timeout)


def Reduce_scatter(sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = MPI.SUM,
                   comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                   timeout: float | None = None) -> None:  # fmt: skip
    """Reduce ``sendbuf`` (``sum(recvcounts)`` elements) over ``comm``; rank r receives
    the ``recvcounts[r]`` elements from ``sum(recvcounts[:r])`` on, reduced, in
    ``recvbuf``, like ``comm.Reduce_scatter``. ``recvcounts`` None: every rank's
    ``recvbuf`` size (gathered). ``sendbuf`` ``MPI.IN_PLACE`` or None: the input is
    in ``recvbuf``, whose first ``recvcounts[r]`` elements receive the result."""
    if algorithm == "auto" and _small(recvbuf if sendbuf is None or sendbuf is _IN_PLACE
                                      else sendbuf, op):  # fmt: skip
        return _RS(_WORLD if comm is None else comm, sendbuf, recvbuf, recvcounts, op)
    if algorithm == "auto" and _settled(comm, "Reduce_scatter", sendbuf, recvbuf, op):
        return _RS(_WORLD if comm is None else comm, sendbuf, recvbuf, recvcounts, op)
    _reduce_scatter(False, sendbuf, recvbuf, recvcounts, op, comm, algorithm, timeout)


def _reduce_scatter(block: bool, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any,
                    comm: Any, algorithm: str, timeout: float | None) -> None:  # fmt: skip
    """Either reduce-scatter (``block``: equal blocks, no counts)."""
    name = "Reduce_scatter_block" if block else "Reduce_scatter"
    if sendbuf is None:
        sendbuf = MPI.IN_PLACE
    checked = _check(name, algorithm, timeout, comm)
    if checked is None:
        return _library(name, comm, sendbuf, recvbuf, *(() if block else (recvcounts,)), op)
    ctx, waits = checked
    try:
        recv = _writable(recvbuf)
        send = None if sendbuf is MPI.IN_PLACE else _as_array(sendbuf, "sendbuf")
        red = reduction(op, recv.dtype)
    except UnsupportedError as exc:
        why = str(exc)
        return _library(name, comm, sendbuf, recvbuf, *(() if block else (recvcounts,)), op,
                        why=why, algorithm=algorithm)  # fmt: skip
    n, r = ctx.size, ctx.rank
    if block:
        total = recv.size if send is None else send.size
        if total % n:
            what = "recvbuf" if send is None else "sendbuf"
            raise ValueError(f"{name}: {what} holds {total} elements, not N = {n} equal blocks")
        counts = [total // n] * n
    elif recvcounts is None:
        if send is None:
            raise ValueError(f"{name}: in place, recvcounts must be given")
        counts = ctx.comm.allgather(recv.size)
    else:
        counts = [int(c) for c in recvcounts]
        if len(counts) != n or min(counts) < 0:
            raise ValueError(f"{name}: recvcounts must be {n} counts >= 0, got {recvcounts!r}")
    total = sum(counts)
    source = recv.reshape(-1) if send is None else send.reshape(-1)
    if send is not None and send.dtype != recv.dtype:
        raise TypeError(f"recvbuf has dtype {recv.dtype} but sendbuf has dtype {send.dtype}")
    if source.size != total or recv.size < (counts[r] if send is not None else total):
        raise ValueError(
            f"{name}: {'recvbuf' if send is None else 'sendbuf'} holds {source.size} elements "
            f"and recvbuf {recv.size}; recvcounts {counts} need {total}"
            + ("" if send is None else f" and {counts[r]}")
        )
    ran, timed = _choose(ctx, name, algorithm, source.nbytes, comm)
    t0 = time.perf_counter()
    _trace_call()
    if ran == "mpi":  # AVG: the library's SUM, divided here
        _library(name, comm, sendbuf, recvbuf, *(() if block else (recvcounts,)), red.mpi_op)
        _finish(red, recv, counts[r], n)
    else:
        _ring_reduce_scatter(ctx, source, recv, counts, red, waits)
    if timed is not None:
        timed(time.perf_counter() - t0)


def _ring_reduce_scatter(ctx, source: np.ndarray, recv: np.ndarray, counts: list[int], red,
                         waits: float) -> None:  # fmt: skip
    total, r = sum(counts), ctx.rank
    work = ctx.scratch(total * recv.itemsize).view(recv.dtype)  # kept: no page faults
    plan = ctx.plan(reduce_scatter(tuple(counts)), total, recv.itemsize)
    _engine.run(plan, work, red, ctx, "ring", waits, source=np.ascontiguousarray(source))
    start = sum(counts[:r])
    mine = work[start : start + counts[r]]
    if recv.flags.c_contiguous:
        recv.reshape(-1)[: counts[r]] = mine
    else:
        recv.flat[: counts[r]] = mine


def Allgather(sendbuf: Any, recvbuf: Any, comm: MPI.Intracomm | None = None, *,
              algorithm: str = "auto", timeout: float | None = None) -> None:  # fmt: skip
    """Gather every rank's ``sendbuf`` (k elements) into every rank's ``recvbuf`` (N
    blocks of k, rank order), like ``comm.Allgather``. ``sendbuf`` ``MPI.IN_PLACE``
    or None: rank r's block is already at block r of ``recvbuf``. Any dtype: the
    ring moves bytes."""
    if algorithm == "auto" and (_small(recvbuf) or _settled(comm, "Allgather", None, recvbuf)):
        return _ALLGATHER(_WORLD if comm is None else comm, sendbuf, recvbuf)
    if sendbuf is None:
        sendbuf = MPI.IN_PLACE
    checked = _check("Allgather", algorithm, timeout, comm)
    if checked is None:
        return _library("Allgather", comm, sendbuf, recvbuf)
    ctx, waits = checked
    try:
        recv = _writable(recvbuf)
        send = None if sendbuf is MPI.IN_PLACE else _as_array(sendbuf, "sendbuf")
    except UnsupportedError as exc:
        why = str(exc)
        return _library("Allgather", comm, sendbuf, recvbuf, why=why, algorithm=algorithm)
    n = ctx.size
    if recv.nbytes % n or (send is not None and send.nbytes * n != recv.nbytes):
        raise ValueError(
            f"Allgather: recvbuf holds {recv.nbytes} bytes, not N = {n} blocks"
            + ("" if send is None else f" of sendbuf's {send.nbytes}")
        )
    if send is not None and not recv.flags.c_contiguous:
        raise ValueError("Allgather: recvbuf must be contiguous")
    ran, timed = _choose(ctx, "Allgather", algorithm, recv.nbytes, comm)
    t0 = time.perf_counter()
    _trace_call()
    if ran == "mpi":
        _library("Allgather", comm, sendbuf, recvbuf)
    else:
        _ring_allgather(ctx, send, recv, waits)
    if timed is not None:
        timed(time.perf_counter() - t0)


def _ring_allgather(ctx, send: np.ndarray | None, recv: np.ndarray, waits: float) -> None:
    n, r = ctx.size, ctx.rank
    block = recv.nbytes // n
    work = (
        recv.reshape(-1).view(np.uint8)
        if recv.flags.c_contiguous
        else np.empty(n * block, np.uint8)
    )
    if not recv.flags.c_contiguous:
        work[...] = np.ascontiguousarray(recv).reshape(-1).view(np.uint8)
    if send is not None:
        work[r * block : (r + 1) * block] = np.ascontiguousarray(send).reshape(-1).view(np.uint8)
    plan = ctx.plan(all_gather_owned((block,) * n), n * block, 1)
    _engine.run(plan, work, _BYTES, ctx, "ring", waits)
    if not recv.flags.c_contiguous:
        recv[...] = work.view(recv.dtype).reshape(recv.shape)


# --- internals -----------------------------------------------------------------------

_BYTES = reduction(MPI.BAND, np.uint8)  # the all-gather only stores: any reduction's tags


def _small(buf: Any, op: Any = MPI.SUM) -> bool:
    """A NumPy buffer below :data:`RING_FROM_BYTES`: latency-bound, where the ring's
    N - 1 steps never beat the library's (log-depth) call, which auto hands it to
    at once (not AVG, which MPI has not; not inside a trace, which counts the call)."""
    return (type(buf) is np.ndarray and buf.nbytes < RING_FROM_BYTES and op is not AVG
            and not _TRACES)  # fmt: skip


def _settled(comm: Any, name: str, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> bool:
    """Whether auto's tuner settled this size on this communicator object for the
    library's call: then it is made first thing."""
    buf = recvbuf if sendbuf is None or sendbuf is _IN_PLACE else sendbuf
    if type(buf) is not np.ndarray or op is AVG or _TRACES:
        return False
    return _to_library.get((id(comm), name, buf.nbytes.bit_length()), _ALLGATHER) is comm


# (id of the communicator object, collective, size class) -> that object, where auto's
# tuner settled on the library's call (held, so the id names no other; emptied when a
# communicator is freed).
_to_library: Bounded[tuple, Any] = _cache.derived(Bounded(256))

# The library's calls as the small path makes them (Comm's: inter-communicators too).
_ALLGATHER, _RSB, _RS = MPI.Comm.Allgather, MPI.Comm.Reduce_scatter_block, MPI.Comm.Reduce_scatter
_WORLD, _IN_PLACE, _TRACES = MPI.COMM_WORLD, MPI.IN_PLACE, _trace._active


def _check(name: str, algorithm: str, timeout: float | None, comm: Any):
    """(context, timeout) for a call ringmpi runs, or None for the library's."""
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"{name}: algorithm must be one of {', '.join(_ALGORITHMS)}, "
                         f"not {algorithm!r}")  # fmt: skip
    settings = _settings.current()
    waits = settings.timeout if timeout is None else _settings.parse_seconds(timeout, "timeout")
    if isinstance(comm, MPI.Intercomm) and comm != MPI.COMM_NULL:
        if algorithm == "ring":
            raise UnsupportedError(
                f"{name}: algorithm 'ring' cannot run on an inter-communicator (auto and "
                "'mpi' hand it to the library)"
            )
        return None
    return ready(check_comm(comm), waits), waits


def _writable(recvbuf: Any) -> np.ndarray:
    recv = _as_array(recvbuf, "recvbuf")
    if not recv.flags.writeable:
        raise ValueError(f"recvbuf is read-only{_kind(recvbuf)}")
    return recv


def _finish(red, recv: np.ndarray, count: int, n: int) -> None:
    """AVG divides the library's sum in the first ``count`` elements of ``recv``."""
    if recv.flags.c_contiguous:
        red.finish(recv.reshape(-1)[:count], n)
    else:
        mine = recv.flat[:count].copy()
        red.finish(mine, n)
        recv.flat[:count] = mine


def _choose(ctx, name: str, algorithm: str, nbytes: int, comm: Any):
    """(what runs, None or the callable that takes this call's seconds: a trial)."""
    if algorithm != "auto":
        return algorithm, None
    if _settings.current().tuner == "off" or ctx.size == 1:
        return ("ring" if nbytes >= RING_FROM_BYTES else "mpi"), None
    return ctx.state(_Tuned).choose(name, nbytes, comm)


class _Tuned:
    """auto's choices on one communicator, per (collective, size class), tuned online."""

    name = "halves-auto"  # its key among the communicator's states

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.won: dict[tuple[str, int], str] = {}
        self.trials: dict[tuple[str, int], list[tuple[str, float]]] = {}

    @classmethod
    def state(cls, ctx) -> _Tuned:
        return cls(ctx)

    def free(self) -> None:
        self.won.clear()

    def choose(self, name: str, nbytes: int, comm: Any):
        key = (name, nbytes.bit_length())
        found = self.won.get(key)
        if found is not None:
            return found, None
        trials = self.trials.setdefault(key, [])
        candidate = _CANDIDATES[len(trials) % 2]

        def timed(seconds: float) -> None:
            trials.append((candidate, seconds))
            if len(trials) == 2 * TRIALS:  # every rank here at the same call: agree
                mine = [float(np.median([t for a, t in trials if a == c])) for c in _CANDIDATES]
                slowest = np.empty(2)
                self.ctx.comm.Allreduce(np.array(mine), slowest, op=MPI.MAX)
                ring, library = slowest
                self.won[key] = "ring" if ring < library * (1 - MARGIN) else "mpi"
                if self.won[key] == "mpi":  # later calls go there first thing
                    _to_library.put((id(comm), *key), comm)
                del self.trials[key]

        return candidate, timed


_CANDIDATES = ("ring", "mpi")


def _trace_call() -> None:
    if _trace._active:
        _trace.record_call()


def _library(name: str, comm: Any, *args: Any, why: str = "", algorithm: str = "auto") -> None:
    """The library's own collective ``name`` on the user's communicator, the arguments
    as given (``why``: what ringmpi cannot do, which a named ring refuses)."""
    if why and algorithm == "ring":
        raise UnsupportedError(f"{why}; algorithm 'ring' cannot run this call (auto and 'mpi' "
                               "hand it to the MPI library's own collective)")  # fmt: skip
    comm = MPI.COMM_WORLD if comm is None else comm
    getattr(MPI.Comm, name)(comm, *args)
