"""Window-resident ("symmetric") arrays: an all-reduce that reads the others' data where it lies.

``ringmpi.empty`` and ``ringmpi.zeros`` (collective over a communicator whose
ranks share one node) place each rank's array in a node window, at the same
place of every rank's segment::

    rank 0's segment:  [header | array ........................]
    rank 1's segment:  [header | array ........................]
                                 chunk 0      | chunk 1

An all-reduce of such arrays copies no buffer into a window first. Rank r owns
chunk r (``r * n // L`` to ``(r + 1) * n // L``, L ranks) of every rank's
array, and is the only rank that reads or writes it: a block at a time, it
folds block k of chunk r of every rank's input, in rank order, into a scratch
that stays in cache, and stores the folded block into chunk r of every
rank's output. A reduce-scatter and an all-gather in one pass, with two waits
on the ranks' flags (one each in their headers): every input is ready; every
rank has stored its chunk, before any array may change again.

Memory traffic a rank: it reads its chunk of every input (n) and writes its
chunk of every output (n; in place, the lines it has just read, still in its
cache): 2 n, what one copy of the array moves, against shared_memory's copy
of the user's buffer into its window, fold and copy out. Ordinary stores, not
streaming ones: in place, the fold has just brought the lines into this core's
cache, and a streaming store to a cached line costs more than writing the line
back. Every element is folded once, in rank order, and stored: the result is
the left fold in rank order, bitwise the same on every rank.

With the ``threads`` setting above 1, the pass runs on that many threads of
Numba's pool (:func:`_threaded`), thread t on part t of the chunk: every
element is folded and stored as on one thread, so the bits do not depend on
the count.

Every rank must pass the same place of the same allocation (each announces
its count, (op, dtype) and places in its header, and every rank raises where
one differs). Arrays of other memory go through shared_memory's window (the
same fold, the same bits); a rank whose array is window-resident waits for the
others in its window, so every rank must pass such arrays or none. The windows
are freed with the communicator: an array from ``ringmpi.empty`` must not be
used after that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
from mpi4py import MPI

from .. import _host, _settings
from .._capi import handle
from .._comm import Context, check_comm, context
from .._errors import RingMPIError
from .._ops import divide_by, fold_in_order_by_code
from .._report import DISAGREE, HEADER, TIMED_OUT, header, parameters, raise_from
from .._shm import all_up, node_window, raise_flag
from ..kernels import Reduction
from .registry import fits, get, register

__all__ = ["AUTO_FROM_BYTES", "MOST_WINDOWS", "empty", "pays", "regions", "resident", "warm",
           "zeros"]  # fmt: skip

_HEADER_BYTES = 4096  # a rank's segment opens with its header, then the array
_ROUND = 4096  # an array's bytes, rounded up: every segment the same size
# Header cells (int64): the flag, then what this rank's call announces.
_FLAG, _COUNT, _TAG, _SRC, _DST = range(5)
# The loop's parameters after the report header.
_RANK, _SIZE, _FSTRIDE, _LSTRIDE, _WIN, _NPARAMS = range(HEADER, HEADER + 6)
_BLOCK = 2048  # lanes folded at a time into the scratch
_WAITS = ("every rank's input to be ready", "every rank to store its chunk")
_PLACE = -1  # a DISAGREE report's count: the ranks' arrays lie at other places
# Live windows a process may hold: each holds a communicator, and MPICH's run out
# near 2,000 (a crash, not an error).
MOST_WINDOWS = 1024


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _copy(dst, at, src, frm, k):
    """``dst[at : at + k] = src[frm : frm + k]``, as a loop over two slices, which LLVM
    vectorizes."""
    d, c = dst[at : at + k], src[frm : frm + k]
    for i in range(k):
        d[i] = c[i]


@numba.njit(cache=True, nogil=True)
def _everyone(flags, me, size, fstride, win, sleepy, timeout, err, wait):
    """Raise this rank's flag (at ``me``) and wait until every rank's has reached it:
    whether they all came; else the report names the first late rank, and ``wait``
    (the index of _WAITS: what it waited for)."""
    raise_flag(flags, me, win)
    late = all_up(flags, size, fstride, flags[me], win, sleepy, timeout, False)
    if late >= 0:
        err[0], err[1], err[2], err[3] = TIMED_OUT, wait, late, wait
        return False
    return True


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _allreduce(window, flags, src, dst, n, scratch, params, divisor):
    """All-reduce the ``n`` lanes at lane ``src`` of every rank's segment of ``window``
    into those at ``dst`` (the same in place); see the module docstring. ``flags``
    is the window as int64, ``params`` the report header, then _RANK ... cells,
    then the report."""
    code, tag, sleepy, timeout, _, _, err = header(params)
    rank, size, fstride, lstride, win = (params[_RANK], params[_SIZE], params[_FSTRIDE],
                                         params[_LSTRIDE], params[_WIN])  # fmt: skip
    err[0] = 0
    me = rank * fstride
    flags[me + _COUNT], flags[me + _TAG], flags[me + _SRC], flags[me + _DST] = n, tag, src, dst
    if not _everyone(flags, me, size, fstride, win, sleepy, timeout, err, 0):
        return
    for r in range(size):
        at = r * fstride
        if flags[at + _COUNT] != n or flags[at + _TAG] != tag:
            their_n, their_tag = flags[at + _COUNT], flags[at + _TAG]
            err[0], err[1], err[2], err[3], err[4] = DISAGREE, 0, r, their_n, their_tag
            return
        if flags[at + _SRC] != src or flags[at + _DST] != dst:
            err[0], err[1], err[2], err[3], err[4] = DISAGREE, 0, r, _PLACE, flags[at + _DST]
            return
    threads = scratch.shape[0]
    if threads > 1:
        _threaded(window, src, dst, n, rank, size, lstride, scratch, code, divisor)
    else:
        lo, hi = rank * n // size, (rank + 1) * n // size
        _fold_and_push(window, src, dst, lo, hi, scratch[0], lstride, size, code, divisor)
    _everyone(flags, me, size, fstride, win, sleepy, timeout, err, 1)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _fold_and_push(window, src, dst, lo, hi, scratch, lstride, size, code, divisor):
    """Lanes ``lo`` to ``hi`` of this rank's chunk, a block at a time: every rank's input
    at ``src`` folded in rank order into ``scratch``, then stored at ``dst`` of every
    rank's segment."""
    j = lo
    while j < hi:
        b = min(scratch.size, hi - j)
        acc = scratch[:b]
        fold_in_order_by_code(acc, acc, window, lstride, src + j, -1, size, code)
        if divisor.size > 0:
            divide_by(acc, divisor)
        for r in range(size):
            _copy(window, r * lstride + dst + j, acc, 0, b)
        j += b


@numba.njit(cache=True, nogil=True, parallel=True, error_model="numpy")
def _threaded(window, src, dst, n, rank, size, lstride, scratch, code, divisor):
    """:func:`_fold_and_push` on ``scratch.shape[0]`` threads, each its own part of the
    chunk: the same elementwise folds and stores as one thread's, so the same bits."""
    threads = scratch.shape[0]  # one part each (Numba's pool has at least as many threads)
    lo, hi = rank * n // size, (rank + 1) * n // size
    for t in numba.prange(threads):
        a, b = lo + t * (hi - lo) // threads, lo + (t + 1) * (hi - lo) // threads
        _fold_and_push(window, src, dst, a, b, scratch[t], lstride, size, code, divisor)


@dataclass(eq=False)
class _Allocation:
    """One ``ringmpi.empty``: a node window, its rank segments all ``segment`` bytes."""

    ctx: Context
    win: MPI.Win
    flat: np.ndarray  # the whole window, bytes: rank r's segment from r * segment
    segment: int
    nbytes: int  # the array's bytes
    start: int  # the address of this rank's array
    calls: dict[tuple, tuple] = field(default_factory=dict)  # by (op and dtype's tag, timeout)

    def free(self) -> None:
        regions[:] = [r for r in regions if r[2] is not self]
        self.win.Unlock_all()
        self.win.Free()


class _Windows:
    """A communicator's allocations (the record's state), freed with it; made by the
    first ``ringmpi.empty`` on it, which every rank of its node calls."""

    def __init__(self, ctx: Context) -> None:
        self.made: list[_Allocation] = []
        # this rank's share of the node's cores (its affinity mask against the others'):
        # the threads of its calls by default
        self.cores = _host.cores_share(ctx.node.allgather(_host.affinity()),
                                       ctx.node.Get_rank())  # fmt: skip

    def free(self) -> None:
        for a in self.made:
            a.free()
        self.made.clear()


# This rank's arrays: (first address, end address, allocation); empty almost always,
# so that a call tests nothing more.
regions: list[tuple[int, int, _Allocation]] = []


def empty(shape: Any, dtype: Any = np.float32, comm: MPI.Intracomm | None = None) -> np.ndarray:
    """A C-contiguous array of ``shape`` and ``dtype`` in a node window, uninitialized:
    collective over ``comm`` (default ``MPI.COMM_WORLD``), whose ranks must share one
    node and ask for the same shape and dtype. ``ringmpi.Allreduce`` (auto, or
    ``algorithm="symmetric"``) of such arrays, in place or from one to another of
    the same allocation, reads the others' data where it lies. Freed with ``comm``."""
    given = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    dims = tuple(int(d) for d in given)
    kind = np.dtype(dtype)
    if any(d < 0 for d in dims):
        raise ValueError(f"ringmpi.empty: negative dimensions in shape {dims}")
    nbytes = math.prod(dims) * kind.itemsize
    if len(regions) >= MOST_WINDOWS:
        raise RuntimeError(f"ringmpi.empty: {len(regions)} windows are live in this process, "
                           "the most it makes (each holds a communicator, and MPI has few); "
                           "allocate fewer, larger arrays, or free a communicator that "
                           "holds some")  # fmt: skip
    ctx = context(check_comm(comm))
    if not fits(SYMMETRIC, ctx):
        raise ValueError(f"ringmpi.empty: window-resident arrays need every rank of the "
                         f"communicator on one node; {ctx.size} ranks span "
                         f"{ctx.nodes(_settings.current())[0]} nodes")  # fmt: skip
    sizes = ctx.comm.allgather(nbytes)
    if len(set(sizes)) > 1:
        raise ValueError(f"ringmpi.empty: ranks disagree on the array's bytes: {sizes} by rank")
    segment = _HEADER_BYTES + -(-max(nbytes, 1) // _ROUND) * _ROUND
    win, flat = node_window(ctx.node, segment)
    flat[ctx.rank * segment : ctx.rank * segment + _HEADER_BYTES] = 0
    ctx.node.Barrier()  # every header zeroed before any rank raises its flag
    at = ctx.rank * segment + _HEADER_BYTES
    array = flat[at : at + nbytes].view(kind).reshape(dims)
    made = _Allocation(ctx, win, flat, segment, nbytes, int(array.ctypes.data))
    ctx.state(SYMMETRIC).made.append(made)
    regions.append((made.start, made.start + nbytes, made))
    return array


def zeros(shape: Any, dtype: Any = np.float32, comm: MPI.Intracomm | None = None) -> np.ndarray:
    """:func:`empty`, filled with zeros."""
    array = empty(shape, dtype, comm)
    array[...] = 0
    return array


# Auto runs it from this size: below, shared_memory's pieces through a window in
# cache are as fast or faster (the waits on every rank cost more than they save);
# from 1 MiB, off the cache, it took 0.54-0.67 of shared_memory's time and of
# the library's (docs/performance.md).
AUTO_FROM_BYTES = 1 << 20


def pays(recv: np.ndarray, send: np.ndarray | None, count: int, red: Reduction) -> bool:
    """Whether auto runs this call of ``count`` elements as ``symmetric``: the arrays
    window-resident (both, from one allocation; ``send`` None: in place), C-contiguous,
    at least AUTO_FROM_BYTES, not a half type."""
    if red.half or count != recv.size or count * recv.itemsize < AUTO_FROM_BYTES:
        return False
    if not recv.flags.c_contiguous or (send is not None and not send.flags.c_contiguous):
        return False
    out = resident(recv)
    return out is not None and (send is None or (resident(send) or (None,))[0] is out[0])


def resident(array: np.ndarray, ctx: Context | None = None) -> tuple[_Allocation, int] | None:
    """(allocation, byte offset in this rank's segment) of ``array`` if it lies in a
    window of ``ringmpi.empty`` (on ``ctx``'s communicator, where given), else None."""
    if not regions:
        return None
    start = array.ctypes.data
    end = start + array.nbytes
    for first, last, made in regions:
        if first <= start and end <= last and (ctx is None or made.ctx is ctx):
            return made, start - (first - _HEADER_BYTES)
    return None


def symmetric_run(work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None,
                  timeout: float = 0.0) -> None:  # fmt: skip
    """Window-resident arrays: each rank folds its chunk from the others' arrays where
    they lie, then copies the others' chunks."""
    out = resident(work, ctx)
    inp = out if source is None else resident(source, ctx)
    if out is None or inp is None or inp[0] is not out[0]:  # the same result, through a copy
        get("shared_memory").run(work, red, ctx, source, timeout)
        return
    made = out[0]
    lanes = red.lanes(np.zeros(0, red.dtype)).dtype
    threads = _host.threads(_settings.current().threads, ctx.state(SYMMETRIC).cores)
    key = (red.tag, timeout, threads)
    found = made.calls.get(key)
    if found is None:
        params = parameters(_NPARAMS, code=red.code, tag=red.tag, sleepy=ctx.sleepy,
                            timeout=timeout)  # fmt: skip
        params[_RANK:_NPARAMS] = (ctx.rank, ctx.size, made.segment // 8,
                                  made.segment // lanes.itemsize, handle(made.win))  # fmt: skip
        scratch = np.empty((threads, _BLOCK), lanes)  # a row a thread
        found = made.calls[key] = (params, made.flat.view(lanes), made.flat.view(np.int64),
                                   red.divisor(ctx.size), scratch)  # fmt: skip
    params, window, flags, divisor, scratch = found
    per = work.dtype.itemsize // lanes.itemsize
    n = work.size * per
    if ctx.size == 1:
        if source is not None:
            work[...] = source
        return
    _allreduce(window, flags, inp[1] // lanes.itemsize, out[1] // lanes.itemsize, n, scratch,
               params, divisor)  # fmt: skip
    if params.item(_NPARAMS):
        _raise(params[_NPARAMS:], n // per, red, ctx, timeout)


def _raise(report: np.ndarray, count: int, red: Reduction, ctx: Context, timeout: float) -> None:
    cells = report.copy()
    if cells[0] == DISAGREE and cells[3] == _PLACE:
        raise RingMPIError(f"rank {ctx.rank}: symmetric: rank {cells[2]}'s arrays lie at another "
                           "place of the window than this rank's: every rank must pass the same "
                           "place of the same allocation of ringmpi.empty")  # fmt: skip
    per = red.lanes(np.zeros(1, red.dtype)).size
    if cells[0] == DISAGREE:
        cells[3] //= per
    raise_from(cells, ctx, timeout, lambda phase: f"rank {ctx.rank}: symmetric phase {phase}",
               lambda r: f"rank {r}", count=count, tag=red.tag,
               waiting=lambda who, stage: f"{who} ({_WAITS[stage]})")  # fmt: skip


def warm(kinds) -> None:
    """Compile (or load from Numba's cache) the loop for each lanes dtype in ``kinds``."""
    i64 = numba.typeof(np.zeros(1, np.int64))
    for dt in kinds:
        arr, rows = numba.typeof(np.zeros(1, dt)), numba.typeof(np.zeros((1, 1), dt))
        _allreduce.compile((arr, i64, numba.int64, numba.int64, numba.int64, rows, i64, arr))


# Arrays of other memory (and the half types) go through shared_memory's window: the
# same fold in rank order, so the same bits. Auto runs it where the arrays are
# window-resident (ringmpi._api), and nowhere else.
SYMMETRIC = register("symmetric", symmetric_run, one_node=True, auto=False, keeps_order=True,
                     state=_Windows, half=get("shared_memory").half, warm=warm)  # fmt: skip


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
