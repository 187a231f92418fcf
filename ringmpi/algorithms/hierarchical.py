"""Hierarchical all-reduce: reduce inside each node through shared memory, then across nodes.

Three phases, for M nodes of L ranks each (L may differ from node to node)::

    node 0: [c0][c1][c2]  --(1) reduce slices in shared memory-->  [s0|s1|s2]
                                                                     |  |  |
    (2) local rank i all-reduces slice i with local rank i of every node: rail rail rail
                                                                     |  |  |
    node 0: every rank copies the finished buffer out       <--(3)-- [s0|s1|s2]

1. The buffer is cut into S slices, S = the largest node's L; local rank i
   owns slices i, i + L, .... Every rank copies the slices it does not own into
   its segment of an MPI shared-memory window of the node (its contribution
   lands in node memory once, and only where another rank needs it). Each
   owner folds its slices over all L contributions with one Numba kernel call
   (read L inputs, write the result once to its own buffer and once to its
   segment, for the others).
2. The owners of slice j on every node form rail j and all-reduce it across
   the M nodes with one of the plans :func:`across_choices` lists (the records
   registered with ``across=True``), chosen per slice size
   by the cost model, :func:`across_nodes`, or the ``across`` setting): the
   ring, 2(M-1) serial steps moving 2(M-1)/M of the slice (bandwidth-optimal);
   Rabenseifner's halving and doubling, 2 lg M steps at the ring's bytes when
   M is a power of two (two more steps and the whole slice twice for the pairs
   folded otherwise); recursive doubling, lg M steps of the whole slice, for
   small slices. All L rails of a node run at once, so every link of a node
   carries traffic (Horovod's design; MPICH reduces to one leader per node
   instead). A rank of a smaller
   node owns several slices and runs their rails one after the other, in slice
   order on every rank, so the rails never wait on each other in a cycle.
3. Every rank copies the slices it does not own out of shared memory.

The buffer goes through the window in **pieces** (PIECE_BYTES, 1 MiB, at a time), so
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

Each slice is reduced in one fixed order inside the node (contributions by
local rank), and across nodes each plan combines two operands in one order on
both partners and then only copies, so the result is bitwise identical on
every rank.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import cast

import numba
import numpy as np
from mpi4py import MPI

from .. import _engine, _settings, _trace, tuning
from .._cache import Bounded
from .._capi import handle
from .._comm import Context, complete
from .._copy import copy_bytes as _copy_bytes
from .._copy import stream_bytes as _stream_bytes
from .._errors import RingMPIError
from .._half import fold_half_parts
from .._ops import divide_by, fold_by_code
from .._report import DISAGREE, HEADER, OK, TIMED_OUT, header, parameters, raise_from
from .._settings import Settings, current
from .._shm import NOT_YET, all_up, node_window, raise_flag
from ..kernels import Reduction
from ..schedule import chunk_bounds, owned_slices, virtual_node
from .registry import Algorithm, Call, get, listing, plain, records, register


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
    # (mpi4py's stub types Split as Comm's: an Intracomm's split is an Intracomm.)
    node = (
        ctx.node
        if k is None
        else cast(MPI.Intracomm, ctx.node.Split(virtual_node(rank, size, k, placement), rank))
    )
    local_rank, local_size = node.Get_rank(), node.Get_size()
    leader = node.bcast(rank, root=0)  # names the node: its lowest rank
    nodes = comm.allreduce(1 if local_rank == 0 else 0)
    slices = comm.allreduce(local_size, op=MPI.MAX)
    owned = owned_slices(local_rank, local_size, slices)
    rails: dict[int, Context] = {}
    members: dict[int, list[int]] = {}
    for j in range(slices):
        mine = j in owned
        rail = cast(MPI.Intracomm, comm.Split(0 if mine else MPI.UNDEFINED, leader))
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
# dies the cached way is slower from tens of KiB on (docs/performance.md).
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
    segments as it needs (see :func:`_node_passes`). Reused across calls, grown when
    a call needs more.
    """

    flat: np.ndarray | None  # the whole window; None once freed
    flags: np.ndarray | None  # the ranks' barrier flags; None once freed

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
        self.calls: Bounded[tuple, tuple] = Bounded(64)  # call shapes (_run_passes)

    def raise_flag(self) -> None:
        """This rank is at the node's barrier (:meth:`all_up` waits for the others)."""
        assert self.flags is not None  # not freed
        raise_flag(self.flags, self.rank * _FLAG_CELLS, self.handle)

    def all_up(self, ctx: Context, lay: Layout, timeout: float, wait: bool = True) -> bool:
        """Whether every local rank has reached the barrier this rank is at: the last
        call's loads ordered before this call's stores, on every local rank (its slots
        moved), compiled, with MPI_Win_sync on this window on both sides
        (:func:`ringmpi._shm.all_up`; waiting for them unless ``wait`` is False)."""
        flags = self.flags
        assert flags is not None  # not freed
        late = all_up(flags, self.size, _FLAG_CELLS, flags[self.rank * _FLAG_CELLS], self.handle,
                      self.sleepy, round(timeout * 1e9), not wait)  # fmt: skip
        if late >= 0:
            _fail(np.array([TIMED_OUT, 0, late, 0, 0]), ctx, lay, timeout, "new window layout")
        return late != NOT_YET

    def free(self) -> None:
        self.node.Barrier()  # nobody still reads it
        self.flat = self.flags = None
        for win in (self.win, self.flag_win):
            win.Unlock_all()
            win.Free()


def _fail(cells: np.ndarray, ctx: Context, lay: Layout, timeout: float, passes: str,
          red: Reduction | None = None, count: int = 0) -> None:  # fmt: skip
    """Raise what the node's passes report (``passes``: which, for the message)."""
    raise_from(cells, ctx, timeout, lambda t: f"rank {ctx.rank}: hierarchical {passes} step {t}",
               lambda r: f"rank {lay.local_ranks[r]} (local rank {r} of its node)",
               count=count, tag=0 if red is None else red.tag,
               waiting=lambda who, _: f"{who} at the node's barrier")  # fmt: skip


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


# A node call's fixed numbers (see _node_passes), in one int64 array: the header
# (ringmpi._report: the op's number, the call's tag, the wait, the timeout, the half
# type and what its fold divides by), these, then the report (the step is the pass;
# the rank a local rank). _COUNT: the call's count; _PHASE: which passes it makes.
(_RANK, _L, _STRIDE, _S, _PER, _SETS, _PIECES, _STREAM, _STREAM_OUT, _WIN, _ISZ, _COUNT, _PHASE,
 _AT_T, _AT_STAGE, _NPARAMS) = range(HEADER, HEADER + 16)  # fmt: skip
# _AT_STAGE: _NEW, or _RAISED where a call asked not to wait returned at the barrier of
# step _AT_T, its flag raised: the next call on the same cells goes on there.
_NEW, _RAISED = 0, 1
# The passes: all of a one-node call; or, across nodes, publish and fold into the
# buffer (before the rails), then store the finished slices and copy out (after).
ONE_NODE, GATHER, SPREAD = 0, 1, 2
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
def _node_passes(work, src, window, scratch, flags, bounds, owned, theirs, divisor, params,
                 nowait):  # fmt: skip
    """The node's passes of a call, every piece, compiled, with the node's flag barrier
    between steps (see hierarchical_allreduce). ``params[_PHASE]``: ONE_NODE (publish,
    fold, copy out), GATHER (publish, fold into ``work``: the rails take it from
    there) or SPREAD (store the finished owned slices, copy out). Arrays are the
    lanes (``work``, ``src``, ``window``, ``scratch``), copied as bytes; elements are
    lanes. With ``nowait`` it returns at a barrier whose flags are not
    all up (_AT_T, _AT_STAGE say where), and the next call goes on there."""
    code, tag, sleepy, timeout, half, avg_by, err = header(params)
    rank, nl, stride, slices = params[_RANK], params[_L], params[_STRIDE], params[_S]
    per, sets, pieces, phase = params[_PER], params[_SETS], params[_PIECES], params[_PHASE]
    streaming, stream_out = params[_STREAM] != 0, params[_STREAM_OUT] != 0
    win, isz = params[_WIN], params[_ISZ]
    starts = np.empty(nl if half else 0, np.int64)  # where a half-type fold's inputs are
    work8, src8 = work.view(np.uint8), src.view(np.uint8)
    window8, scratch8 = window.view(np.uint8), scratch.view(np.uint8)
    err[0] = OK
    me = rank * stride
    # ONE_NODE: step t publishes piece t, folds t - 1 and copies out t - 2; GATHER and
    # SPREAD: step t publishes (stores) piece t and folds (copies out) t - 1.
    last = pieces + 1 if phase == ONE_NODE else pieces
    first, resumed = 0, params[_AT_STAGE] == _RAISED
    if resumed:
        first = params[_AT_T]
    elif phase != SPREAD:
        _announce(flags, rank, params[_COUNT], tag)
    for t in range(first, last + 1):
        again = resumed and t == first  # the step it stopped in: its work done, flag raised
        if not again:
            if t < pieces and phase != SPREAD:  # publish piece t: its part of the others' slices
                for jj in range(theirs.size):
                    off, lo, hi = _cut(bounds, theirs[jj], t, per, sets, slices)
                    _put(window8, (me + off) * isz, src8, lo * isz, (hi - lo) * isz, streaming)
            if t < pieces and phase == SPREAD:  # store piece t of the finished owned slices
                for jj in range(owned.size):
                    off, lo, hi = _cut(bounds, owned[jj], t, per, sets, slices)
                    _put(window8, (me + off) * isz, work8, lo * isz, (hi - lo) * isz, streaming)
            if 0 < t <= pieces and phase == GATHER:  # fold piece t - 1 into work only
                for jj in range(owned.size):
                    off, lo, hi = _cut(bounds, owned[jj], t - 1, per, sets, slices)
                    fold_by_code(work[lo:hi], work[:0], src[lo:hi], window, stride, off, rank, nl,
                                 code)  # fmt: skip
            if 0 < t <= pieces and phase == ONE_NODE:  # fold piece t - 1 of the owned slices
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
            # copy out piece t - 2 (ONE_NODE) or t - 1 (SPREAD) of the slices others finished
            out_piece = t - 2 if phase == ONE_NODE else t - 1 if phase == SPREAD else -1
            if 0 <= out_piece < pieces:
                for jj in range(theirs.size):
                    j = theirs[jj]
                    off, lo, hi = _cut(bounds, j, out_piece, per, sets, slices)
                    at = (j % nl) * stride + off
                    _put(work8, lo * isz, window8, at * isz, (hi - lo) * isz, stream_out)
        if t < last:
            if not again:
                raise_flag(flags, rank * _FLAG_CELLS, win)
            late = all_up(flags, nl, _FLAG_CELLS, flags[rank * _FLAG_CELLS], win, sleepy, timeout,
                          nowait)  # fmt: skip
            if late == NOT_YET:  # asked not to wait: the next call goes on from here
                params[_AT_T], params[_AT_STAGE] = t, _RAISED
                return
            params[_AT_STAGE] = _NEW  # a call that fails is over
            if late >= 0:  # the local rank that did not reach step t
                err[0], err[1], err[2], err[3] = TIMED_OUT, t, late, 0
                return
            if t == 0 and phase != SPREAD:  # every rank sees every announcement: all stop
                odd = _odd_one(flags, nl, params[_COUNT], tag)
                if odd >= 0:
                    at = odd * _FLAG_CELLS + _ANNOUNCED
                    err[0], err[1], err[2] = DISAGREE, 0, odd
                    err[3], err[4] = flags[at], flags[at + 1]
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
    """Hierarchical all-reduce: shared memory inside each node, a plan across nodes."""
    for _ in _call(work, red, ctx, source, timeout, True):
        pass  # (waiting, it never stops on the way)


def _call(work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None,
          timeout: float, wait: bool) -> Generator[None, bool, None]:  # fmt: skip
    """The call, as a generator: with ``wait`` False it stops (yields) where it would
    wait for another rank (at its node's barriers, at a rail's message), and the
    value sent to it then says whether to wait from there on. A window that must grow
    waits, and so, once asked to wait, does a timed call's agreement on its time."""
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
    stopped = False  # whether it stopped on the way (its time is not the call's)
    if win.shape != shape:
        # The slots move: nobody may still be reading the last call's (a call with
        # the same slots needs no such step, see below).
        if win.shape is not None:
            win.raise_flag()
            while not win.all_up(ctx, lay, timeout, wait):
                wait, stopped = (yield), True
        win.shape = shape
    started = MPI.Wtime()
    passes = (work, src, red, ctx, lay, win, bounds, per, sets, pieces, way, timeout)
    if lay.nodes == 1:
        while not _node_phase(passes, ONE_NODE, "node reduce", wait):
            wait, stopped = (yield), True
    else:
        # Across nodes: publish and fold the whole buffer into `work`, all-reduce the
        # owned slices along their rails, then store the results and copy out.
        while not _node_phase(passes, GATHER, "node reduce-scatter", wait):
            wait, stopped = (yield), True
        partials = red.partials()  # AVG sums across nodes and divides once, by the owner
        for j in lay.owned:
            acc = work[bounds[j] : bounds[j + 1]]
            rail = lay.rails[j]
            try:
                build = get(across_nodes(acc.nbytes, lay.nodes, lay.slices)).plan
                with tuning.pricing_with(tuning.pricing(lay.slices)):  # a plan may price
                    plan = rail.plan(build, acc.size, dt.itemsize)
                prefix, peers = f"inter-node slice {j} ", lay.rail_members[j]
                if wait:  # (traced there, when a trace is open)
                    _engine.run(plan, acc, partials, rail, "hierarchical", timeout,
                                prefix=prefix, peers=peers)  # fmt: skip
                else:  # the rail's step engine, as far as it goes each time
                    step = _engine.prepare(plan, partials, rail, "hierarchical", timeout,
                                           prefix=prefix, peers=peers)  # fmt: skip
                    while not step(acc, acc, wait):
                        wait, stopped = (yield), True
            except RingMPIError as exc:
                if rail.broken is not None:  # the rail's messages may be in flight
                    ctx.break_off(str(exc))
                raise
            red.finish(acc, ctx.size)
        while not _node_phase(passes, SPREAD, "node all-gather", wait):
            wait, stopped = (yield), True
    if timing is not None:
        # The node's slowest time of this call, and whether any rank stopped on the way
        # (then it is no trial: the time is the program's too), given up after the timeout.
        slowest = np.zeros(2)
        took = np.array([MPI.Wtime() - started, float(stopped)])
        req = lay.node.Iallreduce(took, slowest, op=MPI.MAX)
        while not wait and not req.Test():
            wait = yield
        if wait:
            complete(req, ctx, timeout, f"rank {ctx.rank}: hierarchical timing trial",
                     "the other ranks of its node to finish the call")  # fmt: skip
        if not slowest[1]:
            timing.append(float(slowest[0]))
    if _trace._active:
        # Every element is stored once (a contribution or a result); an owned one is
        # loaded from the L - 1 other ranks, any other once (copied out).
        owned = sum(bounds[j + 1] - bounds[j] for j in lay.owned)
        loaded = owned * (lay.local_size - 1) + work.size - owned
        _trace.record_shared(written=work.nbytes, read=loaded * dt.itemsize)


def prepare(algo: Algorithm, red: Reduction, ctx: Context, count: int, timeout: float) -> Call:
    """The record's ``prepare``: its run in Python, and its ``step(work, source, wait)``:
    the call of ``count`` elements started, or carried on, as far as it goes without
    waiting for another rank (``wait`` False) or to its end; whether it is done (None:
    not arrays of this call, nothing done)."""
    running: list[Generator[None, bool, None]] = []  # the call under way

    def step(work: np.ndarray, source: np.ndarray, wait: bool) -> bool | None:
        fresh = not running
        if fresh and not wait and (work.dtype != red.dtype or work.size != count
                                   or source.size != count):  # fmt: skip
            return None
        if fresh:
            running.append(_call(work, red, ctx, None if source is work else source, timeout,
                                 wait))  # fmt: skip
        try:
            if fresh:
                next(running[0])
            else:
                running[0].send(wait)
        except StopIteration:
            running.clear()
            return True
        except BaseException:
            running.clear()
            raise
        return False

    return plain(algo, red, ctx, count, timeout)._replace(step=step)


def _node_phase(passes: tuple, phase: int, name: str, wait: bool = True) -> bool:
    """One phase through the node's window, its time recorded when traced; whether it
    is done (``wait`` False: as far as it goes without waiting, :func:`_run_passes`)."""
    if not _trace._active:
        return _run_passes(*(*passes, phase, wait))
    started = time.monotonic_ns()
    done = _run_passes(*(*passes, phase, wait))
    work = passes[0]
    _trace.record_span("hierarchical", name, 0, started, time.monotonic_ns(),
                       nbytes=work.nbytes, shared=True)  # fmt: skip
    return done


def _streams_out(nbytes: int) -> bool:
    """Whether copies into the user's buffer stream past the caches: from
    _STREAM_OUT_FROM on, whichever way the window is stored to. A streaming store
    skips reading the line it overwrites (docs/performance.md has the comparison)."""
    return nbytes >= _STREAM_OUT_FROM


def _run_passes(work, src, red, ctx, lay, win, bounds, per, sets, pieces, way, timeout, phase,
                wait=True):  # fmt: skip
    """The node's passes of a call through :func:`_node_passes` (one compiled call); with
    ``wait`` False, as far as they go without waiting for another rank. Whether done
    (else the next call on the same arguments goes on from there)."""
    streaming = way == "streaming"
    lanes = red.lanes
    into, frm = lanes(work), lanes(src)
    w = into.size // work.size if work.size else 1  # lanes per element
    key = (work.size, red.tag, per, sets, streaming, timeout, phase)
    found = win.calls.get(key)
    if found is None:
        ld = into.dtype
        params = parameters(_NPARAMS, code=red.code, tag=red.tag, sleepy=win.sleepy,
                            timeout=timeout, half=red.half,
                            avg_by=red.avg_divisor(ctx.size) if red.half else 0)  # fmt: skip
        params[_RANK:_NPARAMS] = (lay.local_rank, lay.local_size, win.capacity // ld.itemsize,
                                  lay.slices, per * w, sets, pieces, int(streaming),
                                  int(_streams_out(work.nbytes)), win.handle, ld.itemsize,
                                  work.size, phase, 0, _NEW)  # fmt: skip
        scratch = ctx.scratch(per * work.itemsize if streaming else 0).view(ld)
        found = (
            params, np.asarray(bounds, np.int64) * w, np.asarray(lay.owned, np.int64),
            np.asarray(lay.theirs, np.int64), red.divisor(ctx.size), win.flat.view(ld), scratch,
        )  # fmt: skip
        win.calls.put(key, found)
    params, lanes_bounds, owned, theirs, divisor, window, scratch = found
    _node_passes(into, frm, window, scratch, win.flags, lanes_bounds, owned, theirs, divisor,
                 params, not wait)  # fmt: skip
    if params.item(_NPARAMS) != OK:
        names = {ONE_NODE: "one-node", GATHER: "publish and fold", SPREAD: "store and copy-out"}
        _fail(params[_NPARAMS:], ctx, lay, timeout, names[phase], red, work.size)
    return params.item(_AT_STAGE) == _NEW


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


# The buffer's bytes per node_step in the model: the unit its constants (tuning.DEFAULTS,
# CROWDED) were fitted with, twice the pipeline's PIECE_BYTES.
_MODEL_STEP = 2 * PIECE_BYTES


def terms(n: float, p: int, nodes: int = 1, per_node: int = 1) -> dict[str, float]:
    """The node phase (a call, a node synchronisation per pipeline step, each byte of
    the buffer) and, across nodes, the chosen plan over the M nodes on n/L bytes."""
    if p <= 1:
        return {"call": 1.0}
    pieces = max(1, math.ceil(n / _MODEL_STEP))
    steps = pieces + 2 if nodes == 1 else 2 * (pieces + 1)
    t = {"node_call": 1.0, "node_step": float(steps), "node_byte": n if per_node > 1 else 0.0}
    if nodes > 1:
        slice_bytes = n / per_node
        plan_terms = get(across_nodes(slice_bytes, nodes, per_node)).terms
        assert plan_terms is not None  # every plan across nodes has its cost model
        across = plan_terms(slice_bytes, nodes)
        t.update({k: v for k, v in across.items() if k != "call"})
    return t


def across_choices() -> tuple[str, ...]:
    """The phase across nodes: the records whose plan each rail (the M owners of a
    slice) may run (their ``across`` field), as the ``across`` setting names them."""
    return tuple(a.name for a in records() if a.across)


def _check_across(name: str, says: str) -> None:
    if name != "auto" and name not in across_choices():
        raise ValueError(f"{says} must be auto, {', '.join(across_choices())}, not {name!r}")


_settings.check_with("across", _check_across)


def across_nodes(nbytes: float, nodes: int, per_node: int) -> str:
    """The phase across ``nodes`` nodes for a rail's slice of ``nbytes``: the ``across``
    setting, or under auto the plan the cost model predicts fastest, by its
    alpha, beta and gamma terms (:func:`ringmpi.tuning.pricing`: the constants
    of a prediction, or of nodes of ``per_node`` ranks; every member of a rail
    computes the same, from the same inputs). The ring's 2(M-1) steps
    for large slices, Rabenseifner's 2 lg M at the ring's bytes (M a power of
    two) in between, recursive doubling's lg M for small ones, and Rabenseifner
    halved part of the way where a fabric's latency makes every step dear (of
    equals, the first in that order)."""
    chosen = current().across
    if chosen != "auto":
        return chosen
    costs = tuning.pricing(per_node)

    def seconds(name: str) -> float:
        with tuning.pricing_with(costs):
            plan_terms = get(name).terms
            assert plan_terms is not None  # every plan across nodes has its cost model
            t = plan_terms(nbytes, nodes)
        return sum(getattr(costs, k) * v for k, v in t.items() if k != "call")

    return min(across_choices(), key=seconds)


def warm(kinds) -> None:
    """Compile (or load from Numba's cache) the node's passes for each lanes dtype."""
    i64 = numba.typeof(np.zeros(1, np.int64))
    for dt in kinds:
        arr = numba.typeof(np.zeros(1, dt))
        _node_passes.compile((arr, arr, arr, arr, i64, i64, i64, i64, arr, i64, numba.boolean))


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
    prepare=prepare,
    warm=warm,
)


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
