"""Numba's on-disk cache with several writers (ringmpi._numba_cache): each index update
waits for the lock on the cache's folder, so a second process reads the first one's
index before it picks a data file."""

from __future__ import annotations

import fcntl
import os
import threading

from numba.core import caching

import ringmpi._ops  # noqa: F401  (a module that compiles: it installs the lock)


def test_an_index_update_waits_for_the_folder_lock(tmp_path):
    first = caching.IndexDataCacheFile(str(tmp_path), "f-1.py311", ("stamp", 1))
    second = caching.IndexDataCacheFile(str(tmp_path), "f-1.py311", ("stamp", 1))
    first.save(("sig-a",), b"A")
    held = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    writer = threading.Thread(target=second.save, args=(("sig-b",), b"B"))
    writer.start()
    writer.join(0.5)
    waited = writer.is_alive()
    before = sorted(p.name for p in tmp_path.iterdir())
    os.close(held)
    writer.join(10)
    assert waited and not writer.is_alive()
    assert before == ["f-1.py311.1.nbc", "f-1.py311.nbi"]  # nothing written while it waited
    # the second writer read the first one's index: a data file of its own
    assert first.load(("sig-a",)) == b"A" and second.load(("sig-b",)) == b"B"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "f-1.py311.1.nbc", "f-1.py311.2.nbc", "f-1.py311.nbi"
    ]  # fmt: skip
