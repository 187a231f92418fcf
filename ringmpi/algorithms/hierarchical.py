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
   owner reduces its slices over all L contributions with the Numba kernels
   and publishes the result in its segment.
2. The owners of slice j on every node form rail j and run the ring on it:
   2(M-1) serial inter-node steps moving 2(M-1)/M of the slice. All L rails of
   a node run at once, so every link of a node carries traffic (Horovod's
   design; MPICH reduces to one leader per node instead). A rank of a smaller
   node owns several slices and runs their rails one after the other, in slice
   order on every rank, so the rails never wait on each other in a cycle.
3. Every rank copies the slices it does not own out of shared memory.

Synchronisation follows MPI's shared-memory model (MPI-4.0 section 12.7): the
window is locked once for the whole epoch with ``Lock_all(MODE_NOCHECK)``, and
between phases every rank runs ``Win_sync`` (its stores become visible and it
sees the others'), a barrier of the node (every rank has finished the phase),
and ``Win_sync`` again. That orders each phase's loads after the previous
phase's stores on every rank, which is all the algorithm needs.

Each slice is reduced in one fixed order (contributions by local rank, then the
ring's order across nodes) on one rank and then copied, so the result is
bitwise identical on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .. import _trace
from .._comm import Context
from .._settings import choice, positive_int
from ..kernels import Reduction, reduction
from ..schedule import chunk_bounds, owned_slices, virtual_node
from . import register
from .ring import run_ring

PLACEMENTS = ("block", "cyclic")


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

    def free(self) -> None:
        for rail in self.rails.values():
            rail.free()
        if self.owns_node:
            self.node.Free()


def node_settings() -> tuple[int | None, str]:
    """``RINGMPI_RANKS_PER_NODE`` and ``RINGMPI_NODE_PLACEMENT``, checked."""
    return positive_int("RINGMPI_RANKS_PER_NODE"), choice("RINGMPI_NODE_PLACEMENT", PLACEMENTS)


def layout(ctx: Context, k: int | None, placement: str) -> Layout:
    """The node layout of ``ctx``'s communicator (collective on first use; cached)."""
    key = ("layout", k, placement)
    found = ctx.extra.get(key)
    if found is not None:
        return found
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
        node, local_rank, local_size, nodes, slices, owned, rails, members, k is not None
    )
    ctx.extra[key] = found
    return found


class _Window:
    """A node's shared-memory window: one segment per local rank, reused across calls.

    MPI allocates the segments contiguously, in local-rank order (the default
    without ``alloc_shared_noncontig``); each is padded to 64 bytes, so the whole
    window is one C-contiguous 2-D array (local ranks x bytes) that the
    multi-input kernel reads directly.
    """

    def __init__(self, node: MPI.Intracomm, nbytes: int) -> None:
        self.nbytes = nbytes
        stride = -(-max(nbytes, 1) // 64) * 64
        self.win = MPI.Win.Allocate_shared(stride, 1, comm=node)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.node = node
        base, _ = self.win.Shared_query(0)
        first = np.frombuffer(base, np.uint8, count=stride)
        for r in range(1, node.Get_size()):
            buf, _ = self.win.Shared_query(r)
            if np.frombuffer(buf, np.uint8, count=1).ctypes.data != first.ctypes.data + r * stride:
                raise RuntimeError("the MPI library did not lay the shared window out contiguously")
        self.rows = np.lib.stride_tricks.as_strided(
            first, shape=(node.Get_size(), stride), strides=(stride, 1), writeable=True
        )

    def sync(self) -> None:
        """Order this phase's stores before the next phase's loads, on every local rank."""
        self.win.Sync()
        self.node.Barrier()
        self.win.Sync()

    def free(self) -> None:
        self.rows = None
        self.win.Unlock_all()
        self.win.Free()


def _window(ctx: Context, lay: Layout, nbytes: int) -> _Window:
    # Every rank of the node asks for the same size (same count and dtype), so they
    # agree on when to reallocate; the window only grows.
    key = ("window", id(lay))
    win = ctx.extra.get(key)
    if win is None or win.nbytes < nbytes:
        if win is not None:
            win.free()
        win = _Window(lay.node, nbytes)
        ctx.extra[key] = win
    return win


@register("hierarchical")
def hierarchical_allreduce(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """Hierarchical all-reduce: shared memory inside each node, rings across nodes."""
    k, placement = node_settings()
    lay = layout(ctx, k, placement)
    src = work if source is None else source
    nbytes, dt = work.nbytes, work.dtype
    win = _window(ctx, lay, nbytes)
    rows = win.rows.view(dt)  # local ranks x elements, C-contiguous
    mine = rows[lay.local_rank]
    bounds = chunk_bounds(work.size, lay.slices)
    owned = set(lay.owned)
    # AVG sums across nodes and divides once, by the slice's owner.
    across = reduction(MPI.SUM, dt) if red.name == "avg" else red
    stored = loaded = 0

    # (1) Publish the contribution where others need it: only the slices this rank
    # does not own (its own slices are read straight from `src`).
    for j in range(lay.slices):
        if j not in owned:
            mine[bounds[j] : bounds[j + 1]] = src[bounds[j] : bounds[j + 1]]
            stored += (bounds[j + 1] - bounds[j]) * dt.itemsize
    win.sync()

    # (2) Reduce each owned slice over the L contributions (this rank's from `src`,
    # then the others' from the window in local-rank order) into the window for the
    # other local ranks, and copy it to `work` for this one. Across nodes the slice
    # is reduced in `work`, goes around its rail, then is published. (A fused
    # one-pass Numba kernel measured no faster than these whole-slice passes at
    # L = 2; it would save memory traffic from L = 3 on.)
    others = [rows[r] for r in range(lay.local_size) if r != lay.local_rank]
    for j in lay.owned:
        lo, hi = bounds[j], bounds[j + 1]
        acc = mine[lo:hi] if lay.nodes == 1 else work[lo:hi]
        acc[:] = src[lo:hi]
        for row in others:
            red.combine(acc, row[lo:hi])
        if lay.nodes > 1:
            run_ring(
                acc, across, lay.rails[j], algorithm="hierarchical",
                phase_prefix=f"inter-node slice {j} ", peers=lay.rail_members[j],
            )  # fmt: skip
        red.finish(acc, ctx.size)
        if lay.nodes == 1:
            work[lo:hi] = acc
        else:
            mine[lo:hi] = acc
        loaded += (hi - lo) * dt.itemsize * len(others)
        stored += (hi - lo) * dt.itemsize
    win.sync()

    # (3) Copy out the slices the other local ranks finished.
    for j in range(lay.slices):
        if j not in owned:
            owner = rows[j % lay.local_size]
            work[bounds[j] : bounds[j + 1]] = owner[bounds[j] : bounds[j + 1]]
            loaded += (bounds[j + 1] - bounds[j]) * dt.itemsize
    if _trace._active:
        _trace.record_shared(written=stored, read=loaded)
    win.sync()  # nobody writes the window again until everyone has read it
