"""Hierarchical all-reduce: reduce inside each node through shared memory, ring across nodes.

Three phases, for M nodes of L ranks each (L may differ from node to node)::

    node 0: [c0][c1][c2]  --(1) reduce slices in shared memory-->  [s0|s1|s2]
                                                                     |  |  |
    (2) local rank i rings slice i with local rank i of every node:  ring ring ring
                                                                     |  |  |
    node 0: every rank copies the finished buffer out       <--(3)-- [s0|s1|s2]

1. The buffer is cut into S slices, S = the largest node's L; local rank i
   owns slices i, i + L, .... Every rank copies the slices it does not own into
   its segment of an MPI shared-memory window of the node (its contribution
   lands in node memory once, and only where another rank needs it). Each
   owner folds its slices over all L contributions with one Numba kernel call
   (read L inputs, write the result once to its own buffer and once to its
   segment, for the others).
2. The owners of slice j on every node form rail j and run the ring on it:
   2(M-1) serial inter-node steps moving 2(M-1)/M of the slice. All L rails of
   a node run at once, so every link of a node carries traffic (Horovod's
   design; MPICH reduces to one leader per node instead). A rank of a smaller
   node owns several slices and runs their rails one after the other, in slice
   order on every rank, so the rails never wait on each other in a cycle.
3. Every rank copies the slices it does not own out of shared memory.

The buffer goes through the window in **pieces** (2 MiB of it at a time), so
that every pass works in cache, software-pipelined: while piece p is
published, piece p - 1 is folded and piece p - 2 copied out, with one node
synchronisation per step. Stores to the window are ordinary ("cached"), which
hands data over fastest between ranks that share a cache, or non-temporal
("streaming", straight to memory), which is faster between ranks on different
dies; the first calls of each size time both and the node keeps the faster
(:func:`_choose`). With the streaming way, copies out into the user's buffer
stream too, from 1 MiB on.

Synchronisation follows MPI's shared-memory model (MPI-4.0 section 12.7): the
window is locked once for the whole epoch with ``Lock_all(MODE_NOCHECK)``, and
between steps every rank runs ``Win_sync`` (its stores become visible and it
sees the others'), a barrier of the node (every rank has finished the step),
and ``Win_sync`` again. The barrier is the ranks' flags in a second small
window (:func:`ringmpi._shm.flag_barrier`: a release store of this rank's
count of barriers, acquire loads of everyone's), one compiled call, not an
MPI_Barrier through mpi4py. That orders each step's loads after the previous
steps' stores on every rank, which is all the algorithm needs: a slot is read
only in a later step than the one that wrote it, and written again only in a
later step than the one that last read it. A call that lays the slots out
as the last one did needs no step between the two calls (the last steps of a
call only read slots the first steps of the next do not write), and one that
lays them out differently starts with a synchronisation.

Each slice is reduced in one fixed order (contributions by local rank, then the
ring's order across nodes) on one rank and then copied, so the result is
bitwise identical on every rank.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numba
import numpy as np
from mpi4py import MPI

from .. import _trace
from .._cache import Bounded
from .._capi import handle
from .._comm import Context, complete, disagreement, timed_out
from .._copy import copy
from .._copy import copy_bytes as _copy_bytes
from .._copy import stream_bytes as _stream_bytes
from .._errors import RingMPIError
from .._half import fold_half_parts
from .._ops import divide_by, fold_by_code
from .._settings import Settings, current
from .._shm import flag_barrier, node_window
from ..kernels import Reduction
from ..schedule import chunk_bounds, owned_slices, virtual_node
from .registry import listing, register
from .ring import run_ring
from .ring import terms as ring_terms


@dataclass
class Layout:
    """This rank's place in the nodes of a communicator."""

    node: MPI.Intracomm  # the ranks of this (real or virtual) node
    local_rank: int
    local_size: int
    nodes: int  # M
    slices: int  # S: the largest node's size
    owned: list[int]  # the slices this rank reduces and rings
    rails: dict[int, Context]  # slice -> context of its rail (the owners across nodes)
    rail_members: dict[int, list[int]]  # slice -> comm ranks of that rail, in ring order
    owns_node: bool  # an emulated node's communicator, not the context's real node
    local_ranks: list[int]  # local rank -> rank in the communicator (for error messages)

    @property
    def theirs(self) -> list[int]:
        """The slices other local ranks own."""
        return [j for j in range(self.slices) if j not in self.owned]

    def free(self) -> None:
        for rail in self.rails.values():
            rail.free()
        if self.owns_node:
            self.node.Free()


class _State:
    """The hierarchical algorithm's state on a communicator, per node layout (real
    nodes, or emulated ones: (ranks per node, placement)): the layout, the node's
    window, and the trials of each size class's way of storing."""

    def __init__(self, ctx: Context) -> None:
        self.layouts: dict[tuple, Layout] = {}
        self.windows: dict[tuple, _Window] = {}
        self.choices: dict[tuple, _Choice] = {}  # (layout key, size class) -> trials

    def free(self) -> None:
        for win in self.windows.values():
            win.free()
        for lay in self.layouts.values():
            lay.free()
        self.windows.clear()
        self.layouts.clear()
        self.choices.clear()


def _nodes_of(settings: Settings) -> tuple[int | None, str]:
    """The key of a layout: the emulated nodes' size (None: the real nodes), placement."""
    return settings.ranks_per_node, settings.node_placement


def layout(ctx: Context, settings: Settings | None = None, timeout: float = 0.0) -> Layout:
    """The node layout of ``ctx``'s communicator under ``settings`` (default: the
    current ones): collective on first use, then cached."""
    key = _nodes_of(settings or current())
    state = ctx.state(HIERARCHICAL)
    found = state.layouts.get(key)
    if found is not None:
        return found
    k, placement = key
    ctx.arrive(ctx.comm, "hierarchical: setting up the node layout", timeout)
    comm = ctx.comm
    rank, size = ctx.rank, ctx.size
    # Emulated nodes of k ranks are cut out of the real ones (their ranks share memory).
    node = ctx.node if k is None else ctx.node.Split(virtual_node(rank, size, k, placement), rank)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    leader = node.bcast(rank, root=0)  # names the node: its lowest rank
    nodes = comm.allreduce(1 if local_rank == 0 else 0)
    slices = comm.allreduce(local_size, op=MPI.MAX)
    owned = owned_slices(local_rank, local_size, slices)
    rails: dict[int, Context] = {}
    members: dict[int, list[int]] = {}
    for j in range(slices):
        mine = j in owned
        rail = comm.Split(0 if mine else MPI.UNDEFINED, leader)
        if mine:
            rails[j] = Context(rail)
            members[j] = rail.allgather(rank)
            rail.Free()
    found = Layout(
        node, local_rank, local_size, nodes, slices, owned, rails, members, k is not None,
        node.allgather(rank),
    )  # fmt: skip
    state.layouts[key] = found
    return found


# Bytes of the buffer one pass through the window handles (RINGMPI_PIECE_BYTES),
# whichever way it stores to the window (RINGMPI_WINDOW_STORES; see _choose).
PIECE_BYTES = 1 << 20
STORES = ("auto", "cached", "streaming")
# Calls of each size class that time each way before the node settles on one
# (the first of each warms up and is not counted).
_TRIALS = 3
# Calls of the chosen way after which the trials run again regardless.
_RETRY = 256
# From this buffer size on, auto times both ways (below it, it stores cached): across
# dies the cached way was 1.3-3.7 times slower from 16 KiB to 1 MiB at 2 ranks, where
# auto takes the hierarchical algorithm from 512 KiB (docs/performance.md).
_TIMED_FROM = 1 << 16
# From this buffer size on, the copy out of the window into the user's buffer streams
# past the caches (see _streams_out).
_STREAM_OUT_FROM = 1 << 20


_FLAG_BYTES = 64
_FLAG_CELLS = _FLAG_BYTES // 8


class _Window:
    """A node's shared-memory window: one segment of ``capacity`` bytes per local rank.

    MPI allocates the segments contiguously, in local-rank order (the default
    without ``alloc_shared_noncontig``), so the window is one flat array in which
    rank k's segment starts at ``k * capacity``; a call lays its slots out in the
    segments as it needs (see :class:`_Pieces`). Reused across calls, grown when
    a call needs more.
    """

    def __init__(self, node: MPI.Intracomm, sleepy: bool, capacity: int) -> None:
        self.capacity = capacity
        self.shape: tuple[int, int] | None = None  # (slot bytes, sets) of the last call
        self.node = node
        self.sleepy = sleepy
        self.win, self.flat = node_window(node, capacity)
        # The ranks' flags for the barrier between passes, a cache line each.
        self.flag_win, flat = node_window(node, _FLAG_BYTES)
        self.flags = flat.view(np.int64)
        self.rank, self.size = node.Get_rank(), node.Get_size()
        self.flags[self.rank * _FLAG_CELLS] = 0  # MPI does not clear the memory
        self.flag_win.Sync()
        node.Barrier()
        self.flag_win.Sync()
        self.handle = handle(self.win)
        self.calls: Bounded[tuple, tuple] = Bounded(64)  # one-node call shapes (_run_one_node)

    def sync(self, ctx: Context, lay: Layout, step: str, timeout: float) -> None:
        """Order this pass's stores before the next pass's loads, on every local rank:
        a barrier through the ranks' flags, compiled, with MPI_Win_sync on this
        window on both sides (:func:`ringmpi._shm.flag_barrier`). ``step`` names it
        in the error of a timeout."""
        late = flag_barrier(self.flags, self.size, _FLAG_CELLS, self.rank, self.handle,
                            self.sleepy, round(timeout * 1e9))  # fmt: skip
        if late >= 0:
            raise _late(ctx, lay, late, step, timeout)

    def free(self) -> None:
        self.node.Barrier()  # nobody still reads it
        self.flat = self.flags = None
        for win in (self.win, self.flag_win):
            win.Unlock_all()
            win.Free()


def _late(ctx: Context, lay: Layout, late: int, step: str, timeout: float) -> RingMPIError:
    """The error of a node barrier that local rank ``late`` did not reach in time."""
    return timed_out(ctx, timeout, f"rank {ctx.rank}: hierarchical {step}",
                     f"rank {lay.local_ranks[late]} (local rank {late} of its node) at the "
                     "node's barrier")  # fmt: skip


def _disagree(ctx: Context, lay: Layout, red: Reduction, count: int, odd: int, their_count: int,
              their_tag: int) -> RingMPIError:  # fmt: skip
    """The error of a call whose local rank ``odd`` announced another count or tag."""
    said = disagreement(their_count, count, their_tag, red.tag)
    return RingMPIError(f"rank {ctx.rank}: hierarchical: rank {lay.local_ranks[odd]} of its "
                        f"node: {said}")  # fmt: skip


def _window(ctx: Context, key: tuple, lay: Layout, nbytes: int, timeout: float) -> _Window:
    # Every rank of the node asks for the same size (same count, dtype and piece),
    # so they agree on when to reallocate; the window only grows.
    windows = ctx.state(HIERARCHICAL).windows
    win = windows.get(key)
    if win is None or win.capacity < nbytes:
        ctx.arrive(lay.node, "hierarchical: allocating the node's window", timeout)
        if win is not None:
            win.free()
        win = windows[key] = _Window(lay.node, ctx.sleepy, max(64, -(-nbytes // 64) * 64))
    return win


# The one-node call's fixed numbers (see _one_node), in one int64 array.
_RANK, _L, _STRIDE, _S, _PER, _SETS, _PIECES, _CODE, _STREAM, _STREAM_OUT, _WIN, _SLEEPY, _ISZ = (
    range(13)
)
# The timeout (ns), what a timeout reports (the late local rank and the step), the
# call's count and tag, what a disagreement reports (local rank, its count, its tag).
_TIMEOUT, _LATE, _STEP, _COUNT, _TAG, _ODD, _ODD_COUNT, _ODD_TAG = range(13, 21)
# A half type (Reduction.half; 0: none) and what its fold divides by (AVG; 0: none).
_HALF, _AVG_BY, _NPARAMS = 21, 22, 23
# Cells of a rank's flag line: the barrier count, then the call's (count, tag).
_ANNOUNCED = 1


@numba.njit(cache=True, nogil=True)
def _announce(flags, rank, count, tag):
    """Put this call's (count, tag) in this rank's flag line, before the first barrier."""
    flags[rank * _FLAG_CELLS + _ANNOUNCED] = count
    flags[rank * _FLAG_CELLS + _ANNOUNCED + 1] = tag


@numba.njit(cache=True, nogil=True)
def _odd_one(flags, size, count, tag):
    """After the first barrier: the first local rank whose call differs, or -1."""
    for r in range(size):
        at = r * _FLAG_CELLS + _ANNOUNCED
        if flags[at] != count or flags[at + 1] != tag:
            return r
    return -1


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _cut(bounds, j, p, per, sets, slices):
    """Offset of slot (p % sets, j) in a segment; first and end element of its piece."""
    b, end = bounds[j], bounds[j + 1]
    return ((p % sets) * slices + j) * per, min(b + p * per, end), min(b + (p + 1) * per, end)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _put(dst8, at, src8, frm, nbytes, streaming):
    """Copy ``nbytes`` from byte ``frm`` of ``src8`` to byte ``at`` of ``dst8``."""
    if streaming:
        _stream_bytes(dst8[at : at + nbytes], src8[frm : frm + nbytes])
    else:
        _copy_bytes(dst8[at : at + nbytes], src8[frm : frm + nbytes])


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _one_node(work, src, window, scratch, work8, src8, window8, scratch8, flags, bounds, owned,
              theirs, divisor, params):  # fmt: skip
    """A one-node call, every pass of every piece, compiled: the same steps as the
    multi-node path's :class:`_Pieces` (see hierarchical_allreduce), with the
    node's flag barrier between steps. Arrays are the lanes (``work``, ``src``,
    ``window``, ``scratch``) and their bytes (``...8``); elements are lanes."""
    rank, nl, stride, slices = params[_RANK], params[_L], params[_STRIDE], params[_S]
    per, sets, pieces, code = params[_PER], params[_SETS], params[_PIECES], params[_CODE]
    streaming, stream_out = params[_STREAM] != 0, params[_STREAM_OUT] != 0
    win, sleepy, isz, timeout = params[_WIN], params[_SLEEPY] != 0, params[_ISZ], params[_TIMEOUT]
    half, avg_by = params[_HALF], params[_AVG_BY]
    starts = np.empty(nl if half else 0, np.int64)  # where a half-type fold's inputs are
    params[_LATE] = -1
    params[_ODD] = -1
    _announce(flags, rank, params[_COUNT], params[_TAG])
    me = rank * stride
    for t in range(pieces + 2):
        if t < pieces:  # publish piece t: this rank's part of the slices others own
            for jj in range(theirs.size):
                off, lo, hi = _cut(bounds, theirs[jj], t, per, sets, slices)
                _put(window8, (me + off) * isz, src8, lo * isz, (hi - lo) * isz, streaming)
        if 0 < t <= pieces:  # fold piece t - 1 of the owned slices
            for jj in range(owned.size):
                off, lo, hi = _cut(bounds, owned[jj], t - 1, per, sets, slices)
                n = hi - lo
                mine = window[me + off : me + off + n]
                if half:
                    # Half types: this rank's own contribution from src, the others'
                    # from their slots (src, then the window, as one buffer), in
                    # local-rank order, widened to float32, rounded once; the result
                    # goes to the slot and to work as for any type.
                    for k in range(nl):
                        starts[k] = lo if k == rank else src.size + k * stride + off
                    out = scratch[:n] if streaming else mine
                    fold_half_parts(out, src, window, src.size, starts, 0, code, half, avg_by)
                    if streaming:
                        _put(window8, (me + off) * isz, scratch8, 0, n * isz, True)
                        _put(work8, lo * isz, scratch8, 0, n * isz, stream_out)
                    else:
                        _put(work8, lo * isz, window8, (me + off) * isz, n * isz, stream_out)
                    continue
                # this rank's own contribution first, then the others' in local-rank
                # order, in one pass per other rank; the cached way writes the slot
                # in the last pass, the streaming way folds into the cache-sized
                # scratch and streams it to the slot and to work
                out = scratch[:n] if streaming else work[lo:hi]
                fold_by_code(out, out[:0] if streaming else mine, src[lo:hi], window, stride,
                             off, rank, nl, code)  # fmt: skip
                if divisor.size > 0:
                    divide_by(out, divisor)
                    if not streaming:
                        divide_by(mine, divisor)
                if streaming:
                    _put(window8, (me + off) * isz, scratch8, 0, n * isz, True)
                    _put(work8, lo * isz, scratch8, 0, n * isz, stream_out)
        if t >= 2:  # copy out piece t - 2 of the slices the others finished
            for jj in range(theirs.size):
                j = theirs[jj]
                off, lo, hi = _cut(bounds, j, t - 2, per, sets, slices)
                at = (j % nl) * stride + off
                _put(work8, lo * isz, window8, at * isz, (hi - lo) * isz, stream_out)
        if t <= pieces:
            late = flag_barrier(flags, nl, _FLAG_CELLS, rank, win, sleepy, timeout)
            if late >= 0:  # the local rank that did not reach step t
                params[_LATE], params[_STEP] = late, t
                return
            if t == 0:  # every rank sees every announcement: all stop here alike
                odd = _odd_one(flags, nl, params[_COUNT], params[_TAG])
                if odd >= 0:
                    at = odd * _FLAG_CELLS + _ANNOUNCED
                    params[_ODD], params[_ODD_COUNT], params[_ODD_TAG] = (
                        odd,
                        flags[at],
                        flags[at + 1],
                    )
                    return


def _half_types(
    work: np.ndarray,
    red: Reduction,
    ctx: Context,
    source: np.ndarray | None = None,
    timeout: float = 0.0,
) -> None:
    """The half types: on one node (every contribution folded at once in float32 and
    rounded once, as the ring and shared_memory do), refused across nodes, where
    each node's result would be rounded to 16 bits before the rails fold them."""
    nodes, _ = ctx.nodes(current())
    if nodes > 1:
        raise ValueError(
            f"algorithm: 'hierarchical' cannot reduce {red.describe()} with one rounding "
            f"across {nodes} nodes: it rounds once in each node and again across nodes (on "
            f"one node it can); algorithms that can: auto, {listing('half', but='hierarchical')}"
        )
    hierarchical_allreduce(work, red, ctx, source, timeout)


def hierarchical_allreduce(
    work: np.ndarray,
    red: Reduction,
    ctx: Context,
    source: np.ndarray | None = None,
    timeout: float = 0.0,
) -> None:
    """Hierarchical all-reduce: shared memory inside each node, rings across nodes."""
    settings = current()
    key = _nodes_of(settings)
    lay = layout(ctx, settings, timeout)
    src = work if source is None else source
    dt = work.dtype
    bounds = chunk_bounds(work.size, lay.slices)
    longest = max(b - a for a, b in itertools.pairwise(bounds))
    way, timing = _choose(ctx, key, work.nbytes, settings.window_stores)
    piece = settings.piece_bytes or PIECE_BYTES
    # A slot holds a piece's share of a slice, 64-byte aligned; with one piece in
    # all, one set of slots, otherwise two used in turn.
    per = max(1, min(longest, -(-piece // lay.slices // dt.itemsize)))
    per = -(-per * dt.itemsize // 64) * 64 // dt.itemsize
    pieces = max(1, -(-longest // per))  # count 0 still rings, like the flat ring
    sets = 1 if pieces == 1 else 2
    win = _window(ctx, key, lay, sets * lay.slices * per * dt.itemsize, timeout)
    shape = (per * dt.itemsize, sets)
    if win.shape != shape:
        # The slots move: nobody may still be reading the last call's (a call with
        # the same slots needs no such step, see below).
        if win.shape is not None:
            win.sync(ctx, lay, "new window layout", timeout)
        win.shape = shape
    started = MPI.Wtime()
    if lay.nodes == 1:
        _run_one_node(work, src, red, ctx, lay, win, bounds, per, sets, pieces, way, timeout)
        if timing is not None:
            timing.append(_slowest(ctx, lay, MPI.Wtime() - started, timeout))
        if _trace._active:
            owned = sum(bounds[j + 1] - bounds[j] for j in lay.owned)
            loaded = owned * (lay.local_size - 1) + work.size - owned
            _trace.record_shared(written=work.nbytes, read=loaded * dt.itemsize)
        return
    go = _Pieces(work, src, red, lay, win, bounds, per, sets, way == "streaming")
    _announce(win.flags, lay.local_rank, work.size, red.tag)
    # Piece p uses slot set p % 2, and its three passes run in consecutive steps,
    # software-pipelined: step t publishes piece t, folds piece t - 1 and copies
    # out piece t - 2, with one node synchronisation per step. Every pass is thus
    # separated by one from the pass before it on the same piece, and from the
    # passes of piece p - 2 that used the same slots.
    # Across nodes: publish and fold the whole buffer into `work`, ring the owned
    # slices along their rails, then publish the results and copy out.
    for t in range(pieces + 1):
        if t < pieces:
            go.publish(t)
        if t > 0:
            go.fold(t - 1)
        if t < pieces:
            win.sync(ctx, lay, f"publish and fold step {t}", timeout)
        if t == 0:  # every rank sees every announcement: all stop here alike
            odd = _odd_one(win.flags, lay.local_size, work.size, red.tag)
            if odd >= 0:
                at = odd * _FLAG_CELLS + _ANNOUNCED
                raise _disagree(ctx, lay, red, work.size, odd, *win.flags[at : at + 2].tolist())
    # AVG sums across nodes and divides once, by the slice's owner.
    across = red.partials()
    for j in lay.owned:
        acc = work[bounds[j] : bounds[j + 1]]
        rail = lay.rails[j]
        try:
            run_ring(
                acc, across, rail, timeout, algorithm="hierarchical",
                phase_prefix=f"inter-node slice {j} ", peers=lay.rail_members[j],
            )  # fmt: skip
        except RingMPIError as exc:
            if rail.broken is not None:  # the rail's messages may be in flight
                ctx.break_off(str(exc))
            raise
        red.finish(acc, ctx.size)
    for t in range(pieces + 1):
        if t < pieces:
            go.store(t)
        if t > 0:
            go.copy_out(t - 1)
        if t < pieces:
            win.sync(ctx, lay, f"store and copy-out step {t}", timeout)
    if timing is not None:
        timing.append(_slowest(ctx, lay, MPI.Wtime() - started, timeout))
    if _trace._active:
        _trace.record_shared(written=go.stored * dt.itemsize, read=go.loaded * dt.itemsize)


def _slowest(ctx: Context, lay: Layout, took: float, timeout: float) -> float:
    """The node's slowest time of this call (for the way trials), as a nonblocking
    reduction that gives up after the timeout."""
    slowest = np.zeros(1)
    req = lay.node.Iallreduce(np.array([took]), slowest, op=MPI.MAX)
    complete(req, ctx, timeout, f"rank {ctx.rank}: hierarchical timing trial",
             "the other ranks of its node to finish the call")  # fmt: skip
    return float(slowest[0])


def _streams_out(nbytes: int) -> bool:
    """Whether copies into the user's buffer stream past the caches: from
    _STREAM_OUT_FROM on, whichever way the window is stored to. A streaming store
    skips reading the line it overwrites; the cached way used to leave the
    result in the cache instead, and was about a tenth slower for it at 16 MiB
    on 2 ranks (docs/performance.md)."""
    return nbytes >= _STREAM_OUT_FROM


def _run_one_node(work, src, red, ctx, lay, win, bounds, per, sets, pieces, way, timeout):
    """The one-node call through :func:`_one_node` (one compiled call)."""
    streaming = way == "streaming"
    lanes = red.lanes
    into, frm = lanes(work), lanes(src)
    w = into.size // work.size if work.size else 1  # lanes per element
    key = (work.size, red.tag, per, sets, streaming, timeout)
    found = win.calls.get(key)
    if found is None:
        ld = into.dtype
        params = np.zeros(_NPARAMS, np.int64)
        params[: _TIMEOUT + 1] = (lay.local_rank, lay.local_size, win.capacity // ld.itemsize,
                     lay.slices, per * w, sets, pieces, red.code, int(streaming),
                     int(_streams_out(work.nbytes)), win.handle,
                     int(win.sleepy), ld.itemsize, round(timeout * 1e9))  # fmt: skip
        params[_COUNT], params[_TAG] = work.size, red.tag
        params[_HALF], params[_AVG_BY] = red.half, red.avg_divisor(ctx.size) if red.half else 0
        scratch = ctx.scratch(per * work.itemsize if streaming else 0).view(ld)
        found = (
            params, np.asarray(bounds, np.int64) * w, np.asarray(lay.owned, np.int64),
            np.asarray(lay.theirs, np.int64), red.divisor(ctx.size), win.flat.view(ld), scratch,
        )  # fmt: skip
        win.calls.put(key, found)
    params, lanes_bounds, owned, theirs, divisor, window, scratch = found
    _one_node(into, frm, window, scratch, into.view(np.uint8), frm.view(np.uint8), win.flat,
              scratch.view(np.uint8), win.flags, lanes_bounds, owned, theirs, divisor,
              params)  # fmt: skip
    if params.item(_LATE) >= 0:
        raise _late(ctx, lay, params.item(_LATE), f"one-node step {params.item(_STEP)}", timeout)
    if params.item(_ODD) >= 0:
        raise _disagree(ctx, lay, red, work.size, *params[_ODD : _ODD_TAG + 1].tolist())


def _choose(ctx: Context, key: tuple, nbytes: int, stores: str):
    """How this call stores to the window, and the list to time it into, if any.

    Ordinary ("cached") stores leave the data a rank writes to the window in its
    cache, which is the fastest way to hand it to a rank that shares that cache.
    Where the ranks do not share one (different dies or sockets, or, on this
    virtual machine, virtual CPUs the host places on different dies from one
    launch to the next), fetching freshly written lines from another die's cache
    is slower than reading memory, and "streaming" stores (non-temporal: past
    the caches, straight to memory) win instead; docs/performance.md has both.
    So with RINGMPI_WINDOW_STORES=auto the first calls of each size class (bytes
    rounded to a power of two) from 64 KiB on time both ways, a block of calls each, and
    the node keeps the faster, and times it on, to choose again if it slows down
    and every _RETRY calls (:class:`_Choice`): every local rank uses the node's
    slowest time of each call, so all choose alike.
    """
    if stores != "auto":
        return stores, None
    if nbytes < _TIMED_FROM:
        return "cached", None
    choices = ctx.state(HIERARCHICAL).choices
    trials = choices.get((key, nbytes.bit_length()))
    if trials is None:
        trials = choices[(key, nbytes.bit_length())] = _Choice(watch=nbytes >= _STREAM_OUT_FROM)
    return trials.next()


def window_choice(ctx: Context, nbytes: int) -> tuple[str, dict[str, float]] | None:
    """What auto last settled on for calls of ``nbytes`` on this rank's node (its
    trials may have started over since): the way it stores to the window and each
    way's fastest counted trial (seconds); None where it did not time (below
    _TIMED_FROM, a way forced, trials not finished yet)."""
    state = ctx.peek("hierarchical")
    trials = None if state is None else state.choices.get((_nodes_of(current()),
                                                           nbytes.bit_length()))  # fmt: skip
    return None if trials is None else trials.settled


class _Choice:
    """The timing trials of one size class (see _choose).

    The faster way is the one with the fastest counted trial call (the slow
    ones are the noise: page faults of a window that just grew, another
    process). After choosing it keeps timing the chosen way (``watch``: from
    1 MiB), and the trials start over when the median of its last calls is half
    as slow again as the median of its trials (the ranks moved, or the machine
    changed under them), or after _RETRY calls in any case, so that a choice
    that was wrong from the start does not stay.
    """

    def __init__(self, watch: bool = True) -> None:
        # Below 1 MiB a call is short enough that timing each one (a node reduction)
        # would cost a tenth of it or more: there only the trials are timed.
        self.watch = watch
        self.times: dict[str, list[float]] = {"cached": [], "streaming": []}
        self.chosen: str | None = None
        self.since: list[float] = []  # the chosen way's last times
        self.calls = 0  # calls since the choice
        self.par = 0.0  # the chosen way's time in the trials
        # (way, each way's fastest counted trial) of the last choice: what the CLI shows
        self.settled: tuple[str, dict[str, float]] | None = None

    def next(self) -> tuple[str, list[float] | None]:
        if self.chosen is None:
            # Each way's trials in one block (its first call, after the other way's,
            # not counted): alternating call by call would time each way on the
            # caches the other left, and a streaming call leaves the buffers in
            # memory, which makes the cached way look slow.
            for way, times in self.times.items():
                if len(times) <= _TRIALS:
                    return way, times
            best = {w: min(t[1:]) for w, t in self.times.items()}
            self.chosen = min(best, key=best.__getitem__)
            self.settled = (self.chosen, best)
            typical = float(np.median(self.times[self.chosen][1:]))
            self.par, self.since, self.calls = typical, [], 0
        del self.since[:-_TRIALS]
        slower = len(self.since) == _TRIALS and float(np.median(self.since)) > 1.5 * self.par
        if slower or self.calls >= _RETRY:
            self.times = {w: [] for w in self.times}
            self.chosen = None
            return self.next()
        self.calls += 1
        return self.chosen, self.since if self.watch else None

    def free(self) -> None:
        pass


class _Pieces:
    """The passes of one call through the window, piece by piece (elements counted),
    across nodes (one node runs them compiled: :func:`_one_node`).

    Rank k's segment holds ``sets`` sets of S slots of ``per`` elements: slot
    (b, j) carries, for the current piece, this rank's part of slice j -- its
    contribution where another rank owns j, the result where it owns j itself.
    """

    def __init__(self, work, src, red, lay, win, bounds, per: int, sets: int, streaming: bool):
        self.work, self.src, self.red = work, src, red
        self.streaming = streaming  # stores to the window go past the caches
        self.stream_out = _streams_out(work.nbytes)
        self.window = win.flat.view(work.dtype)
        self.stride = win.capacity // work.dtype.itemsize  # elements per segment
        self.bounds = np.asarray(bounds, np.int64)
        self.lay, self.per, self.sets = lay, per, sets
        self.me = lay.local_rank * self.stride
        self.stored = self.loaded = 0

    def _cut(self, j: int, p: int) -> tuple[int, int, int]:
        return _cut(self.bounds, j, p, self.per, self.sets, self.lay.slices)

    def _put(self, slices: list[int], data: np.ndarray, p: int) -> None:
        for j in slices:
            off, lo, hi = self._cut(j, p)
            copy(self.window[self.me + off : self.me + off + hi - lo], data[lo:hi], self.streaming)
            self.stored += hi - lo

    def publish(self, p: int) -> None:
        """Store this rank's part of the slices others own."""
        self._put(self.lay.theirs, self.src, p)

    def fold(self, p: int) -> None:
        """Reduce the owned slices over the L contributions into `work` (the rails
        take them from there), in one kernel call each: this rank's own from
        `src`, the others' from their slots, in local-rank order."""
        for j in self.lay.owned:
            off, lo, hi = self._cut(j, p)
            self.red.fold(self.work[lo:hi], self.work[:0], self.src[lo:hi], self.window,
                          self.stride, off, self.lay.local_rank, self.lay.local_size)  # fmt: skip
            self.loaded += (hi - lo) * (self.lay.local_size - 1)

    def store(self, p: int) -> None:
        """Publish the finished owned slices (after the rails)."""
        self._put(self.lay.owned, self.work, p)

    def copy_out(self, p: int) -> None:
        """Copy the slices the other local ranks finished into `work`."""
        for j in self.lay.theirs:
            off, lo, hi = self._cut(j, p)
            at = (j % self.lay.local_size) * self.stride + off
            copy(self.work[lo:hi], self.window[at : at + hi - lo], self.stream_out)
            self.loaded += hi - lo


# The buffer's bytes per node_step in the model: the unit its constants (tuning.DEFAULTS,
# CROWDED) were fitted with, twice the pipeline's PIECE_BYTES.
_MODEL_STEP = 2 * PIECE_BYTES


def terms(n: float, p: int, nodes: int = 1, per_node: int = 1) -> dict[str, float]:
    """The node phase (a call, a node synchronisation per pipeline step, each byte of
    the buffer) and, across nodes, the ring over the M nodes on n/L bytes."""
    if p <= 1:
        return {"call": 1.0}
    pieces = max(1, math.ceil(n / _MODEL_STEP))
    steps = pieces + 2 if nodes == 1 else 2 * (pieces + 1)
    t = {"node_call": 1.0, "node_step": float(steps), "node_byte": n if per_node > 1 else 0.0}
    if nodes > 1:
        across = ring_terms(n / per_node, nodes)
        t.update({k: v for k, v in across.items() if k != "call"})
    return t


def warm(kinds) -> None:
    """Compile (or load from Numba's cache) the one-node loop for each lanes dtype."""
    i64 = numba.typeof(np.zeros(1, np.int64))
    u8 = numba.typeof(np.zeros(1, np.uint8))
    for dt in kinds:
        arr = numba.typeof(np.zeros(1, dt))
        _one_node.compile((arr, arr, arr, arr, u8, u8, u8, u8, i64, i64, i64, i64, arr, i64))


# Where ranks crowd the cores (8 or more per core) every node synchronisation polls
# and sleeps: the model's constants do not hold there, and auto keeps to the
# algorithms that only exchange messages.
HIERARCHICAL = register(
    "hierarchical",
    hierarchical_allreduce,
    terms=terms,
    crowded=False,
    half=_half_types,
    half_one_node=True,
    state=_State,
    warm=warm,
)
