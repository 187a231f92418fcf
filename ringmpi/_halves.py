"""The ring's two halves as collectives: Reduce_scatter_block, Reduce_scatter, Allgather.

Each has mpi4py's signature and four ways to run:

* ``ring``: the phase of the ring all-reduce alone
  (:func:`ringmpi.algorithms.ring.reduce_scatter`,
  :func:`~ringmpi.algorithms.ring.all_gather_owned`): N - 1 steps with the
  ring neighbours, each rank sending (N-1)/N of the buffer (nccl-tests'
  busbw = algbw·(N-1)/N).
* ``recursive_halving`` (reduce-scatter) and ``recursive_doubling``
  (all-gather): Rabenseifner's halves (:mod:`ringmpi.algorithms.latency`), lg N
  steps and the ring's bytes for a power of two N, two more steps for the
  ranks folded in pairs otherwise.
* ``shared_memory``: through the node's window, no message
  (:func:`ringmpi.algorithms.shared.shared_memory_halves`); every rank of the
  communicator on one node. The half types' reduce-scatter runs only this way
  (the others would round partial results to 16 bits).
* ``mpi``: the library's own call, with the arguments as given.

``auto`` hands a NumPy buffer below :data:`RING_FROM_BYTES` to the library at
once: there a call is latency-bound and ringmpi's Python entry costs more than
any algorithm saves. From there it tunes itself per communicator and size
class (a power of two of the buffer's bytes): the first calls of a class take
turns among the ways that can run (the latency variant from 3 ranks, shared
memory on one node), timed, then every rank keeps the one whose slowest rank's
median is lowest (the library's unless another is 5 % faster). With the tuner
off (``RINGMPI_TUNER=off``) it runs the ring from :data:`RING_FROM_BYTES`.
What ringmpi cannot do itself goes to the library under ``auto`` and ``mpi``,
as for :func:`ringmpi.Allreduce`. The library's calls take no ``timeout``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _cache, _engine, _settings, _trace
from ._buffers import _as_array, _kind
from ._cache import Bounded
from ._comm import check_comm, not_running, ready, running
from ._errors import UnsupportedError
from .algorithms.latency import doubling_all_gather, halving_reduce_scatter
from .algorithms.ring import all_gather_owned, reduce_scatter
from .algorithms.shared import shared_memory_halves
from .kernels import AVG, reduction

__all__ = ["ALLGATHER_ALGORITHMS", "REDUCE_SCATTER_ALGORITHMS", "RING_FROM_BYTES", "Allgather",
           "Reduce_scatter", "Reduce_scatter_block"]  # fmt: skip

# auto with the tuner off: the ring from this size of the whole buffer, the library's
# call below it (docs/performance.md, "The ring's halves").
RING_FROM_BYTES = 64 << 10
# auto's tuner: timed calls of each candidate per size class; the library's call stays
# unless the ring's are this much faster (as for the all-reduce).
TRIALS = 4
MARGIN = 0.05
# What each collective takes as ``algorithm`` (the latency variant: Rabenseifner's half).
REDUCE_SCATTER_ALGORITHMS = ("auto", "ring", "recursive_halving", "shared_memory", "mpi")
ALLGATHER_ALGORITHMS = ("auto", "ring", "recursive_doubling", "shared_memory", "mpi")
_ALGORITHMS = {
    "Reduce_scatter_block": REDUCE_SCATTER_ALGORITHMS,
    "Reduce_scatter": REDUCE_SCATTER_ALGORITHMS,
    "Allgather": ALLGATHER_ALGORITHMS,
}


def Reduce_scatter_block(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                         comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                         timeout: float | None = None) -> None:  # fmt: skip
    """Reduce ``sendbuf`` (N blocks of k elements) over ``comm``; rank r receives the
    reduced block r in ``recvbuf`` (k elements), like ``comm.Reduce_scatter_block``.
    ``sendbuf`` ``MPI.IN_PLACE`` or None: the N blocks are in ``recvbuf``, whose
    first block receives the result (the ring leaves the rest as it was)."""
    if algorithm == "auto" and _to_library(comm, "Reduce_scatter_block", sendbuf, recvbuf, op):
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
    if algorithm == "auto" and _to_library(comm, "Reduce_scatter", sendbuf, recvbuf, op):
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
    if red.half and algorithm in ("ring", "recursive_halving"):
        raise TypeError(f"{name}: {red.describe()}: algorithm {algorithm!r} forwards partial "
                        "results, rounded to 16 bits at every step (shared_memory folds every "
                        "contribution at once; auto takes it on one node)")  # fmt: skip
    ran, timed = _choose(ctx, name, algorithm, source.nbytes, comm, red.half)
    if ran == "mpi" and red.half and op is AVG:
        raise TypeError(f"{name}: {red.describe()} through the library's call: MPI has no "
                        "average, and a 16-bit sum divided afterwards would round twice "
                        "(shared_memory, on one node, averages with one rounding)")  # fmt: skip
    t0 = time.perf_counter()
    _trace_call(ran)
    if ran == "mpi":  # AVG: the library's SUM, divided here; the half types as given
        _library(name, comm, sendbuf, recvbuf, *(() if block else (recvcounts,)),
                 op if red.half else red.mpi_op)  # fmt: skip
        if not red.half:
            _finish(red, recv, counts[r], n)
    elif ran == "shared_memory":
        _shm_reduce_scatter(ctx, source, recv, counts, red, waits, send is None)
    else:
        _plan_reduce_scatter(ctx, source, recv, counts, red, waits, ran)
    if timed is not None:
        timed(time.perf_counter() - t0)


def _plan_reduce_scatter(ctx, source: np.ndarray, recv: np.ndarray, counts: list[int], red,
                         waits: float, algorithm: str) -> None:  # fmt: skip
    total, r = sum(counts), ctx.rank
    work = ctx.scratch(total * recv.itemsize).view(recv.dtype)  # kept: no page faults
    build = (reduce_scatter if algorithm == "ring" else halving_reduce_scatter)(tuple(counts))
    plan = ctx.plan(build, total, recv.itemsize)
    _engine.run(plan, work, red, ctx, algorithm, waits, source=np.ascontiguousarray(source))
    start = sum(counts[:r])
    _put(recv, work[start : start + counts[r]])


def _shm_reduce_scatter(ctx, source: np.ndarray, recv: np.ndarray, counts: list[int], red,
                        waits: float, in_place: bool) -> None:  # fmt: skip
    """Through the node's window: this rank's block straight into ``recv`` unless
    the input is there too (in place) or ``recv`` is not contiguous."""
    r = ctx.rank
    straight = recv.flags.c_contiguous and not in_place
    out = (recv.reshape(-1)[: counts[r]] if straight
           else ctx.scratch(counts[r] * recv.itemsize).view(recv.dtype))  # fmt: skip
    if ctx.size == 1:
        out[...] = source[: counts[r]]
    else:
        shared_memory_halves(out, np.ascontiguousarray(source), sum(counts[:r]), counts, red,
                             ctx, waits, gather=False)  # fmt: skip
    if not straight:
        _put(recv, out)


def _put(recv: np.ndarray, mine: np.ndarray) -> None:
    """``mine`` into the first elements of ``recv``."""
    if recv.flags.c_contiguous:
        recv.reshape(-1)[: mine.size] = mine
    else:
        recv.flat[: mine.size] = mine


def Allgather(sendbuf: Any, recvbuf: Any, comm: MPI.Intracomm | None = None, *,
              algorithm: str = "auto", timeout: float | None = None) -> None:  # fmt: skip
    """Gather every rank's ``sendbuf`` (k elements) into every rank's ``recvbuf`` (N
    blocks of k, rank order), like ``comm.Allgather``. ``sendbuf`` ``MPI.IN_PLACE``
    or None: rank r's block is already at block r of ``recvbuf``. Any dtype: the
    ring moves bytes."""
    if algorithm == "auto" and _to_library(comm, "Allgather", None, recvbuf):
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
    _trace_call(ran)
    if ran == "mpi":
        _library("Allgather", comm, sendbuf, recvbuf)
    else:
        _plan_allgather(ctx, send, recv, waits, ran)
    if timed is not None:
        timed(time.perf_counter() - t0)


def _plan_allgather(ctx, send: np.ndarray | None, recv: np.ndarray, waits: float,
                    algorithm: str) -> None:  # fmt: skip
    """The all-gather on bytes, into ``recv`` where it is contiguous."""
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
    if algorithm == "shared_memory":
        shared_memory_halves(work, work, r * block, (block,) * n, _BYTES, ctx, waits, gather=True)
    else:
        build = (all_gather_owned if algorithm == "ring" else doubling_all_gather)((block,) * n)
        _engine.run(ctx.plan(build, n * block, 1), work, _BYTES, ctx, algorithm, waits)
    if not recv.flags.c_contiguous:
        recv[...] = work.view(recv.dtype).reshape(recv.shape)


# --- internals -----------------------------------------------------------------------

_BYTES = reduction(MPI.BAND, np.uint8)  # the all-gather only stores: any reduction's tags


def _small(buf: Any, op: Any = MPI.SUM) -> bool:
    """A NumPy buffer below :data:`RING_FROM_BYTES`: latency-bound, where the ring's
    N - 1 steps never beat the library's (log-depth) call, which auto hands it to
    at once (not AVG, which MPI has not)."""
    return type(buf) is np.ndarray and buf.nbytes < RING_FROM_BYTES and op is not AVG


def _to_library(comm: Any, name: str, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> bool:
    """Whether auto makes the library's call first thing: a small buffer, or a size
    its tuner settled for the library on this communicator object (counted in a trace
    as the library's call, like any other)."""
    buf = recvbuf if sendbuf is None or sendbuf is _IN_PLACE else sendbuf
    if type(buf) is not np.ndarray or op is AVG:
        return False
    if buf.nbytes >= RING_FROM_BYTES and (
        _settled.get((id(comm), name, buf.nbytes.bit_length()), _ALLGATHER) is not comm
    ):
        return False
    if not running():
        raise not_running()
    if _TRACES:
        _trace.record_call("mpi")
    return True


# (id of the communicator object, collective, size class) -> that object, where auto's
# tuner settled on the library's call (held, so the id names no other; emptied when a
# communicator is freed).
_settled: Bounded[tuple, Any] = _cache.derived(Bounded(256))

# The library's calls as the small path makes them (Comm's: inter-communicators too).
_ALLGATHER, _RSB, _RS = MPI.Comm.Allgather, MPI.Comm.Reduce_scatter_block, MPI.Comm.Reduce_scatter
_WORLD, _IN_PLACE, _TRACES = MPI.COMM_WORLD, MPI.IN_PLACE, _trace._active


def _check(name: str, algorithm: str, timeout: float | None, comm: Any):
    """(context, timeout) for a call ringmpi runs, or None for the library's."""
    if algorithm not in _ALGORITHMS[name]:
        raise ValueError(f"{name}: algorithm must be one of {', '.join(_ALGORITHMS[name])}, "
                         f"not {algorithm!r}")  # fmt: skip
    settings = _settings.current()
    waits = settings.timeout if timeout is None else _settings.parse_seconds(timeout, "timeout")
    if isinstance(comm, MPI.Intercomm) and comm != MPI.COMM_NULL:
        if algorithm not in ("auto", "mpi"):
            raise UnsupportedError(
                f"{name}: algorithm {algorithm!r} cannot run on an inter-communicator (auto "
                "and 'mpi' hand it to the library)"
            )
        return None
    ctx = ready(check_comm(comm), waits)
    if algorithm == "shared_memory" and ctx.node.Get_size() != ctx.size:
        raise ValueError(f"{name}: algorithm 'shared_memory' needs every rank of the "
                         f"communicator on one node; rank {ctx.rank}'s node holds "
                         f"{ctx.node.Get_size()} of its {ctx.size} ranks")  # fmt: skip
    return ctx, waits


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


def _choose(ctx, name: str, algorithm: str, nbytes: int, comm: Any, half: int = 0):
    """(what runs, None or the callable that takes this call's seconds: a trial)."""
    if algorithm != "auto":
        return algorithm, None
    candidates = _candidates(ctx, name, half)
    if len(candidates) == 1:
        return candidates[0], None
    if _settings.current().tuner == "off":
        return ("ring" if nbytes >= RING_FROM_BYTES else "mpi"), None
    return ctx.state(_Tuned).choose(name, nbytes, comm, candidates)


def _candidates(ctx, name: str, half: int) -> tuple[str, ...]:
    """What auto may run on ``ctx``: the library's call always; the ring; the latency
    variant from 3 ranks (at 2 it is the ring); shared memory on one node. The
    half types: shared memory on one node (one rounding), else the library."""
    one_node = ctx.node.Get_size() == ctx.size
    if half:  # no trial of a library that may not take them
        return ("shared_memory",) if one_node else ("mpi",)
    if ctx.size == 1:
        return ("mpi",)
    shared = ("shared_memory",) if one_node else ()
    latency = ("recursive_doubling" if name == "Allgather" else "recursive_halving",)
    return ("ring", *(latency if ctx.size > 2 else ()), *shared, "mpi")


class _Tuned:
    """auto's choices on one communicator, per (collective, size class, candidates),
    tuned online."""

    name = "halves-auto"  # its key among the communicator's states

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.won: dict[tuple, str] = {}
        self.trials: dict[tuple, list[tuple[str, float]]] = {}

    @classmethod
    def state(cls, ctx) -> _Tuned:
        return cls(ctx)

    def free(self) -> None:
        self.won.clear()

    def choose(self, name: str, nbytes: int, comm: Any, candidates: tuple[str, ...]):
        """The candidates take turns for TRIALS calls each; then every rank keeps the
        one whose slowest rank's median is lowest, the library's (the last)
        unless another is MARGIN faster."""
        key = (name, nbytes.bit_length(), candidates)
        found = self.won.get(key)
        if found is not None:
            return found, None
        trials = self.trials.setdefault(key, [])
        candidate = candidates[len(trials) % len(candidates)]

        def timed(seconds: float) -> None:
            trials.append((candidate, seconds))
            if len(trials) == len(candidates) * TRIALS:  # every rank at the same call: agree
                mine = np.array([np.median([t for a, t in trials if a == c]) for c in candidates])
                slowest = np.empty_like(mine)
                self.ctx.comm.Allreduce(mine, slowest, op=MPI.MAX)
                best = int(np.argmin(slowest[:-1]))
                won = candidates[best] if slowest[best] < slowest[-1] * (1 - MARGIN) else "mpi"
                self.won[key] = won
                if won == "mpi":  # later calls go there first thing
                    _settled.put((id(comm), *key[:2]), comm)
                del self.trials[key]

        return candidate, timed


def _trace_call(ran: str) -> None:
    if _trace._active:
        _trace.record_call(ran)


def _library(name: str, comm: Any, *args: Any, why: str = "", algorithm: str = "auto") -> None:
    """The library's own collective ``name`` on the user's communicator, the arguments
    as given (``why``: what ringmpi cannot do, which a named ring refuses)."""
    if why and algorithm not in ("auto", "mpi"):
        raise UnsupportedError(f"{why}; algorithm {algorithm!r} cannot run this call (auto and "
                               "'mpi' hand it to the MPI library's own collective)")  # fmt: skip
    comm = MPI.COMM_WORLD if comm is None else comm
    getattr(MPI.Comm, name)(comm, *args)
