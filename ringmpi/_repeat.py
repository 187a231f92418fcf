"""The API's remembered calls: a call on the very same objects as an earlier one repeats it.

A loop that all-reduces the same arrays again and again (gradients, residuals)
pays for the argument checks and lookups of :func:`ringmpi.Allreduce` on every
call, as much as a small MPI_Allreduce itself (docs/performance.md). So calls
are remembered -- their arrays by weak reference, with what was derived from
them -- and a call with the very same objects goes straight to the algorithm
(:class:`Entry`), after checking everything that could make it differ: the
arrays' shape, dtype and flags, the settings snapshot, an open trace (which
takes the full path, to be recorded), a queued nonblocking call (which a repeat
would overtake). A freed or broken-off communicator empties these caches
(``_cache.changed``). A call is remembered only once the same objects come a
second time, so that calls on ever new arrays (``allreduce()``, buffer specs) pay
almost nothing for it. Where the record prepares its call as cells
(``Algorithm.prepare``), repeats with positional arguments and keywords ``op``
and ``comm`` run from C (:mod:`ringmpi._direct`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from mpi4py import MPI

from . import _direct, _progress, _settings, _trace
from ._cache import Bounded, derived
from .algorithms.registry import STALE, Call, repeats

if TYPE_CHECKING:
    from ._requests import Decided

__all__ = ["UNMADE", "Entry", "entries", "found", "keep", "latest", "python_seconds",
           "remember"]  # fmt: skip


class Entry(NamedTuple):
    """A remembered call: what confirms that a call is its repeat, the blocking call
    made ready, and what a nonblocking call on the same objects decided."""

    recv: weakref.ref  # recvbuf
    send: weakref.ref | None  # sendbuf; None: in place
    args: tuple  # (op, comm, algorithm, validate, timeout, reproducible), equal ones the same
    settings: _settings.Settings  # the snapshot it was made under
    call: Call  # its in_place and from_ make it on these arrays (STALE: they changed)
    started: Decided | None = None  # what a nonblocking call decided


def _unmade(work: np.ndarray, source: np.ndarray) -> int:
    return STALE


# The call of an entry that only a nonblocking call made: it makes nothing (STALE), so
# that a blocking call on the same objects takes the full path and is remembered.
UNMADE = Call(_unmade, lambda recvbuf, cells: STALE, lambda recvbuf, sendbuf, cells: STALE)


# Room for a training step's arrays, one per parameter, often a few hundred
# (docs/performance.md has what too little room cost).
KEPT = 1024
# By the ids of (recvbuf, sendbuf, op, comm) and the other arguments.
entries: Bounded[tuple, Entry] = derived(Bounded(KEPT))
# Per recvbuf, the entry its latest call ran: one int lookup finds it.
latest: Bounded[int, Entry] = derived(Bounded(KEPT))
_seen: Bounded[tuple, None] = derived(Bounded(KEPT))  # keys met once
_IN_PLACE, _NOW = MPI.IN_PLACE, _settings._now


def _key(sendbuf: Any, recvbuf: Any, args: tuple) -> tuple:
    return (id(recvbuf), id(sendbuf), id(args[0]), id(args[1]), *args[2:])


def found(sendbuf: Any, recvbuf: Any, args: tuple) -> Entry | None:
    """The entry of a call on these very objects (``sendbuf`` MPI.IN_PLACE: in place;
    ``args`` as :class:`Entry`'s) under the current settings, if one is remembered:
    the one check of every kind of call."""
    entry = latest.get(id(recvbuf))
    if entry is None or not _same(entry, sendbuf, recvbuf, args):
        entry = entries.get(_key(sendbuf, recvbuf, args))
        if entry is None or not _same(entry, sendbuf, recvbuf, args):
            return None
    return entry


def _same(entry: Entry, sendbuf: Any, recvbuf: Any, args: tuple) -> bool:
    return (
        entry.recv() is recvbuf
        and entry.args == args
        and (entry.send() is sendbuf if entry.send is not None else sendbuf is _IN_PLACE)
        and entry.settings is _NOW[0]
    )


def keep(sendbuf: Any, recvbuf: np.ndarray, args: tuple, started: Decided) -> None:
    """Remember what a nonblocking call on these objects decided (``started``), beside
    the blocking call made ready, if any."""
    key = _key(sendbuf, recvbuf, args)
    entry = found(sendbuf, recvbuf, args)
    if entry is None:
        send = None if sendbuf is _IN_PLACE else weakref.ref(sendbuf)
        entry = Entry(weakref.ref(recvbuf), send, args, _settings.current(), UNMADE)
    latest.put(id(recvbuf), entries.put(key, entry._replace(started=started)))
    if args[2:] == _AUTO and _starts_in_c(started):
        _direct.defer(sendbuf, recvbuf, args[0], args[1])


_AUTO = ("auto", None, None, None)  # the keywords of a call the C table takes


def _starts_in_c(started: Decided | None) -> bool:
    """Whether a nonblocking call of what ``started`` decided may start in C."""
    return started is not None and started.own and _progress.deferrable(started.ctx)


def remember(given: tuple, send, recv, count: int, make: Callable[[], Call],
             at_once: bool = False) -> None:  # fmt: skip
    """Keep what a repeat of this call needs, if it can be repeated that way
    (``given``: the key, then sendbuf, recvbuf, op and comm as the call gave them;
    ``make()``: the call made ready, asked for at its first repeat, or now where
    ``at_once``)."""
    key, sendbuf, recvbuf, op, comm = given
    algorithm, validate, timeout_arg, reproducible = key[4:]
    simple = (
        isinstance(recvbuf, np.ndarray)
        and recvbuf.flags.c_contiguous
        and recv.size == count > 0
        and (
            sendbuf is MPI.IN_PLACE
            or (isinstance(sendbuf, np.ndarray) and sendbuf.flags.c_contiguous)
        )
        and not _trace._active  # a traced call takes the full path, to be recorded
    )
    if not simple:
        return
    if key not in _seen and not at_once:  # not a repeat (yet)
        _seen.put(key, None)
        return
    args = (op, comm, algorithm, validate, timeout_arg, reproducible)
    old = found(sendbuf, recvbuf, args)
    if old is not None and old.call is not UNMADE and _progress.pending:
        # a call that took the full path as calls were queued (the progress thread's)
        # is remembered once: the step a queued call takes is this entry's
        return
    call = make()
    settings = _settings.current()
    started = None if old is None else old.started
    if call.cells is not None and args[2:] == _AUTO:  # op and comm alone
        _direct.install(sendbuf, recvbuf, op, comm, call, settings)
        if _starts_in_c(started):
            _direct.defer(sendbuf, recvbuf, op, comm)  # its next nonblocking start in C
    send_ref = None if sendbuf is _IN_PLACE else weakref.ref(sendbuf)
    entry = Entry(weakref.ref(recvbuf), send_ref, args, settings, call, started)
    latest.put(id(recvbuf), entries.put(key, entry))


def python_seconds() -> float:
    """What the API's Python repeat path itself adds to a call, in seconds: a
    remembered call whose algorithm does nothing, timed (the fastest of five runs
    of 40 calls; measured once; 0 inside a trace, which takes the full path).
    Auto's tuner charges it to candidates that a repeat reaches through Python."""
    if _trace._active:
        return 0.0
    if not _SECONDS:
        call = _direct.entry_point()  # ringmpi.Allreduce
        a = np.zeros(1, np.float32)
        nothing = Call(_nothing, *repeats(_nothing, a.dtype, a.size))
        args = (MPI.SUM, None, "auto", None, None, None)
        latest[id(a)] = Entry(weakref.ref(a), None, args, _settings.current(), nothing)
        best = float("inf")
        try:
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(40):
                    call(MPI.IN_PLACE, a)
                best = min(best, (time.perf_counter() - t0) / 40)
        finally:
            latest.pop(id(a), None)
        _SECONDS.append(best)
    return _SECONDS[0]


_SECONDS: list[float] = []


def _nothing(work: np.ndarray, source: np.ndarray) -> None:
    """A call that does nothing (python_seconds times the path to it)."""
