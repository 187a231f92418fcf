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
from .algorithms.registry import STALE, Call

__all__ = ["Entry", "entries", "latest", "python_seconds", "remember"]


class Entry(NamedTuple):
    """A remembered call: what confirms that a call is its repeat, and what runs it."""

    recv: weakref.ref  # recvbuf
    send: weakref.ref | None  # sendbuf; None: in place
    args: tuple  # (op, comm, algorithm, validate, timeout, reproducible), equal ones the same
    settings: _settings.Settings  # the snapshot it was made under
    # in_place(recvbuf, cells) and run(recvbuf, sendbuf, cells): 0, an MPI error code, or
    # STALE (nothing sent) when the arrays' shape, dtype or flags are no longer the call's
    in_place: Callable[..., int]
    run: Callable[..., int]
    cells: np.ndarray | None  # the call prepared as cells (the C repeat path's), if any
    # step(work, source, wait): the call started or carried on (registry.Call.step), if any
    step: Callable[[np.ndarray, np.ndarray, bool], bool | None] | None = None


# Room for a training step's arrays, one per parameter, often a few hundred
# (docs/performance.md has what too little room cost).
KEPT = 1024
# By the ids of (recvbuf, sendbuf, op, comm) and the other arguments.
entries: Bounded[tuple, Entry] = derived(Bounded(KEPT))
# Per recvbuf, the entry its latest call ran: one int lookup finds it.
latest: Bounded[int, Entry] = derived(Bounded(KEPT))
_seen: Bounded[tuple, None] = derived(Bounded(KEPT))  # keys met once
_STALE = STALE


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
    latest.put(id(recvbuf), entries.put(key, _entry(args, send, recv, make())))


def _entry(args: tuple, send, recv, call: Call) -> Entry:
    sendbuf, recvbuf, *rest = args
    settings = _settings.current()
    if call.cells is not None:
        assert call.in_place is not None and call.from_ is not None  # made with the cells
        in_place, run, cells = call.in_place, call.from_, call.cells
        if rest[2:] == ["auto", None, None, None]:  # no keyword but op and comm
            _direct.install(sendbuf, recvbuf, rest[0], rest[1], call.cells, settings)
    else:
        in_place, run, cells = *_checked(call.again, recv, send), None
    return Entry(weakref.ref(recvbuf), None if sendbuf is MPI.IN_PLACE else weakref.ref(sendbuf),
                 tuple(rest), settings, in_place, run, cells, call.step)  # fmt: skip


def _checked(again, recv: np.ndarray, send: np.ndarray | None) -> tuple:
    """(in_place, run) for ``again(work, source)``, which takes 1-D arrays of this
    call's dtype and size (and returns STALE where it sent nothing: a counted call,
    :func:`ringmpi.algorithms.tuner.counted`): each checks the arrays first."""
    shape, dtype = recv.shape, recv.dtype
    send_shape = None if send is None else send.shape
    flat = recv.ndim != 1 or (send is not None and send.ndim != 1)

    def in_place(recvbuf: np.ndarray, _) -> int:
        if recvbuf.shape != shape or recvbuf.dtype is not dtype or not recvbuf.flags.carray:
            return _STALE  # carray: C-contiguous, aligned and writeable, in one lookup
        work = recvbuf.reshape(-1) if flat else recvbuf  # a view of the same memory
        # STALE: a counted call with none left sent nothing
        return _STALE if again(work, work) == _STALE else 0

    def run(recvbuf: np.ndarray, sendbuf: np.ndarray, _) -> int:
        if (
            recvbuf.shape != shape
            or recvbuf.dtype is not dtype
            or not recvbuf.flags.carray
            or sendbuf.shape != send_shape
            or sendbuf.dtype is not dtype
            or not sendbuf.flags.c_contiguous
        ):
            return _STALE
        if flat:
            return _STALE if again(recvbuf.reshape(-1), sendbuf.reshape(-1)) == _STALE else 0
        return _STALE if again(recvbuf, sendbuf) == _STALE else 0

    return in_place, run


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
        in_place, run = _checked(lambda work, source: None, a, None)
        args = (MPI.SUM, None, "auto", None, None, None)
        latest[id(a)] = Entry(weakref.ref(a), None, args, _settings.current(), in_place, run,
                              None)  # fmt: skip
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
