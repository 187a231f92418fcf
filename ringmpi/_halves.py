"""The ring's two halves as collectives: Reduce_scatter_block, Reduce_scatter, Allgather.

Each has mpi4py's signature, and its algorithms are records of the registry
(:mod:`ringmpi.algorithms.registry`, collectives ``reduce_scatter`` and
``allgather``), as the all-reduce's are: ``ring`` (N - 1 steps with the ring
neighbours, each rank sending (N-1)/N of the buffer: nccl-tests' busbw =
algbw·(N-1)/N), ``recursive_halving`` / ``recursive_doubling`` (Rabenseifner's
halves, lg N steps), ``shared_memory`` (through the node's window, every rank of
the communicator on one node; the half types' reduce-scatter runs only this way,
the others would round partial results to 16 bits) and ``mpi`` (the library's
own call). A new one is one file that registers its record.

``auto`` hands a NumPy buffer below :data:`RING_FROM_BYTES` to the library at
once: there a call is latency-bound and ringmpi's Python entry costs more than
any algorithm saves. From there it chooses as the all-reduce does
(:func:`ringmpi.algorithms.choose`): the cost model ranks ringmpi's own records
(the latency variant from 3 ranks, shared memory on one node), and auto's online
tuner times the model's best, the best of the other kind and the model's
next against the library's call per size class, keeping the library's unless
another is 5 % faster; with the tuner off (``RINGMPI_TUNER=off``) the model's best
runs. What ringmpi cannot do itself goes to the library under ``auto`` and
``mpi``, as for :func:`ringmpi.Allreduce`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _cache, _settings, _trace, algorithms
from ._buffers import _as_array, _kind
from ._cache import Bounded
from ._comm import check_comm, not_running, ready, running
from ._errors import UnsupportedError
from ._progress import Job
from .algorithms import registry
from .kernels import AVG, reduction

__all__ = ["RING_FROM_BYTES", "Allgather", "Reduce_scatter", "Reduce_scatter_block"]

# auto: ringmpi's own algorithms from this size of the whole buffer, the library's call
# below it (docs/performance.md, "The ring's halves").
RING_FROM_BYTES = 64 << 10


# The registry's collective of each call.
COLLECTIVE = {"Reduce_scatter_block": "reduce_scatter", "Reduce_scatter": "reduce_scatter",
              "Allgather": "allgather"}  # fmt: skip


def Reduce_scatter_block(sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                         comm: MPI.Intracomm | None = None, *, algorithm: str = "auto",
                         timeout: float | None = None) -> None:  # fmt: skip
    """Reduce ``sendbuf`` (N blocks of k elements) over ``comm``; rank r receives the
    reduced block r in ``recvbuf`` (k elements), like ``comm.Reduce_scatter_block``.
    ``sendbuf`` ``MPI.IN_PLACE`` or None: the N blocks are in ``recvbuf``, whose
    first block receives the result (the ring leaves the rest as it was)."""
    if algorithm == "auto" and _to_library(comm, "Reduce_scatter_block", sendbuf, recvbuf, op):
        return _RSB(_WORLD if comm is None else comm, sendbuf, recvbuf, op)
    sendbuf = _IN_PLACE if sendbuf is None else sendbuf
    ready = prepare_reduce_scatter(True, sendbuf, recvbuf, None, op, comm, algorithm, timeout)
    if ready is None or ready.run is None:
        return _library("Reduce_scatter_block", comm, sendbuf, recvbuf, op)
    ready.run()


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
    sendbuf = _IN_PLACE if sendbuf is None else sendbuf
    ready = prepare_reduce_scatter(False, sendbuf, recvbuf, recvcounts, op, comm, algorithm,
                                   timeout)  # fmt: skip
    if ready is None or ready.run is None:
        return _library("Reduce_scatter", comm, sendbuf, recvbuf, recvcounts, op)
    ready.run()


def Allgather(sendbuf: Any, recvbuf: Any, comm: MPI.Intracomm | None = None, *,
              algorithm: str = "auto", timeout: float | None = None) -> None:  # fmt: skip
    """Gather every rank's ``sendbuf`` (k elements) into every rank's ``recvbuf`` (N
    blocks of k, rank order), like ``comm.Allgather``. ``sendbuf`` ``MPI.IN_PLACE``
    or None: rank r's block is already at block r of ``recvbuf``. Any dtype: the
    ring moves bytes."""
    if algorithm == "auto" and _to_library(comm, "Allgather", None, recvbuf):
        return _ALLGATHER(_WORLD if comm is None else comm, sendbuf, recvbuf)
    sendbuf = _IN_PLACE if sendbuf is None else sendbuf
    ready = prepare_allgather(sendbuf, recvbuf, comm, algorithm, timeout)
    if ready is None or ready.run is None:
        return _library("Allgather", comm, sendbuf, recvbuf)
    ready.run()


def prepare_reduce_scatter(block: bool, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any,
                           comm: Any, algorithm: str, timeout: float | None,
                           started: bool = False) -> Job | None:  # fmt: skip
    """The reduce-scatter checked once (bad input raises here, before any message),
    ready to run as often as wanted (a persistent request's starts); ``started``: with
    its step finder too (a nonblocking or persistent call's). None: the library's
    call, with the arguments as given (an inter-communicator, what ringmpi cannot
    reduce)."""
    name = "Reduce_scatter_block" if block else "Reduce_scatter"
    checked = _check(name, algorithm, timeout, comm)
    if checked is None:
        return None
    ctx, waits, record = checked
    try:
        recv = _writable(recvbuf)
        send = None if sendbuf is MPI.IN_PLACE else _as_array(sendbuf, "sendbuf")
        red = reduction(op, recv.dtype)
    except UnsupportedError as exc:
        _library_may(str(exc), algorithm)
        return None
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
    if send is not None and send.dtype != recv.dtype:
        raise TypeError(f"recvbuf has dtype {recv.dtype} but sendbuf has dtype {send.dtype}")
    given = recv if send is None else send
    if given.size != total or recv.size < (counts[r] if send is not None else total):
        raise ValueError(
            f"{name}: {'recvbuf' if send is None else 'sendbuf'} holds {given.size} elements "
            f"and recvbuf {recv.size}; recvcounts {counts} need {total}"
            + ("" if send is None else f" and {counts[r]}")
        )
    if red.half and record is not None and record.half is None:
        raise TypeError(f"{name}: {red.describe()}: algorithm {algorithm!r} {record.no_half}")
    # This rank's block straight into recvbuf where it is contiguous; the input where it
    # lies where it is (in place: recvbuf's first elements are the block's, as MPI's).
    straight = recv.flags.c_contiguous
    out = recv.reshape(-1)[: counts[r]] if straight else np.empty(counts[r], recv.dtype)
    whole = given.flags.c_contiguous
    source = given.reshape(-1) if whole else None
    key = _settle_key(comm, name, given.nbytes, op, recv.dtype) if record is None else ()

    def run() -> None:
        src = source if source is not None else np.ascontiguousarray(given).reshape(-1)
        _run(record, "reduce_scatter", src.nbytes, key, comm, (out, red, ctx, src, waits, counts))
        if not straight:
            _scatter_out(recv, out)

    if not started:
        return Job(run, name=name, comm=comm, ctx=ctx, timeout=waits, nbytes=given.nbytes)

    def step() -> Callable[[bool], bool | None] | None:
        found = _step(record, "reduce_scatter", given.nbytes, red, ctx, waits, counts)
        if found is None:
            return None
        src = source if source is not None else np.ascontiguousarray(given).reshape(-1)
        return _stepping(found, out, src, None if straight else (_scatter_out, recv, out))

    return Job(run, None, step, name=name, comm=comm, ctx=ctx, timeout=waits,
               nbytes=given.nbytes)  # fmt: skip


def prepare_allgather(sendbuf: Any, recvbuf: Any, comm: Any, algorithm: str,
                      timeout: float | None, started: bool = False) -> Job | None:  # fmt: skip
    """The all-gather checked once, as :func:`prepare_reduce_scatter`."""
    checked = _check("Allgather", algorithm, timeout, comm)
    if checked is None:
        return None
    ctx, waits, record = checked
    try:
        recv = _writable(recvbuf)
        send = None if sendbuf is MPI.IN_PLACE else _as_array(sendbuf, "sendbuf")
    except UnsupportedError as exc:
        _library_may(str(exc), algorithm)
        return None
    n, r = ctx.size, ctx.rank
    if recv.nbytes % n or (send is not None and send.nbytes * n != recv.nbytes):
        raise ValueError(
            f"Allgather: recvbuf holds {recv.nbytes} bytes, not N = {n} blocks"
            + ("" if send is None else f" of sendbuf's {send.nbytes}")
        )
    if send is not None and not recv.flags.c_contiguous:
        raise ValueError("Allgather: recvbuf must be contiguous")
    block = recv.nbytes // n
    counts = (block,) * n
    # On recvbuf's bytes where it is contiguous, else on a copy.
    straight = recv.flags.c_contiguous
    work = recv.reshape(-1).view(np.uint8) if straight else np.empty(n * block, np.uint8)
    key = _settle_key(comm, "Allgather", recv.nbytes, MPI.SUM, None) if record is None else ()

    def run() -> None:
        _gather_in(work, recv, send, straight, r * block)
        _run(record, "allgather", work.nbytes, key, comm, (work, _BYTES, ctx, None, waits, counts))
        if not straight:
            _gather_out(recv, work)

    if not started:
        return Job(run, name="Allgather", comm=comm, ctx=ctx, timeout=waits, nbytes=recv.nbytes)

    def step() -> Callable[[bool], bool | None] | None:
        found = _step(record, "allgather", work.nbytes, _BYTES, ctx, waits, counts)
        if found is None:
            return None
        _gather_in(work, recv, send, straight, r * block)
        return _stepping(found, work, work, None if straight else (_gather_out, recv, work))

    return Job(run, None, step, name="Allgather", comm=comm, ctx=ctx, timeout=waits,
               nbytes=recv.nbytes)  # fmt: skip


def _named(name: str, algorithm: str) -> registry.Algorithm | None:
    """The record a named algorithm is (None: auto)."""
    return None if algorithm == "auto" else registry.get(algorithm, COLLECTIVE[name])


def _run(record, collective: str, nbytes: int, key: tuple, comm: Any, args: tuple) -> None:
    """One call: auto's choice (its winner, or a trial) or the named record, traced."""
    chosen = record
    if chosen is None:
        chosen = algorithms.choose("auto", nbytes, args[2], args[1], collective=collective)
        if not isinstance(chosen, algorithms.UNSETTLED) and not chosen.own:
            _settled.put(key, comm)  # later calls go to the library first thing
    if _trace._active:
        _trace.record_call(chosen.name)
    chosen.run(*args)


def _scatter_out(recv: np.ndarray, out: np.ndarray) -> None:
    """The reduce-scatter's block, folded on a copy, into recvbuf's first elements."""
    recv.flat[: out.size] = out


def _gather_out(recv: np.ndarray, work: np.ndarray) -> None:
    """The all-gather's bytes, gathered on a copy, into recvbuf."""
    recv[...] = work.view(recv.dtype).reshape(recv.shape)


def _stepping(found: Callable[..., bool | None], work: np.ndarray, source: np.ndarray,
              then: tuple | None) -> Callable[[bool], bool | None]:  # fmt: skip
    """``step(wait)``: ``found(work, source, wait)``, and once it is done ``then``'s
    function on its arguments (the copy out of a working copy), if any."""
    if then is None:
        return functools.partial(found, work, source)
    out, *args = then

    def step(wait: bool) -> bool | None:
        done = found(work, source, wait)
        if done:
            out(*args)
        return done

    return step


def _gather_in(work: np.ndarray, recv: np.ndarray, send: np.ndarray | None, straight: bool,
               at: int) -> None:  # fmt: skip
    """The all-gather's bytes in ``work``: recvbuf's where it is a copy, then this rank's
    block (from sendbuf) at byte ``at``."""
    if not straight:
        work[...] = np.ascontiguousarray(recv).reshape(-1).view(np.uint8)
    if send is not None:
        mine = np.ascontiguousarray(send).reshape(-1).view(np.uint8)
        work[at : at + mine.size] = mine


def _step(record, collective: str, nbytes: int, red: Any, ctx: Any, timeout: float,
               counts: Sequence[int]) -> Callable[..., bool | None] | None:  # fmt: skip
    """The step, on the arrays :func:`_run` passes, of the record a call runs (the named
    one, or auto's settled choice: none during its trials), where it can stop at a
    wait; None where it cannot, or where a trace is open (the run records it)."""
    chosen = record
    if chosen is None:
        chosen = algorithms.choose("auto", nbytes, ctx, red, collective=collective)
    if isinstance(chosen, algorithms.UNSETTLED) or _trace._active:
        return None
    return algorithms.prepare(chosen, red, ctx, counts, timeout).step


# --- internals -----------------------------------------------------------------------

_BYTES = reduction(MPI.BAND, np.uint8)  # the all-gather only stores: any reduction's tags


def _to_library(comm: Any, name: str, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> bool:
    """Whether auto makes the library's call first thing: a small buffer, or a size,
    reduction and dtype its choice settled on the library's call on this communicator
    object (counted in a trace as the library's call, like any other)."""
    buf = recvbuf if sendbuf is None or sendbuf is _IN_PLACE else sendbuf
    if type(buf) is not np.ndarray or op is AVG:
        return False
    if name != "Allgather" and (buf.dtype.kind == "V" or buf.dtype == np.float16):
        return False  # the 16-bit floats: the library has no bfloat16, nor float16 everywhere
    if buf.nbytes >= RING_FROM_BYTES and (
        _settled.get(_settle_key(comm, name, buf.nbytes, op, buf.dtype), _ALLGATHER) is not comm
    ):
        return False
    if not running():
        raise not_running()
    if _TRACES:
        _trace.record_call("mpi")
    return True


def _settle_key(comm: Any, name: str, nbytes: int, op: Any, dtype: Any) -> tuple:
    """Where auto's choice for a call is kept: the communicator object, the collective,
    the size class, and the reduction (none for the all-gather)."""
    if name == "Allgather":
        return (id(comm), name, nbytes.bit_length())
    return (id(comm), name, nbytes.bit_length(), id(op), dtype.char)


# (id of the communicator object, collective, size class[, op, dtype]) -> that object,
# where auto settled on the library's call (held, so the id names no other; emptied
# when a communicator is freed).
_settled: Bounded[tuple, Any] = _cache.derived(Bounded(256))

# The library's calls as the small path makes them (Comm's: inter-communicators too).
_ALLGATHER, _RSB, _RS = MPI.Comm.Allgather, MPI.Comm.Reduce_scatter_block, MPI.Comm.Reduce_scatter
_WORLD, _IN_PLACE, _TRACES = MPI.COMM_WORLD, MPI.IN_PLACE, _trace._active


def _check(name: str, algorithm: str, timeout: float | None, comm: Any):
    """(context, timeout, the named record or None for auto) for a call ringmpi runs,
    or None for the library's."""
    collective = COLLECTIVE[name]
    if algorithm not in registry.names(collective):
        raise ValueError(f"{name}: algorithm must be one of "
                         f"{', '.join(registry.names(collective))}, not {algorithm!r}")  # fmt: skip
    settings = _settings.current()
    waits = settings.timeout if timeout is None else _settings.parse_seconds(timeout, "timeout")
    record = _named(name, algorithm)
    if isinstance(comm, MPI.Intercomm) and comm != MPI.COMM_NULL:
        if record is not None and record.own:
            raise UnsupportedError(
                f"{name}: algorithm {algorithm!r} cannot run on an inter-communicator (auto "
                "and 'mpi' hand it to the library)"
            )
        return None
    ctx = ready(check_comm(comm), waits)
    if record is not None and not registry.fits(record, ctx):
        raise ValueError(f"{name}: algorithm {algorithm!r} needs every rank of the "
                         f"communicator on one node; rank {ctx.rank}'s node holds "
                         f"{ctx.node.Get_size()} of its {ctx.size} ranks")  # fmt: skip
    return ctx, waits, record


def _writable(recvbuf: Any) -> np.ndarray:
    recv = _as_array(recvbuf, "recvbuf")
    if not recv.flags.writeable:
        raise ValueError(f"recvbuf is read-only{_kind(recvbuf)}")
    return recv


def _library_may(why: str, algorithm: str) -> None:
    """A call ringmpi cannot run (``why``) goes to the library under auto and 'mpi';
    a named own algorithm refuses it."""
    if algorithm not in ("auto", "mpi"):
        raise UnsupportedError(f"{why}; algorithm {algorithm!r} cannot run this call (auto and "
                               "'mpi' hand it to the MPI library's own collective)")  # fmt: skip


def _library(name: str, comm: Any, *args: Any) -> None:
    """The library's own collective ``name`` on the user's communicator, the arguments
    as given."""
    comm = MPI.COMM_WORLD if comm is None else comm
    getattr(MPI.Comm, name)(comm, *args)


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
