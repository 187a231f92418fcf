"""A node's shared memory: MPI shared-memory windows and flags ranks wait on.

Both shared-memory algorithms (``hierarchical`` and ``shared_memory``) keep one
window per node, made by ``MPI.Win.Allocate_shared`` and locked once for the
whole epoch (``Lock_all(MODE_NOCHECK)``), as MPI-4.0 section 12.7 describes.

Ranks hand data over through it with **flags**: int64 cells in the window that
a rank raises (an atomic store with release ordering, after ``MPI_Win_sync``)
and the others poll (atomic loads with acquire ordering, then
``MPI_Win_sync``), the pattern of MPI-4.0's Example 12.21 (a flag set after
``Win_sync`` and polled before it). The atomic accesses make the compiler
re-read a flag on every poll and keep a rank's data stores ahead of its flag
store, and its data loads behind its flag load; ``MPI_Win_sync`` is the memory
barrier MPI's model asks for around them. Flags only ever grow (a rank's count
of calls), so a rank waits for "every flag >= k", never for equality.
"""

from __future__ import annotations

import numba
import numpy as np
from mpi4py import MPI

from ._capi import load_acquire, monotonic_ns, mpi_win_sync, sched_yield, store_release

__all__ = ["NOT_YET", "all_up", "await_flags", "flag_barrier", "node_window", "raise_flag"]

# Polls before a waiting rank starts yielding its core between polls: a few
# microseconds of spinning, then the rank it waits for may be descheduled
# (more ranks than cores), and spinning on would keep it from running.
_SPINS = 2000


def node_window(node: MPI.Intracomm, capacity: int) -> tuple[MPI.Win, np.ndarray]:
    """A shared window of ``capacity`` bytes per local rank, locked for good, and all
    of it as one flat byte array: local rank k's segment starts at ``k * capacity``.

    MPI allocates the segments contiguously in local-rank order (the default
    without ``alloc_shared_noncontig``); this is checked, not assumed.
    """
    win = MPI.Win.Allocate_shared(capacity, 1, comm=node)
    win.Lock_all(MPI.MODE_NOCHECK)
    base, _ = win.Shared_query(0)
    # (mpi4py's stub gives MPI.buffer __buffer__ on Python 3.12+ only: ignored before)
    first = np.frombuffer(base, np.uint8, count=capacity)  # type: ignore[call-overload, unused-ignore]
    for r in range(1, node.Get_size()):
        buf, _ = win.Shared_query(r)
        if np.frombuffer(buf, np.uint8, count=1).ctypes.data != first.ctypes.data + r * capacity:  # type: ignore[call-overload, unused-ignore]
            win.Unlock_all()
            win.Free()
            raise RuntimeError("the MPI library did not lay the shared window out contiguously")
    flat = np.lib.stride_tricks.as_strided(
        first, shape=(node.Get_size() * capacity,), strides=(1,), writeable=True
    )
    return win, flat


@numba.njit(cache=True, nogil=True)
def await_flags(flags, size, stride, at, target, sleepy, timeout_ns):
    """Wait until ``flags[r * stride + at] >= target`` for every r < ``size``.

    Spins, then yields the core between polls (at once when ``sleepy``). With
    ``timeout_ns`` > 0, gives up when a flag has not moved for that long: returns
    the first r still below ``target`` then, or -1 once every flag is there.
    """
    for r in range(size):
        spins = 0
        start = 0
        while load_acquire(flags, r * stride + at) < target:
            spins += 1
            if sleepy or spins > _SPINS:
                sched_yield()
                # the clock only once spinning is over: timeouts are seconds
                if timeout_ns > 0 and (spins & 255) == 0:
                    now = monotonic_ns()
                    if start == 0:
                        start = now
                    elif now - start > timeout_ns:
                        return r
    return -1


# What all_up returns where it was asked not to wait and a flag is not there yet.
NOT_YET = -2


@numba.njit(cache=True, nogil=True)
def raise_flag(flags, at, win):
    """Raise the flag ``flags[at]`` by one, after this rank's stores to window ``win``
    (MPI_Win_sync, then a release store)."""
    mpi_win_sync(win)
    store_release(flags, at, flags[at] + 1)


@numba.njit(cache=True, nogil=True)
def all_up(flags, size, stride, target, win, sleepy, timeout_ns, nowait):
    """Whether every rank's flag (``flags[r * stride]``) has reached ``target``: -1
    once they have (waiting for them, unless ``nowait``; then MPI_Win_sync, so that
    this rank's later loads see the stores made before them), NOT_YET where
    ``nowait`` and one has not, or the rank the wait gave up on
    (:func:`await_flags`)."""
    if nowait:
        for r in range(size):
            if load_acquire(flags, r * stride) < target:
                return NOT_YET
        late = -1
    else:
        late = await_flags(flags, size, stride, 0, target, sleepy, timeout_ns)
    mpi_win_sync(win)
    return late


@numba.njit(cache=True, nogil=True)
def flag_barrier(flags, size, stride, me, win, sleepy, timeout_ns):
    """A barrier of the node's ranks through their flags (``flags[r * stride]``),
    ordering every rank's stores to window ``win`` before every rank's later
    loads: :func:`raise_flag`, then :func:`all_up` for this rank's count. Returns -1,
    or the local rank it gave up waiting for."""
    raise_flag(flags, me * stride, win)
    return all_up(flags, size, stride, flags[me * stride], win, sleepy, timeout_ns, False)
