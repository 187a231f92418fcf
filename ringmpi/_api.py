"""The library API: Allreduce and allreduce."""

from __future__ import annotations

import functools
import importlib
from typing import Any, NamedTuple

import numpy as np
from mpi4py import MPI

from . import _direct, _progress, _repeat, _settings, _trace, algorithms
from ._buffers import _as_array, _kind
from ._comm import Context, check_comm, context, polled, ready
from ._errors import RingMPIError, UnsupportedError
from ._settings import configure, configured
from .kernels import Reduction, reduction

# configure and configured are the settings' (the API names them from here, where the
# registry that checks an algorithm's name is loaded).
__all__ = ["Allreduce", "allreduce", "configure", "configured", "warm"]


def Allreduce(
    sendbuf: Any,
    recvbuf: Any,
    op: Any = MPI.SUM,
    comm: MPI.Intracomm | None = None,
    *,
    algorithm: str = "auto",
    validate: bool | None = None,
    timeout: float | None = None,
    reproducible: bool | None = None,
) -> None:
    """All-reduce ``sendbuf`` into ``recvbuf`` on every rank of ``comm``, like ``comm.Allreduce``.

    ``sendbuf`` is a NumPy array, an mpi4py buffer spec (``[buf, MPI.FLOAT]``,
    ``[buf, count, MPI.FLOAT]``), ``MPI.IN_PLACE`` or None (in place, as in mpi4py);
    ``recvbuf`` an array or a buffer spec. ``op`` None means ``MPI.SUM``. A call
    ringmpi cannot carry out itself (long double, MINLOC and user-defined ops,
    derived datatypes, GPU memory, an inter-communicator) goes, under ``auto`` and
    ``"mpi"``, to the library's own ``comm.Allreduce`` with the arguments as given;
    a named algorithm raises :class:`~ringmpi.UnsupportedError` (a TypeError)
    naming what it cannot do. ``comm`` None means
    ``MPI.COMM_WORLD``. ``algorithm`` is a name from the registry (``"auto"``,
    ``"ring"``, ``"mpi"``). ``validate`` (default:
    the ``RINGMPI_VALIDATE`` environment variable) first checks that every rank
    agrees on count, dtype, op and algorithm, and raises the same RingMPIError
    on every rank when they do not. ``timeout`` (seconds; default: the
    ``timeout`` setting, ``RINGMPI_TIMEOUT``, none when unset or 0): a rank that
    waits that long for another without progress raises RingMPIError naming
    both ranks, the algorithm, phase and step. ``reproducible`` (default: the
    ``reproducible`` setting): reduce in rank order, so that the result is
    bitwise the same whatever the algorithm and the placement of ranks. The
    defaults are :func:`ringmpi.configure`'s settings.
    """
    # A repeat of an earlier call on the very same objects (a ringmpi._repeat.Entry),
    # run here, inline, as it is the hot path. Its call's in_place and from_ check the
    # arrays (compiled, for the library's call) and sends nothing if they changed.
    hit = _latest.get(id(recvbuf))
    if hit is not None:
        recv_ref, send_ref, args, settings, made, _ = hit
        if (
            recv_ref() is recvbuf
            and (op, comm, algorithm, validate, timeout, reproducible) == args
            and _NOW[0] is settings
            and not _TRACES
            and not _PENDING
        ):
            if send_ref is None:
                in_place_call = sendbuf is _IN_PLACE or sendbuf is None
                err = made.in_place(recvbuf, made.cells) if in_place_call else _STALE
            else:
                err = made.from_(recvbuf, sendbuf, made.cells) if send_ref() is sendbuf else _STALE
            if not err:
                return
            if err != _STALE:
                raise MPI.Exception(err)
    if sendbuf is None:  # mpi4py takes None as in place
        sendbuf = MPI.IN_PLACE
    if op is None:
        op = MPI.SUM
    key = (id(recvbuf), id(sendbuf), id(op), id(comm), algorithm, validate, timeout, reproducible)
    found = _entries.get(key)
    if found is not None and found is not hit:  # several calls on one recvbuf take turns
        _latest[id(recvbuf)] = found
        return Allreduce(sendbuf, recvbuf, op, comm, algorithm=algorithm, validate=validate,
                         timeout=timeout, reproducible=reproducible)  # fmt: skip
    given = (key, sendbuf, recvbuf, op, comm)
    call = _parse(sendbuf, recvbuf, op, comm, algorithm, validate, timeout, reproducible)
    if call.library:
        _library_allreduce(sendbuf, recvbuf, op, call.comm, call.timeout)
        return
    # Not the library's: _arrays made the call, from a checked intracommunicator.
    assert call.recv is not None and call.red is not None
    assert isinstance(call.comm, MPI.Intracomm)
    done = _run(call.send, call.recv, call.nitems, call.red, call.comm, algorithm, call.validate,
                call.timeout, call.ordered)  # fmt: skip
    if done is not None:
        _repeat.remember(given, call.send, call.recv, call.nitems, *done)


class _Call(NamedTuple):
    """A checked call: its arrays, reduction and settings; or, with ``library`` set,
    one that goes to the MPI library's own collective with the arguments as given."""

    comm: MPI.Comm
    timeout: float
    library: bool = False
    send: np.ndarray | None = None
    recv: np.ndarray | None = None
    nitems: int = 0  # recv's elements the call reduces (not `count`: tuple.count)
    red: Reduction | None = None
    validate: bool = False
    ordered: bool = False


def _parse(sendbuf: Any, recvbuf: Any, op: Any, comm: Any, algorithm: str, validate: bool | None,
           timeout: float | None, reproducible: bool | None) -> _Call:  # fmt: skip
    """Check an all-reduce's arguments (errors before any message). What ringmpi cannot
    reduce itself (:class:`~ringmpi._errors.UnsupportedError`) goes to the library under
    ``auto`` and ``mpi``; a named algorithm raises."""
    algorithms.lookup(algorithm)
    settings = _settings.current()
    waits = settings.timeout if timeout is None else _settings.parse_seconds(timeout, "timeout")
    if isinstance(comm, MPI.Intercomm) and comm != MPI.COMM_NULL:
        why = "comm is an inter-communicator"
    else:
        comm = check_comm(comm)
        try:
            return _arrays(sendbuf, recvbuf, op, comm, waits, settings, validate, reproducible)
        except UnsupportedError as exc:
            why = str(exc)  # not the exception: its frames hold views of the buffers
    if algorithm not in ("auto", "mpi"):
        raise UnsupportedError(
            f"{why}; algorithm {algorithm!r} cannot run this call (auto and 'mpi' hand it "
            "to the MPI library's own collective)"
        ) from None
    return _Call(comm, waits, library=True)


def _arrays(sendbuf: Any, recvbuf: Any, op: Any, comm: MPI.Intracomm, waits: float, settings,
            validate: bool | None, reproducible: bool | None) -> _Call:  # fmt: skip
    recv = _as_array(recvbuf, "recvbuf")
    if not recv.flags.writeable:
        raise ValueError(f"recvbuf is read-only{_kind(recvbuf)}")
    if sendbuf is MPI.IN_PLACE:
        send = None
        count = recv.size
    else:
        send = _as_array(sendbuf, "sendbuf")
        if send.dtype != recv.dtype:
            raise TypeError(
                f"recvbuf has dtype {recv.dtype} but sendbuf has dtype {send.dtype}; "
                "they must be the same"
            )
        count = send.size
        if recv.size < count:
            raise ValueError(
                f"recvbuf too small: it holds {recv.size} elements, sendbuf has {count}"
            )
        if np.may_share_memory(send, recv):
            raise ValueError("sendbuf and recvbuf overlap; pass MPI.IN_PLACE as sendbuf instead")
    red = reduction(op, recv.dtype)
    ordered = settings.reproducible if reproducible is None else bool(reproducible)
    checked = settings.validate if validate is None else validate
    return _Call(comm, waits, False, send, recv, count, red, checked, ordered)


def _library_allreduce(sendbuf: Any, recvbuf: Any, op: Any, comm: MPI.Comm,
                       timeout: float) -> None:  # fmt: skip
    """The library's own all-reduce on the user's communicator, the arguments as given
    (a call ringmpi cannot carry out itself). With a timeout, the nonblocking one,
    polled: MPI does not say which rank it waits for."""
    if _trace._active:
        _trace.record_call("mpi")
    if not timeout:
        MPI.Comm.Allreduce(comm, sendbuf, recvbuf, op)
        return
    if not polled(MPI.Comm.Iallreduce(comm, sendbuf, recvbuf, op), timeout):
        raise RingMPIError(
            f"rank {comm.Get_rank()}: the library's MPI_Iallreduce: waited {timeout:g} s "
            "for the other ranks (MPI does not say which) without progress (timeout)"
        )


# What the hot path reads, as module globals (one lookup each).
_NOW, _TRACES, _PENDING = _settings._now, _trace._active, _progress.pending
_IN_PLACE, _STALE = MPI.IN_PLACE, algorithms.STALE
_entries, _latest = _repeat.entries, _repeat.latest
_WINDOWS = algorithms.symmetric.regions

# What users call: a builtin that runs repeats of the library's call from C
# (ringmpi._direct) and every other call through the function above.
_python_allreduce = Allreduce
Allreduce = _direct.entry(_python_allreduce)


def allreduce(
    array: Any,
    op: Any = MPI.SUM,
    comm: MPI.Intracomm | None = None,
    *,
    algorithm: str = "auto",
    validate: bool | None = None,
    timeout: float | None = None,
    reproducible: bool | None = None,
) -> np.ndarray:
    """Return a new array: the all-reduce of ``array`` over ``comm`` (same shape and dtype)."""
    send = np.asarray(array)
    result = np.empty(send.shape, send.dtype)
    Allreduce(send, result, op, comm, algorithm=algorithm, validate=validate, timeout=timeout,
              reproducible=reproducible)  # fmt: skip
    return result


def warm(dtype: Any = np.float32, op: Any = MPI.SUM, comm: MPI.Intracomm | None = None, *,
         timeout: float | None = None) -> float:  # fmt: skip
    """Compile (or load from Numba's cache) every algorithm's loops for ``op`` on
    ``dtype`` now, before a program starts timing; collective over ``comm``.

    Where a node's ranks outnumber its cores, the node's first rank compiles into
    Numba's cache while the others wait, sleeping, then load what it wrote; with
    a core each, every rank compiles at once (a first call does the same for the
    algorithm it runs, unasked). Then a first call, its repeats and a nonblocking
    call run once on a duplicate of ``comm`` (freed after, with its window; not
    inside a trace), so that a program's first call on any communicator pays
    only for that communicator (its duplicate, its window), not for Python run
    the first time in the process; before that, once per process and layout,
    auto's candidates and the library's call are timed on buffers of 16 MiB taken
    in turn (twice the last-level cache between a buffer's uses, at most eight
    buffers; a few tenths of a second at 2 ranks), which auto's choice from that
    size goes by. ``timeout``: as for :func:`Allreduce`.
    Returns the slowest rank's seconds of loading.
    """
    comm = check_comm(comm)
    settings = _settings.current()
    waits = settings.timeout if timeout is None else _settings.parse_seconds(timeout, "timeout")
    ctx = context(comm, waits)
    red = reduction(op, dtype)
    took = algorithms.warm_on_node(ctx, red, None, waits)
    ctx.warmed.update((a.name, red.name, red.dtype.str) for a in algorithms.records())
    took = ctx.comm.allreduce(took, op=MPI.MAX)
    if not _trace._active:  # (a trace would count its calls)
        _rehearse(comm, red, op, waits)
    return took


def _rehearse(comm: MPI.Intracomm, red: Reduction, op: Any, timeout: float) -> None:
    """Auto's first call, its repeats and a nonblocking call of ringmpi's own, on a
    duplicate of ``comm`` freed after: the tuner off (nothing of a size class is
    tried or counted), the model's best running; before them auto's candidates timed
    on a large buffer, once per process and layout (:func:`ringmpi.algorithms.calibrate`)."""
    nonblocking = importlib.import_module("ringmpi._requests")  # (it imports this module)
    twin = comm.Dup()
    try:
        # The tuner's evidence first: the calls below bring back into the cache what a
        # program's first call runs, which the evidence's buffers push out.
        if not red.half and _settings.current().tuner != "off":
            algorithms.calibrate(ready(twin, timeout), red, timeout)
        x = np.zeros(max(1, comm.Get_size()), red.dtype)
        with configured(tuner="off"):
            for _ in range(3):
                Allreduce(_IN_PLACE, x, op, twin, timeout=timeout)
            best = algorithms.choose("auto", x.nbytes, context(twin, timeout), red)
            nonblocking.Iallreduce(_IN_PLACE, x, op, twin, algorithm=best.name,
                                   timeout=timeout).Wait()  # fmt: skip
    finally:
        twin.Free()


# --- internals -----------------------------------------------------------------


def _run(
    send: np.ndarray | None,
    recv: np.ndarray,
    count: int,
    red: Reduction,
    comm: MPI.Intracomm,
    algorithm: str,
    validate: bool,
    timeout: float = 0.0,
    reproducible: bool = False,
):
    """Run the call; returns (``make``, at once): ``make()`` gives the call made ready
    (:class:`~ringmpi.algorithms.Call`) for its repeats, to be remembered at once (a
    call of auto's lead between trials, counted) or at its first repeat; None where it
    is not to be repeated so (a validated call, a trial of auto's tuner, the lead's
    call of a large class)."""
    if (_WINDOWS and algorithm == "auto" and _settings.current().algorithm == "auto"
            and algorithms.symmetric.pays(recv, send, count, red)):  # fmt: skip
        algorithm = "symmetric"  # window-resident arrays: read where they lie (as auto)
    ctx = ready(comm, timeout)
    algo = algorithms.choose(algorithm, count * recv.itemsize, ctx, red, reproducible)
    if validate:
        _validate(ctx, count, red, algo.name, timeout)

    # The work array: recvbuf itself when its first `count` elements are contiguous,
    # otherwise a contiguous copy written back at the end (C order, as MPI reads it).
    # A contiguous sendbuf is handed to the algorithm as `source`, so that it can read
    # the contribution from there and skip a copy; otherwise the contribution is
    # copied into `work` first and `source` is None.
    direct = recv.flags.c_contiguous
    if not direct:
        work = np.empty(count, recv.dtype)
    elif recv.ndim == 1 and recv.size == count:  # the common case: no view to make
        work = recv
    else:
        work = recv.reshape(-1)[:count]
    source = None
    if send is not None and send.flags.c_contiguous:
        source = send if send.ndim == 1 else send.reshape(-1)
    elif send is not None:
        np.copyto(work.reshape(send.shape), send)
    elif not direct:
        work[...] = recv.reshape(-1)[:count]  # reshape copies a non-contiguous array: C order

    loaded = (algo.name, red.name, red.dtype.str)
    if loaded not in ctx.warmed and not red.half:  # the first call: one rank per node compiles
        algorithms.warm_on_node(ctx, red, algorithms.get(algo.name), timeout)
        ctx.warmed.add(loaded)
    if _trace._active:  # (the trace counts the sends of the record's own run)
        _trace.record_call(algo.name)
        algo.run(work, red, ctx, source, timeout)
    elif isinstance(algo, algorithms.UNSETTLED):
        algo.run(work, red, ctx, source, timeout)
    else:  # the call made ready, as its repeats make it
        algorithms.prepared(algo, red, ctx, count, timeout).again(work, work if source is None
                                                                  else source)  # fmt: skip
    if not direct:
        if count == recv.size:
            recv[...] = work.reshape(recv.shape)
        else:
            recv.flat[:count] = work
    if validate or isinstance(algo, algorithms.Trial):
        return None
    if isinstance(algo, algorithms.Lead):  # its call, counted: remembered at once
        kept = functools.partial(algo.call, red, ctx, count, timeout), True
        return kept if algo.kept else None
    return functools.partial(algorithms.prepared, algo, red, ctx, count, timeout), False


def _validate(ctx: Context, count: int, red: Reduction, algorithm: str, timeout: float) -> None:
    """Every rank raises the same RingMPIError if the ranks disagree on the call."""
    mine = (count, red.dtype.name, red.name, algorithm)
    ctx.arrive(ctx.comm, "validation", timeout)
    everyone = ctx.comm.allgather(mine)
    for field, i in (("count", 0), ("dtype", 1), ("op", 2), ("algorithm", 3)):
        values = [v[i] for v in everyone]
        if len(set(values)) > 1:
            groups: dict[Any, list[int]] = {}
            for rank, v in enumerate(values):
                groups.setdefault(v, []).append(rank)
            said = "; ".join(f"{_ranks(r)} {v!r}" for v, r in groups.items())
            raise RingMPIError(f"ranks disagree on {field}: {said}")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 6:
        return "ranks " + ",".join(map(str, ranks[:4])) + f",... ({len(ranks)} ranks)"
    return "ranks " + ",".join(map(str, ranks))
