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
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any

from numba.core import caching

__all__ = ["locked"]

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
