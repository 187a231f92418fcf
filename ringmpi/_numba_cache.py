"""Numba's on-disk cache, safe for several processes that compile at once.

Numba keeps one index file per function (signature -> data file) and updates
it by reading it, adding an entry and writing it back. Two processes that
compile the same function for different signatures at once (the ranks of a
first run, or ``python -m ringmpi kernels --warm`` on every core) can each
take the same free data-file name: one entry is lost, or points at the other
signature's code. Importing this module makes each update of an index and its
data file one step under an exclusive ``flock`` on the cache's folder, so that
the second writer reads the first one's index. Reading is unchanged (an index
and a data file are each replaced whole).

Every ringmpi module that compiles imports this one first (through
``ringmpi._capi``, ``ringmpi._copy`` and ``ringmpi._ops``).

It also watches Numba compile ringmpi's own functions: a first use of a dtype
and op on a machine compiles for tens of seconds, which looks like a hang. Once
a run of compiles has gone on for :data:`SLOW` seconds, the process's rank 0
says so, once, as a :class:`CompileWarning` (``warnings.filterwarnings("ignore",
category=ringmpi.CompileWarning)`` silences it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
import types
import warnings
from typing import Any

from numba.core import caching, event

__all__ = ["SLOW", "CompileWarning", "locked"]


class CompileWarning(UserWarning):
    """ringmpi compiles its loops into Numba's cache: a first use of a dtype and op on
    a machine, for seconds to minutes; later runs load them in about a second."""


CompileWarning.__module__ = "ringmpi"  # as the API names it

# Seconds of compiling, in one run of compiles, before the warning.
SLOW = 3.0
# A compile that starts this long after the last one ended starts a new run.
_APART = 1.0

try:
    import fcntl
except ImportError:  # not POSIX: Numba's own behaviour
    fcntl = None  # type: ignore[assignment]


def locked(method: Any) -> Any:
    """``method`` of a Numba cache file, run under an exclusive lock on its folder."""
    if getattr(method, "_ringmpi_locked", False):
        return method

    @functools.wraps(method)
    def run(self: Any, *args: Any) -> Any:
        try:
            fd = os.open(self._cache_path, os.O_RDONLY)
        except (AttributeError, OSError):  # not a folder's cache file as we know it
            return method(self, *args)
        try:
            # (a file system without locks, as some NFS: unlocked, Numba's own way)
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX)
            return method(self, *args)
        finally:
            os.close(fd)  # (closing releases the lock)

    run._ringmpi_locked = True  # type: ignore[attr-defined]
    return run


_FILE = getattr(caching, "IndexDataCacheFile", None)
if fcntl is not None and _FILE is not None:
    for _name in ("save", "flush"):
        if hasattr(_FILE, _name):
            setattr(_FILE, _name, locked(getattr(_FILE, _name)))


class _Watch(event.Listener):
    """Numba's compile events for ringmpi's functions: the warning, once a run of them
    has taken :data:`SLOW` seconds."""

    def __init__(self) -> None:
        self.started = self.ended = 0.0
        self.running = 0
        self.said = False

    @staticmethod
    def _ours(ev: event.Event) -> bool:
        fn = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
        return getattr(fn, "__module__", "").startswith("ringmpi")

    def on_start(self, ev: event.Event) -> None:
        if self.said or not self._ours(ev):
            return
        now = time.monotonic()
        if not self.running and now - self.ended > _APART:
            self.started = now
        self.running += 1
        self._check(now, ev)

    def on_end(self, ev: event.Event) -> None:
        if self.said or not self._ours(ev):
            return
        self.running = max(0, self.running - 1)
        self.ended = time.monotonic()
        self._check(self.ended, ev)

    def _check(self, now: float, ev: event.Event) -> None:
        if now - self.started < SLOW or not _rank_zero():
            return
        self.said = True
        dtypes = [str(t.dtype) for t in (ev.data or {}).get("args", ()) if hasattr(t, "dtype")]
        where = os.environ.get("NUMBA_CACHE_DIR") or "beside the package"
        warnings.warn(
            f"ringmpi is compiling its loops{f' for {dtypes[0]}' if dtypes else ''} into "
            f"Numba's cache ({where}): the first use of a dtype and op on this machine takes "
            "10-30 s, minutes where the cores are busy; later runs load them in about a "
            "second (ringmpi.warm() does it before a program starts timing)",
            CompileWarning,
            stacklevel=_callers_level(),
        )


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside ringmpi, Numba and the helpers they
    call through: the program's call that led to the compile."""
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.split(".")[0] not in ("ringmpi", "numba", "llvmlite", "contextlib"):
            return level
        frame, level = frame.f_back, level + 1
    return 1


def _rank_zero() -> bool:
    """Whether this process is rank 0 of MPI's world, or not an MPI rank at all."""
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is None or not mpi.Is_initialized() or mpi.COMM_WORLD.Get_rank() == 0


event.register("numba:compile", _Watch())
