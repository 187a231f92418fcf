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
(``Algorithm.compiled``), repeats with positional arguments and keywords ``op``
and ``comm`` run from C (:mod:`ringmpi._direct`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from . import _direct, _progress, _settings, _trace
from ._cache import Bounded, derived
from .algorithms.registry import Call, repeats

__all__ = ["Entry", "entries", "latest", "python_seconds", "remember"]


class Entry(NamedTuple):
    """A remembered call: what confirms that a call is its repeat, and the call."""

    recv: weakref.ref  # recvbuf
    send: weakref.ref | None  # sendbuf; None: in place
    args: tuple  # (op, comm, algorithm, validate, timeout, reproducible), equal ones the same
    settings: _settings.Settings  # the snapshot it was made under
    call: Call  # its in_place and from_ make it on these arrays (STALE: they changed)


# Room for a training step's arrays, one per parameter, often a few hundred
# (docs/performance.md has what too little room cost).
KEPT = 1024
# By the ids of (recvbuf, sendbuf, op, comm) and the other arguments.
entries: Bounded[tuple, Entry] = derived(Bounded(KEPT))
# Per recvbuf, the entry its latest call ran: one int lookup finds it.
latest: Bounded[int, Entry] = derived(Bounded(KEPT))
_seen: Bounded[tuple, None] = derived(Bounded(KEPT))  # keys met once


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
        # a call that took the full path as calls were queued (the progress thread's)
        # is remembered once: the step a queued call takes is this entry's
        and (key not in entries or not _progress.pending)
    )
    if not simple:
        return
    if key not in _seen and not at_once:  # not a repeat (yet)
        _seen.put(key, None)
        return
    args = (sendbuf, recvbuf, op, comm, algorithm, validate, timeout_arg, reproducible)
    latest.put(id(recvbuf), entries.put(key, _entry(args, make())))


def _entry(args: tuple, call: Call) -> Entry:
    sendbuf, recvbuf, *rest = args
    settings = _settings.current()
    if call.cells is not None and rest[2:] == ["auto", None, None, None]:  # op and comm alone
        _direct.install(sendbuf, recvbuf, rest[0], rest[1], call.cells, settings)
    return Entry(weakref.ref(recvbuf), None if sendbuf is MPI.IN_PLACE else weakref.ref(sendbuf),
                 tuple(rest), settings, call)  # fmt: skip


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
