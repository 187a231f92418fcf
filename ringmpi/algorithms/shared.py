"""Shared-memory all-reduce on one node: a window, flags, and no message at all.

For buffers up to a few MiB the fastest all-reduce between ranks that share
memory sends no message. Each rank copies its contribution into its slot of a
node window (:mod:`ringmpi._shm`), raises its flag to the number of the call,
and waits until every rank's flag has reached it. Then, two ways:

* **whole** (pieces under SCATTER_BYTES): every rank folds the L slots in
  local-rank order into its own result: one synchronisation and one pass over
  L inputs per piece, against lg L message steps for recursive doubling.
* **sliced** (pieces of SCATTER_BYTES and more): the piece is cut into L
  slices. A rank publishes only the others' slices, folds its own slice over
  the L contributions (its own from its buffer) in local-rank order, into its
  buffer and into its slot (where it left that slice out), raises its flag
  again, and once every rank has, copies the other slices out of their
  owners' slots. A reduce-scatter and an all-gather through memory: each
  rank stores the piece once either way, but loads 2 (L - 1) / L of it from
  the others' slots instead of L - 1 times it, and folds a slice instead of
  the piece, for a second wait.

From STREAM_OUT_FROM on, a result written apart from its input goes to the
user's buffer with streaming stores (past the caches, not reading the lines
they overwrite); in place, the lines were just read and stay in cache, where
ordinary stores are cheaper.

Either way every element is folded in local-rank order (once, and copied, in
the sliced way), so the results are bitwise identical on every rank and equal
to the left fold in rank order.

The half types (float16, bfloat16) always take the whole way: every rank
reads all L 16-bit contributions, widens them to float32, folds them in
local-rank order, divides there for AVG, and rounds once
(:func:`ringmpi._half.fold_parts`), a piece at a time, so the fold reads what
the ranks just wrote, in cache. The window holds 16 bits an element; no
partial result is ever rounded.

A rank may write its slot again only when every rank has finished reading it:
the slots come in two sets used by alternate pieces (each rank counts its
pieces in its header). A rank starting a piece writes the set of the piece
before the last without a further wait: it saw every flag reach the last
piece's first number, and a rank raises its flag for a piece only after it
has read all of the piece before. Buffers larger than a set go through in
pieces of a set each.

A call that repeats runs the loop from C (:func:`compiled`): a C function per
lanes dtype makes the arrays from the addresses in the call's cells and calls
the loop, which the API's C repeat path (ringmpi._direct) reaches with no
Python between.

Each slot's header carries the count and the (op, dtype) code of the call:
ranks that disagree all see it at the first piece and raise (no slot is read
beyond the window's fixed size, whatever the counts). It needs every rank of
the communicator on one node; ``auto`` offers it only there.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from mpi4py import MPI

from .. import _direct, _host, _segments, _settings, _trace
from .._capi import (
    CELL_IN_PLACE,
    CELL_OWN,
    as_voidptr,
    handle,
    peek,
)
from .._comm import Context
from .._copy import stream_bytes
from .._half import fold_half_parts
from .._ops import divide_by, fold_in_order_by_code
from .._report import DISAGREE, HEADER, TIMED_OUT, header, parameters, raise_from
from .._shm import NOT_YET, all_up, node_window, raise_flag
from ..kernels import Reduction
from .registry import Algorithm, Call, compiled, plain, records, register

__all__ = ["CROWDED_SET_BYTES", "SCATTER_BYTES", "SET_BYTES", "STREAM_OUT_FROM", "prepare",
           "shared_memory_halves", "warm"]  # fmt: skip

# Bytes of data in each of a slot's two sets: one piece of a buffer.
SET_BYTES = 1 << 17
# Where the node's ranks outnumber the cores their affinity masks hold, a rank that
# waits for one the scheduler has put aside loses about a scheduler slice at the
# handoff (1.5 ms, 4 ranks on 2 cores beside two busy processes), and a piece costs
# two handoffs: there, sets of up to this many bytes, so that a call hands off a
# few times, not twice per SET_BYTES.
CROWDED_SET_BYTES = 1 << 22
# Pieces of at least this many bytes are cut into slices, one per rank (below).
SCATTER_BYTES = 1 << 14
# From this many bytes a result written apart from its input goes to the user's
# buffer with streaming stores, which do not read the lines they overwrite (as
# hierarchical's copies out).
STREAM_OUT_FROM = 1 << 20
_HEADER = 64  # a cache line of int64 cells: the flag, (count, code) per set, the piece count
_PIECE = 5  # header cell: pieces this rank has done; its parity is the next piece's set
# params cells (int64): the header (ringmpi._report), then these, then the report (the
# step is the piece). _SCATTER: SCATTER_BYTES in lanes; the loop leaves in _WROTE and
# _READ the lanes this rank stored to its slots and loaded from the others' slots (the
# trace's counts). An all-reduce that returned before its end (_NOWAIT) leaves in
# _STAGE where (_PUBLISHED: its piece is published; _SLICED: its slice is folded;
# either way it waits for every rank's flag), in _DONE the lanes before that piece.
(_RANK, _SIZE, _FSTRIDE, _DSTRIDE, _HDR, _CAP, _WIN, _SCATTER, _WROTE, _READ, _STAGE, _DONE,
 _NOWAIT, _STREAM_OUT, _NPARAMS) = range(HEADER, HEADER + 15)  # fmt: skip
_NEW, _PUBLISHED, _SLICED = 0, 1, 2


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _copy(dst, at, src, frm, k):
    """``dst[at : at + k] = src[frm : frm + k]``, as slices: a loop that indexes each
    array from its own start, which LLVM vectorizes."""
    d, c = dst[at : at + k], src[frm : frm + k]
    for i in range(k):
        d[i] = c[i]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _out(out, at, data, frm, k, stream):
    """``out[at : at + k] = data[frm : frm + k]``: into the user's buffer, with
    streaming stores (and a fence) where ``stream``."""
    if stream:
        stream_bytes(out[at : at + k].view(np.uint8), data[frm : frm + k].view(np.uint8))
    else:
        _copy(out, at, data, frm, k)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _shape_cells(params):
    """The call's layout cells: rank, size, the flags' and data's strides, the header's
    and a set's lanes, and the window's handle."""
    return (params[_RANK], params[_SIZE], params[_FSTRIDE], params[_DSTRIDE], params[_HDR],
            params[_CAP], params[_WIN])  # fmt: skip


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _publish(flags, me, b, n, tag, win):
    """Announce this rank's count ``n`` and ``tag`` for set ``b`` in its header and
    raise its flag (after its stores of the piece)."""
    flags[me + 1 + 2 * b] = n
    flags[me + 2 + 2 * b] = tag
    raise_flag(flags, me, win)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _disagrees(flags, b, size, fstride, n, tag, err, piece):
    """Whether a rank's header for set ``b`` announces another count or tag than ``n``
    and ``tag``: then the report names the first such rank and what it announced."""
    for r in range(size):
        their_n, their_tag = flags[r * fstride + 1 + 2 * b], flags[r * fstride + 2 + 2 * b]
        if their_n != n or their_tag != tag:
            err[0], err[1], err[2], err[3], err[4] = DISAGREE, piece, r, their_n, their_tag
            return True
    return False


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _allreduce(work, source, data, flags, params, divisor):
    """All-reduce ``source`` into ``work`` through the window (``data`` and ``flags``
    are two views of it); see the module docstring. ``params`` holds the _RANK ...
    cells, then the report. With _NOWAIT set it returns where it would wait for
    the other ranks, _STAGE saying where; called again on the same arrays, it goes
    on from there."""
    code, tag, sleepy, timeout, half, avg_by, err = header(params)
    rank, size, fstride, dstride, hdr, cap, win = _shape_cells(params)
    nowait = params[_NOWAIT] != 0
    starts = np.empty(size if half else 0, np.int64)  # the slots a half-type fold reads
    err[0] = 0
    n = work.size
    me = rank * fstride
    stage = params[_STAGE]
    # Apart from the input, a large result goes to memory past the caches (in place,
    # the lines were just read: in cache, where an ordinary store is cheaper).
    stream = n >= params[_STREAM_OUT] and source.ctypes.data != work.ctypes.data
    if stage == _NEW:
        params[_DONE] = params[_WROTE] = params[_READ] = 0
    done = params[_DONE]
    while True:  # one piece at least: a rank with count 0 still meets the others
        m = min(cap, n - done)
        if stage == _NEW:
            flags[me + _PIECE] += 1
        # The piece's set b is free: its last piece is the one before the last, which
        # every rank finished before raising its flag for the last piece (the wait
        # this rank passed).
        b = (flags[me + _PIECE] - 1) & 1
        at = hdr + b * cap  # the piece's place in each rank's segment
        mine = rank * dstride + at
        src, out = source[done : done + m], work[done : done + m]
        scatter = size > 1 and not half and m >= params[_SCATTER]
        lo, hi = rank * m // size, (rank + 1) * m // size  # this rank's slice
        piece = done // cap
        if stage == _NEW:
            if scatter:  # the others' slices only: this rank folds its own from src
                _copy(data, mine, src, 0, lo)
                _copy(data, mine + hi, src, hi, m - hi)
                params[_WROTE] += m - (hi - lo)
            else:
                _copy(data, mine, src, 0, m)
                params[_WROTE] += m
            _publish(flags, me, b, n, tag, win)
            stage = _PUBLISHED
        if stage == _PUBLISHED:
            late = all_up(flags, size, fstride, flags[me], win, sleepy, timeout, nowait)
            if late == NOT_YET:
                params[_STAGE], params[_DONE] = stage, done
                return
            params[_STAGE] = _NEW  # a call that fails is over
            if late >= 0:
                err[0], err[1], err[2], err[3] = TIMED_OUT, piece, late, 0
                return
            if _disagrees(flags, b, size, fstride, n, tag, err, piece):
                return
            params[_READ] += (size - 1) * (hi - lo if scatter else m)
            stage = _NEW
            if half:
                # Half types: all L slots widened, folded in float32, rounded once.
                for r in range(size):
                    starts[r] = r * dstride + at
                fold_half_parts(out, data, data, data.size, starts, 0, code, half, avg_by)
            elif scatter:
                # This rank's slice in rank order into its own slot (where it left
                # the slice out) and work; once every rank has finished its slice,
                # each copies the others' slices out of their slots.
                slot = data[mine + lo : mine + hi]
                fold_in_order_by_code(slot, src[lo:hi], data, dstride, at + lo, rank, size, code)
                if divisor.size > 0:
                    divide_by(slot, divisor)
                _out(out, lo, data, mine + lo, hi - lo, stream)
                params[_WROTE] += hi - lo
                raise_flag(flags, me, win)
                stage = _SLICED
            elif size > 1:
                # Every slot in rank order, this rank's own too (src may be work).
                fold_in_order_by_code(out, src, data, dstride, at, -1, size, code)
                if divisor.size > 0:
                    divide_by(out, divisor)
            else:
                _copy(out, 0, data, mine, m)
        if stage == _SLICED:
            late = all_up(flags, size, fstride, flags[me], win, sleepy, timeout, nowait)
            if late == NOT_YET:
                params[_STAGE], params[_DONE] = stage, done
                return
            params[_STAGE] = stage = _NEW
            if late >= 0:  # x = 1: the wait for the slices
                err[0], err[1], err[2], err[3] = TIMED_OUT, piece, late, 1
                return
            for r in range(size):
                if r != rank:
                    rlo, rhi = r * m // size, (r + 1) * m // size
                    _out(out, rlo, data, r * dstride + at + rlo, rhi - rlo, stream)
                    params[_READ] += rhi - rlo
        done += m
        if done >= n:
            params[_STAGE] = _NEW
            return


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _halves(out, source, own, starts, counts, data, flags, params, divisor, gather, nowait):
    """One node's reduce-scatter (``gather`` 0) or all-gather (1) through the window.

    Block r, ``counts[r]`` lanes from ``starts[r]``, is rank r's, and each piece
    takes the next ``q`` lanes of every block. Reduce-scatter: a rank stores the
    others' blocks' lanes in its slot (q = the set's lanes / L apart; its own too
    for the half types), raises its flag and waits, then folds its own block's
    lanes in local-rank order (its own operand from ``source`` at ``own``) into
    ``out`` from q·piece on. All-gather: a rank stores its own block's lanes
    (from ``source`` at ``own``; q = the whole set), waits, and copies the
    others' into ``out`` at their blocks. The next piece's wait frees the
    set, as in :func:`_allreduce`; with ``nowait`` it returns at that wait and
    goes on from there, as :func:`_allreduce` does (_DONE: the piece)."""
    code, tag, sleepy, timeout, half, avg_by, err = header(params)
    rank, size, fstride, dstride, hdr, cap, win = _shape_cells(params)
    parts = np.empty(size if half else 0, np.int64)  # the slots a half-type fold reads
    err[0] = 0
    q = cap if gather else cap // size
    total, longest = 0, 0
    for r in range(size):
        total += counts[r]
        longest = max(longest, counts[r])
    pieces = max(1, (longest + q - 1) // q)
    me = rank * fstride
    stage = params[_STAGE]
    if stage == _NEW:
        params[_DONE] = params[_WROTE] = params[_READ] = 0
    k = params[_DONE]
    while k < pieces:
        if stage == _NEW:
            flags[me + _PIECE] += 1
        b = (flags[me + _PIECE] - 1) & 1
        at = hdr + b * cap
        mine = rank * dstride + at
        if stage == _NEW:
            if gather:
                m = max(0, min(q, counts[rank] - k * q))
                _copy(data, mine, source, own + k * q, m)
                params[_WROTE] += m
            else:
                for r in range(size):
                    m = max(0, min(q, counts[r] - k * q))
                    if r != rank or half:
                        _copy(data, mine + r * q, source, starts[r] + k * q, m)
                        params[_WROTE] += m
            _publish(flags, me, b, total, tag, win)
            stage = _PUBLISHED
        late = all_up(flags, size, fstride, flags[me], win, sleepy, timeout, nowait)
        if late == NOT_YET:
            params[_STAGE], params[_DONE] = stage, k
            return
        params[_STAGE] = stage = _NEW  # a call that fails is over
        if late >= 0:
            err[0], err[1], err[2], err[3] = TIMED_OUT, k, late, 0
            return
        if _disagrees(flags, b, size, fstride, total, tag, err, k):
            return
        if gather:
            for r in range(size):
                m = max(0, min(q, counts[r] - k * q))
                if r != rank:
                    _copy(out, starts[r] + k * q, data, r * dstride + at, m)
                    params[_READ] += m
        else:
            m = max(0, min(q, counts[rank] - k * q))
            into = out[k * q : k * q + m]
            if m > 0 and half:
                for r in range(size):
                    parts[r] = r * dstride + at + rank * q
                fold_half_parts(into, data, data, data.size, parts, 0, code, half, avg_by)
            elif m > 0:
                fold_in_order_by_code(into, source[own + k * q : own + k * q + m], data,
                                      dstride, at + rank * q, rank, size, code)  # fmt: skip
                if divisor.size > 0:
                    divide_by(into, divisor)
            params[_READ] += (size - 1) * m
        k += 1


def shared_memory_halves(out: np.ndarray, source: np.ndarray, own: int, counts: Sequence[int],
                         red: Reduction, ctx: Context, timeout: float,
                         gather: bool) -> None:  # fmt: skip
    """``ringmpi.Reduce_scatter`` (``gather`` False) or ``ringmpi.Allgather``'s
    shared-memory way on one node (:func:`_halves`): ``counts`` per rank in
    rank order, elements of ``red``'s dtype (the all-gather's: bytes, any
    reduction of uint8). Reduce-scatter: ``source`` is the whole input, ``out``
    receives this rank's block, and must not overlap ``source``. All-gather:
    ``out`` is the whole buffer, this rank's block is in ``source`` from
    ``own``. The rank order is the local-rank order (the node is the
    communicator, split with the rank as key)."""
    shape = _shape(red, ctx, timeout)
    _halves_call(out, source, own, _blocks(red, counts, shape[4]), shape, red, ctx, timeout,
                 gather, True)  # fmt: skip
    if _trace._active:
        params, isz = shape[1], shape[3].itemsize
        _trace.record_shared(written=int(params[_WROTE]) * isz, read=int(params[_READ]) * isz)


def _blocks(red: Reduction, counts: Sequence[int], split: bool) -> tuple[int, Any, Any]:
    """(lanes an element, each block's lanes, where each starts) of ``counts``."""
    per = red.lanes(np.zeros(1, red.dtype)).size if split else 1
    lanes = np.array(counts, np.int64) * per
    starts = np.zeros(len(counts), np.int64)
    np.cumsum(lanes[:-1], out=starts[1:])
    return per, lanes, starts


def _halves_call(out: np.ndarray, source: np.ndarray, own: int, blocks: tuple, shape: tuple,
                 red: Reduction, ctx: Context, timeout: float, gather: bool,
                 wait: bool) -> bool:  # fmt: skip
    """:func:`_halves` on these arrays (as :func:`shared_memory_halves` takes them), to
    its end or, ``wait`` False, as far as it goes without waiting for another rank;
    its errors raised. Whether done."""
    node, params, divisor, data, split = shape
    per, lanes, starts = blocks
    into, frm = (red.lanes(out), red.lanes(source)) if split else (out, source)
    _halves(into.reshape(-1), frm.reshape(-1), own * per, starts, lanes, data, node.flags, params,
            divisor, int(gather), not wait)  # fmt: skip
    if params.item(_NPARAMS):
        _raise(params[_NPARAMS:], int(lanes.sum()), red, ctx, timeout)
    return params.item(_STAGE) == _NEW


def _fold_into(work: np.ndarray, source: np.ndarray, ctx: Context) -> np.ndarray:
    """Where the reduce-scatter folds this rank's block: ``work``, or in place (the fold
    reads this rank's own operand from the input) the communicator's scratch, copied
    to ``work`` once done."""
    return ctx.scratch(work.nbytes).view(work.dtype) if np.may_share_memory(work, source) else work


def halves_prepare(algo: Algorithm, red: Reduction, ctx: Context, counts: Sequence[int],
                   timeout: float) -> Call:  # fmt: skip
    """The halves records' ``prepare``: their run in Python, with its ``step(work, source,
    wait)`` on the arrays the run takes, whether done (one rank: no step, the run
    carries it out)."""
    call = plain(algo, red, ctx, tuple(counts), timeout)
    if ctx.size == 1:
        return call
    gather = algo.collective == "allgather"
    shape = _shape(red, ctx, timeout)
    blocks, own = _blocks(red, counts, shape[4]), sum(counts[: ctx.rank])

    def inner(out: np.ndarray, source: np.ndarray, wait: bool) -> bool:
        return _halves_call(out, source, own, blocks, shape, red, ctx, timeout, gather, wait)

    if gather:
        return call._replace(step=lambda work, source, wait: inner(work, work, wait))
    out: list[np.ndarray] = []  # where the block is folded (_fold_into)

    def step(work: np.ndarray, source: np.ndarray, wait: bool) -> bool:
        if not out:
            out.append(_fold_into(work, source, ctx))
        done = inner(out[0], source, wait)
        if done and out[0] is not work:
            work[...] = out[0]
        return done

    return call._replace(step=step)


# A call's cells from _capi's CELL_OWN: (address, length) of the window as the
# lanes' dtype, of its flags, of the params and of the divisor; lanes per element.
(_D_DATA, _D_DATA_N, _D_FLAGS, _D_FLAGS_N, _D_PARAMS, _D_PARAMS_N, _D_DIVISOR, _D_DIVISOR_N,
 _D_PER, _D_CELLS) = range(CELL_OWN, CELL_OWN + 10)  # fmt: skip
_c_made: dict[np.dtype, int] = {}


def _c_function(lanes: np.dtype) -> int:
    """The address of the C function ``fn(cells, sbuf, rbuf, count)`` that runs the
    loop on arrays of ``lanes`` (_capi's CELL_FN): 0, or the report's first cell
    (its first use compiles it, or loads it from Numba's cache)."""
    found = _c_made.get(lanes)
    if found is None:
        kind = numba.from_dtype(lanes)

        def run(cells, sbuf, rbuf, count):
            n = count * peek(cells + 8 * _D_PER)
            if sbuf == peek(cells + 8 * CELL_IN_PLACE):
                sbuf = rbuf
            work = numba.carray(as_voidptr(rbuf), n, kind)
            source = numba.carray(as_voidptr(sbuf), n, kind)
            data = numba.carray(as_voidptr(peek(cells + 8 * _D_DATA)),
                                peek(cells + 8 * _D_DATA_N), kind)  # fmt: skip
            flags = numba.carray(as_voidptr(peek(cells + 8 * _D_FLAGS)),
                                 peek(cells + 8 * _D_FLAGS_N), np.int64)  # fmt: skip
            params = numba.carray(as_voidptr(peek(cells + 8 * _D_PARAMS)),
                                  peek(cells + 8 * _D_PARAMS_N), np.int64)  # fmt: skip
            divisor = numba.carray(as_voidptr(peek(cells + 8 * _D_DIVISOR)),
                                   peek(cells + 8 * _D_DIVISOR_N), kind)  # fmt: skip
            _allreduce(work, source, data, flags, params, divisor)
            return params[_NPARAMS]

        found = _c_made[lanes] = _direct.compiled(run)
    return found


def warm(kinds) -> None:
    """Compile (or load from Numba's cache) the loops for each lanes dtype in ``kinds``,
    the C function a repeat calls it through, and the C repeat's own two."""
    i64 = numba.typeof(np.zeros(1, np.int64))
    for dt in kinds:
        arr = numba.typeof(np.zeros(1, dt))
        _allreduce.compile((arr, arr, arr, i64, i64, arr))
        _halves.compile(
            (arr, arr, numba.int64, i64, i64, arr, i64, i64, arr, numba.int64, numba.boolean)
        )
        _c_function(np.dtype(dt))
    _direct.warm()


def set_bytes(node: MPI.Intracomm, oversubscribed: str = "auto") -> int:
    """The bytes of each set of ``node``'s window (collective over the node):
    SET_BYTES, or where the node's ranks outnumber the cores their affinity masks
    hold (or the ``oversubscribed`` setting of the node's first rank says "yes"),
    CROWDED_SET_BYTES, halved while every rank's window would take more than a
    quarter of the shared memory's free space (toward SET_BYTES at least)."""
    seen = node.allgather((_host.affinity(), _shm_room(), oversubscribed))
    said = seen[0][2]
    cores = _host.cores_held([mask for mask, _, _ in seen])
    if said == "no" or (said == "auto" and node.Get_size() <= cores):
        return SET_BYTES
    room = min(free for _, free, _ in seen) // (4 * node.Get_size())
    size = CROWDED_SET_BYTES
    while size > SET_BYTES and _HEADER + 2 * size > room:
        size //= 2
    return size


def _shm_room() -> int:
    """Free bytes where MPI keeps shared windows; plenty where unknown."""
    try:
        st = os.statvfs(_segments.SHM)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


class _Node:
    """The communicator's window (per local rank a header and two sets of
    ``set_bytes``), allocated by the first call, and each call shape's fixed numbers."""

    flat: np.ndarray | None  # the whole window (open); None once freed
    flags: np.ndarray | None  # the window as int64 cells (open); None once freed

    def __init__(self, ctx: Context) -> None:
        self.win: MPI.Win | None = None
        self.calls: dict[tuple[int, float], tuple] = {}  # (tag, timeout) -> _shape's

    def open(self, ctx: Context, timeout: float) -> None:
        """Allocate the window (collective over the node, once)."""
        if ctx.node.Get_size() != ctx.size:
            raise ValueError(
                "algorithm 'shared_memory' needs every rank of the communicator on one node "
                f"(one shared-memory domain); rank {ctx.rank}'s node holds "
                f"{ctx.node.Get_size()} of its {ctx.size} ranks: use auto, "
                + ", ".join(a.name for a in records() if a.auto and not a.one_node)
            )
        ctx.arrive(ctx.node, "shared_memory: allocating the node's window", timeout)
        self.node = ctx.node
        self.set_bytes = set_bytes(ctx.node, _settings.current().oversubscribed)
        self.capacity = _HEADER + 2 * self.set_bytes
        self.win, flat = node_window(ctx.node, self.capacity)
        self.flat = flat
        self.flags = flat.view(np.int64)
        me = ctx.node.Get_rank() * self.capacity // 8
        self.flags[me : me + _HEADER // 8] = 0  # MPI does not clear the memory
        self.win.Sync()
        ctx.barrier()
        self.win.Sync()
        self.handle = handle(self.win)

    def free(self) -> None:
        self.calls.clear()
        if self.win is None:
            return
        self.node.Barrier()  # nobody still reads it
        self.flat = self.flags = None
        self.win.Unlock_all()
        self.win.Free()
        self.win = None


def _shape(red: Reduction, ctx: Context, timeout: float) -> tuple:
    """(node, params, divisor, window as the lanes' dtype, split) of ``red`` on ``ctx``."""
    node = ctx.state(SHARED_MEMORY)
    key = (red.tag, timeout)
    found = node.calls.get(key)
    if found is None:
        if node.win is None:
            node.open(ctx, timeout)
        lanes = red.lanes(np.zeros(0, red.dtype)).dtype
        isz = lanes.itemsize
        params = parameters(_NPARAMS, code=red.code, tag=red.tag, sleepy=ctx.sleepy,
                            timeout=timeout, half=red.half,
                            avg_by=red.avg_divisor(ctx.size))  # fmt: skip
        params[_RANK:_NPARAMS] = (ctx.rank, ctx.size, node.capacity // 8, node.capacity // isz,
                                  _HEADER // isz, node.set_bytes // isz, node.handle,
                                  SCATTER_BYTES // isz, 0, 0, _NEW, 0, 0,
                                  STREAM_OUT_FROM // isz)  # fmt: skip
        split = lanes != red.dtype
        found = (node, params, red.divisor(ctx.size), node.flat.view(lanes), split)
        node.calls[key] = found
    return found


def prepare(algo: Algorithm, red: Reduction, ctx: Context, count: int, timeout: float) -> Call:
    """The record's ``prepare``: the loop once more on ``count`` elements, straight
    from compiled code (the two calls raise the loop's errors themselves), and its
    ``step(work, source, wait)``: the same call told whether to wait, whether done
    (None: not arrays of this call, nothing done)."""
    node, params, divisor, data, _ = _shape(red, ctx, timeout)
    per = red.dtype.itemsize // data.itemsize
    report, flags = params[_NPARAMS:], node.flags

    def failed() -> None:  # kept by the two calls: its address is in the cells
        _raise(report, count * per, red, ctx, timeout)

    cells = np.zeros(_D_CELLS, np.int64)
    cells[:CELL_OWN] = (int(MPI.IN_PLACE), 0, 0, 0, count, _direct.number(red.dtype),
                     _c_function(data.dtype), id(failed))  # fmt: skip
    cells[CELL_OWN:] = (data.ctypes.data, data.size, flags.ctypes.data, flags.size,
                     params.ctypes.data, params.size, divisor.ctypes.data, divisor.size,
                     per)  # fmt: skip

    def in_place(work: np.ndarray, cells: np.ndarray) -> int:
        err = _direct.again_in_place(work, cells)
        if err > 0:
            failed()
        return err

    def from_(work: np.ndarray, source: np.ndarray, cells: np.ndarray) -> int:
        err = _direct.again_from(work, source, cells)
        if err > 0:
            failed()
        return err

    def step(work: np.ndarray, source: np.ndarray, wait: bool) -> bool | None:
        params[_NOWAIT] = not wait
        try:
            err = in_place(work, cells) if source is work else from_(work, source, cells)
        finally:
            params[_NOWAIT] = 0
        return None if err else params.item(_STAGE) == _NEW  # err: STALE (others raise)

    return compiled(algo, red, ctx, timeout, in_place, from_, cells, step)


def _raise(report: np.ndarray, lanes: int, red: Reduction, ctx: Context,
           timeout: float) -> None:  # fmt: skip
    """Raise the error in the loop's ``report`` of a call of ``lanes`` lanes."""
    cells = report.copy()
    per = red.lanes(np.zeros(1, red.dtype)).size  # lanes per element: counts in elements
    if cells[0] == DISAGREE:  # x: the count another rank announced
        cells[3] //= per
    raise_from(cells, ctx, timeout,
               lambda piece: f"rank {ctx.rank}: shared_memory publish piece {piece}",
               lambda r: f"rank {r}", count=lanes // per, tag=red.tag,
               waiting=lambda who, sliced: f"{who} to " + (
                   "fold its slice of the piece" if sliced else "publish its piece"))  # fmt: skip


def shared_memory_allreduce(
    work: np.ndarray,
    red: Reduction,
    ctx: Context,
    source: np.ndarray | None = None,
    timeout: float = 0.0,
) -> None:
    """Shared memory on one node: every rank folds all contributions from the node's window."""
    node, params, divisor, data, split = _shape(red, ctx, timeout)
    into, frm = work, work if source is None else source
    if split:
        into, frm = red.lanes(into), red.lanes(frm)
    started = time.monotonic_ns() if _trace._active else 0
    _allreduce(into, frm, data, node.flags, params, divisor)
    if params.item(_NPARAMS):
        _raise(params[_NPARAMS:], into.size, red, ctx, timeout)
    if _trace._active:
        isz = into.itemsize
        _trace.record_span("shared_memory", "node reduce", 0, started, time.monotonic_ns(),
                           nbytes=int(params[_WROTE]) * isz, shared=True)  # fmt: skip
        _trace.record_shared(written=int(params[_WROTE]) * isz, read=int(params[_READ]) * isz)


def terms(n: float, p: int, nodes: int = 1, per_node: int = 1) -> dict[str, float]:
    """k pieces of SET_BYTES: per piece each rank waits on p flags, twice for a piece
    cut into slices (shm_wait); shm_byte per byte a rank stores to its slots and
    loads from the others' (what the trace counts): n p whole, n (3p - 2) / p sliced."""
    if p <= 1:
        return {"call": 1.0}
    pieces = max(1, math.ceil(n / SET_BYTES))
    if min(n, SET_BYTES) < SCATTER_BYTES:
        return {"call": 1.0, "shm_wait": pieces * p, "shm_byte": n * p}
    return {"call": 1.0, "shm_wait": 2.0 * pieces * p, "shm_byte": n * (3 * p - 2) / p}


# Every rank folds the slots in local-rank order, and its node is the whole
# communicator, split with the rank as key: the communicator's rank order.
SHARED_MEMORY = register(
    "shared_memory",
    shared_memory_allreduce,
    terms=terms,
    keeps_order=True,
    one_node=True,
    half=shared_memory_allreduce,
    state=_Node,
    prepare=prepare,
    warm=warm,
)


def shared_memory_reduce_scatter(work: np.ndarray, red: Reduction, ctx: Context,
                                 source: np.ndarray, timeout: float,
                                 counts: Sequence[int]) -> None:  # fmt: skip
    """Through the node's window: each rank stores the others' blocks once, then folds
    its own from every rank's in rank order (the half types with one rounding)."""
    r = ctx.rank
    out = _fold_into(work, source, ctx)
    own = sum(counts[:r])
    if ctx.size == 1:
        out[...] = source[own : own + counts[r]]
    else:
        shared_memory_halves(out, source, own, counts, red, ctx, timeout, gather=False)
    if out is not work:
        work[...] = out


def shared_memory_all_gather(work: np.ndarray, red: Reduction, ctx: Context, source: None,
                             timeout: float, counts: Sequence[int]) -> None:  # fmt: skip
    """Through the node's window: each rank stores its block once and copies the others'."""
    shared_memory_halves(work, work, sum(counts[: ctx.rank]), counts, red, ctx, timeout,
                         gather=True)  # fmt: skip


def halves_terms(gather: bool):
    """The halves' terms: per piece each rank waits on p flags (shm_wait); shm_byte per
    byte a rank stores and loads (what the trace counts): the reduce-scatter stores
    the others' blocks and loads its own from the others', the all-gather stores its
    own and loads the others'."""

    def terms(n: float, p: int, nodes: int = 1, per_node: int = 1) -> dict[str, float]:
        if p <= 1:
            return {"call": 1.0}
        moved = n if gather else 2 * n * (p - 1) / p
        return {"call": 1.0, "shm_wait": max(1, math.ceil(n / SET_BYTES)) * p, "shm_byte": moved}

    return terms


register("shared_memory", shared_memory_reduce_scatter, collective="reduce_scatter",
         terms=halves_terms(False), one_node=True, half=shared_memory_reduce_scatter,
         prepare=halves_prepare)  # fmt: skip
register("shared_memory", shared_memory_all_gather, collective="allgather",
         terms=halves_terms(True), one_node=True, prepare=halves_prepare)  # fmt: skip


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
