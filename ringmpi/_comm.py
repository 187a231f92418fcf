"""ringmpi's private state for each user communicator, cached on the communicator itself.

Every call runs on a duplicate of the user's communicator, so ringmpi's messages
live in their own context and can never match a receive the user posted (not
even one with ANY_SOURCE and ANY_TAG). The duplicate is made by the first call
on a communicator, stored as an MPI attribute of it, and freed by MPI's attribute
delete callback when the user frees the communicator (or MPI finalizes).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from mpi4py import MPI

from . import _cache, _host, _settings
from ._cache import Bounded
from ._errors import RingMPIError
from .kernels import Reduction, decode_tag
from .plans import Plan

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._engine import _Engine
    from ._progress import Progress
    from .algorithms.registry import Algorithm
    from .algorithms.tuner import Tuner

__all__ = [
    "Context", "check_comm", "complete", "context", "disagreement", "library_allreduce", "made",
    "not_running", "polled", "ready", "running", "sleepy_barrier", "timed_out", "waited",
]  # fmt: skip

# Ranks per core from which waiting ranks poll and yield instead of spinning in MPI
# (docs/performance.md has the measurement).
_CROWDED = 16
# Plans and auto's choices kept per communicator (a program calls with few sizes).
_PLANS_KEPT = 64
_CHOICES_KEPT = 256


class Context:
    """What ringmpi keeps per communicator: the duplicate, its node, plans, and each
    algorithm's own state (:meth:`state`), all freed with the communicator."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        wait = _settings.current().wait  # a bad setting fails before anything is made
        # Dup returns the caller's class; ringmpi.Comm overrides Allreduce, so keep a
        # plain Intracomm handle to the duplicate for the MPI baseline to call.
        self.comm = MPI.Intracomm(comm.Dup())
        # Errors come back as codes to the step engine, which names the step.
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._plans: Bounded[tuple, Plan] = Bounded(_PLANS_KEPT)
        # every record's calls made ready (registry.prepared): by (name, run, op and
        # dtype, count, timeout)
        self.calls: Bounded[tuple, Any] = Bounded(_CHOICES_KEPT)
        # auto's choice per (size, settings, ordered, half, ...), and while its tuner
        # tries candidates, what it decides between
        self.chosen: Bounded[tuple, Algorithm] = Bounded(_CHOICES_KEPT)
        self.trying: Bounded[tuple, Any] = Bounded(_CHOICES_KEPT)
        self._scratch = np.empty(0, np.uint8)
        # Why this communicator can no longer be used (a call that timed out may
        # have left messages in flight), or None.
        self.broken: str | None = None
        # the step engine's requests and call shapes (ringmpi._engine)
        self.engine: _Engine | None = None
        self.tuner: Tuner | None = None  # auto's tuned choices (ringmpi.algorithms.tuner)
        self.progress: Progress | None = None  # the nonblocking calls' thread (ringmpi._progress)
        # (algorithm, op, dtype) whose compiled loops this rank has loaded
        self.warmed: set[tuple[str, str, str]] = set()
        # algorithm name -> its state (each algorithm's own type)
        self._states: dict[str, Any] = {}
        # This rank's shared-memory node: it decides how to wait, and the
        # hierarchical algorithm and the CLI build on it.
        # (mpi4py's stub types Split_type as Comm's; an Intracomm's split is an Intracomm)
        self.node = cast(MPI.Intracomm, self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank))
        self.sleepy = wait == "sleep" or (wait == "auto" and _crowded(self.node))
        # (nodes, largest node's ranks), agreed here, where every rank makes its context:
        # asked for later, on a path some ranks take and others not (a call remembered
        # on one rank, a Test), a collective would wait for ranks that never come.
        # One Allgather of each rank's node size, negative on a node's first rank.
        sizes = np.empty(self.size, np.int64)
        mine = self.node.Get_size() * (-1 if self.node.Get_rank() == 0 else 1)
        self.comm.Allgather(np.array([mine], np.int64), sizes)
        self._node_shape = (int(np.count_nonzero(sizes < 0)), int(np.abs(sizes).max()))
        # Message tags carry the (op, dtype) code below 1024 and, above it, the count
        # modulo a prime that fits this MPI's tag range: ranks that disagree notice.
        tag_ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        self._count_mod = max(1, min(65521, tag_ub // 1024 - 1))

    def state(self, algo) -> Any:
        """``algo``'s state on this communicator (its ``state`` type, made on first use)."""
        found = self._states.get(algo.name)
        if found is None:
            found = self._states[algo.name] = algo.state(self)
        return found

    def peek(self, name: str) -> Any:
        """Algorithm ``name``'s state if it has been made, else None."""
        return self._states.get(name)

    def nodes(self, settings: _settings.Settings) -> tuple[int, int]:
        """(M nodes, ranks of the largest node) of this communicator under
        ``settings``' emulated nodes (RINGMPI_RANKS_PER_NODE), without building a
        layout, and without a message: emulated nodes follow from k alone, real ones
        were agreed when the context was made."""
        k, placement = settings.ranks_per_node, settings.node_placement
        n = self.size
        if k is not None:  # virtual_node's nodes (cut out of one real node)
            nodes = -(-n // k)
            return nodes, min(k, n) if placement == "block" else -(-n // nodes)
        return self._node_shape

    def tag(self, red: Reduction, count: int) -> int:
        """The tag of every message of a call: (op, dtype) and a fingerprint of the count."""
        return red.tag + 1024 * (count % self._count_mod)

    def disagreement(self, theirs: int, mine: int) -> str:
        """What two message tags disagree on (op, dtype, count modulo the tag's range)."""
        (their_count, their_code), (my_count, my_code) = divmod(theirs, 1024), divmod(mine, 1024)
        return disagreement(their_count, my_count, their_code, my_code, self._count_mod)

    def plan(self, build, count: int, itemsize: int) -> Plan:
        """This rank's plan from ``build(nranks, rank, count, itemsize)`` (cached)."""
        key = (build, count, itemsize)
        found = self._plans.get(key)
        if found is None:
            found = self._plans.put(key, build(self.size, self.rank, count, itemsize))
        return found

    def break_off(self, why: str) -> None:
        """Refuse every later call on this communicator: ``why`` (a timeout, a rank
        that disagrees) may have left this call's messages in flight, which a later
        call could receive. The duplicate is then kept, never freed (see free)."""
        self.broken = (
            f"ringmpi no longer uses this communicator: an earlier call failed ({why}); "
            "its messages may still arrive. Free the communicator and use a new one "
            "(comm.Dup()), or end the job."
        )
        _cache.changed()  # repeats of earlier calls take the checked path, which raises

    def arrive(self, comm: MPI.Intracomm, where: str, timeout: float) -> None:
        """Before a blocking collective on ``comm`` (setting up a window or a layout):
        with a timeout, first a nonblocking barrier that gives up in time."""
        if timeout:
            complete(comm.Ibarrier(), self, timeout, f"rank {self.rank}: {where}", _EVERYONE)

    def wait_on_node(self, where: str, timeout: float) -> None:
        """A barrier of this rank's node whose waiting ranks sleep (they leave the
        cores to a rank still working), giving up after ``timeout`` (0: never). Where
        the node's ranks arrive together (nothing to compile) it returns without a
        sleep: it tests for _SPIN_S first. Each sleep is an eighth of the wait so far
        (2 ms at most): a rank a little late costs its node a little more, not 2 ms."""
        req = self.node.Ibarrier()
        start = time.monotonic()
        while not req.Test() and time.monotonic() - start < _SPIN_S:
            pass
        while not req.Test():
            waited = time.monotonic() - start
            if timeout and waited > timeout:
                raise timed_out(self, timeout, where, "the other ranks of its node (a barrier)")
            time.sleep(min(0.002, waited / 8))

    def barrier(self) -> None:
        if self.sleepy:
            sleepy_barrier(self.comm)
        else:
            self.comm.Barrier()

    def scratch(self, nbytes: int) -> np.ndarray:
        """A receive buffer of ``nbytes`` bytes, grown only when a call needs more."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes]

    def free(self) -> None:
        if self.progress is not None:  # its queued calls run first
            self.progress.free()
            self.progress = None
        _cache.changed()
        for state in reversed(list(self._states.values())):
            state.free()
        self._states.clear()
        if self.engine is not None:
            self.engine.free()
        if self.node != MPI.COMM_NULL:
            self.node.Free()
        # A broken-off duplicate is never freed: MPI may give its context to a new
        # communicator, whose receives could then match the failed call's messages.
        if self.comm != MPI.COMM_NULL and self.broken is None:
            self.comm.Free()
        self._scratch = np.empty(0, np.uint8)


# How long a node wait tests before it sleeps: ranks that arrive together (each
# loaded its loops already) are through in microseconds, not a 2 ms sleep.
_SPIN_S = 200e-6


def sleepy_barrier(comm: MPI.Intracomm) -> None:
    """A barrier whose waiting ranks sleep rather than spin (for oversubscribed nodes)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def disagreement(their_count: int, my_count: int, their_tag: int, my_tag: int,
                 mod: int = 0) -> str:  # fmt: skip
    """The one message for calls that differ: "ranks disagree on count: 3 there, 4
    here; op: ..." (tags are reductions' (op, dtype) codes; ``mod``: the counts are
    known modulo it only)."""
    said = []
    if their_count != my_count:
        said.append(
            f"count: {their_count} there, {my_count} here" + (f" (mod {mod})" if mod else "")
        )
    (their_op, their_dt), (my_op, my_dt) = decode_tag(their_tag), decode_tag(my_tag)
    if their_op != my_op:
        said.append(f"op: {their_op} there, {my_op} here")
    if their_dt != my_dt:
        said.append(f"dtype: {their_dt} there, {my_dt} here")
    return "ranks disagree on " + "; ".join(said)


_EVERYONE = "the other ranks to arrive (a barrier: MPI does not say which rank is missing)"


def timed_out(ctx: Context, timeout: float, where: str, waiting_for: str) -> RingMPIError:
    """The error for a wait that made no progress for ``timeout`` seconds (and the
    communicator is broken off: the call's messages may still be in flight).
    ``where``: "rank R: algorithm phase step S"; ``waiting_for``: whom, for what."""
    why = f"{where}: waited {timeout:g} s for {waiting_for} without progress (timeout)"
    ctx.break_off(why)
    return RingMPIError(why)


def complete(req: MPI.Request, ctx: Context, timeout: float, where: str, waiting_for: str) -> None:
    """Wait for ``req`` (a nonblocking collective or message), giving up after
    ``timeout`` seconds (0: wait as long as it takes)."""
    if not timeout:
        req.Wait()
    elif not waited(req.Test, timeout, ctx.sleepy):
        raise timed_out(ctx, timeout, where, waiting_for)


def waited(done: Callable[[], bool], timeout: float, sleepy: bool = False) -> bool:
    """Whether ``done()`` (a request's Test: each call progresses MPI's nonblocking
    operations) comes true within ``timeout`` seconds. It is called as often as a
    blocking wait polls for the first second, yielding the core from the first
    millisecond on; then (a rank that is late, not a long operation) every 0.5 ms,
    and so from the start where ranks share cores (``sleepy``)."""
    start = time.monotonic()
    while not done():
        took = time.monotonic() - start
        if took > timeout:
            return False
        if sleepy or took > 1.0:
            time.sleep(0.0005)
        elif took > 1e-3:
            time.sleep(0)
    return True


def library_allreduce(ctx: Context, send, recv: np.ndarray, op: MPI.Op, timeout: float,
                      where: str) -> None:  # fmt: skip
    """The library's MPI_Allreduce on ``ctx.comm``. A blocking one cannot give up: with
    a timeout, the nonblocking one, polled (MPI does not say which rank it waits for)."""
    if timeout:
        req = ctx.comm.Iallreduce(send, recv, op=op)
        complete(req, ctx, timeout, where, "the other ranks (MPI does not say which)")
    else:
        ctx.comm.Allreduce(send, recv, op=op)


def _arrive(comm: MPI.Intracomm, timeout: float) -> None:
    """The first call on ``comm``: wait for every rank, giving up after ``timeout``."""
    if not polled(comm.Ibarrier(), timeout):
        raise RingMPIError(
            f"rank {comm.Get_rank()}: setting up the communicator (its first call): "
            f"waited {timeout:g} s for {_EVERYONE} without progress (timeout); the "
            "barrier stays posted on the communicator: end the job"
        )


def polled(req: MPI.Request, timeout: float) -> bool:
    """Whether ``req`` completes within ``timeout`` seconds (:func:`waited`), for a wait
    that has no context to break off."""
    return waited(req.Test, timeout)


def ready(comm: MPI.Intracomm, timeout: float = 0.0) -> Context:
    """The context a blocking call runs on: the nonblocking calls started on it before
    have run, and it is not broken off (RingMPIError)."""
    ctx = context(comm, timeout)
    if ctx.progress is not None:
        ctx.progress.drain()
    if ctx.broken is not None:
        raise RingMPIError(ctx.broken)
    return ctx


def _crowded(node: MPI.Intracomm) -> bool:
    return node.Get_size() >= _CROWDED * _host.cores()


def _delete(comm: MPI.Comm, keyval: int, ctx: Context) -> None:
    ctx.free()


def _finalizing(comm: MPI.Comm, keyval: int, value: object) -> None:
    _live[0] = False
    _cache.changed()


_keyval: int | None = None


def check_comm(comm: object) -> MPI.Intracomm:
    """The communicator to use; TypeError unless it is a valid intracommunicator,
    RingMPIError when MPI is not running (a call would abort the process)."""
    if not running():
        raise not_running()
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm):
        kind = type(comm).__name__
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {kind}")
    if comm == MPI.COMM_NULL:
        raise TypeError("comm is MPI.COMM_NULL")
    return comm


def running() -> bool:
    """Whether MPI is initialized and not finalized (a call otherwise aborts the
    process): asked of MPI until it runs, then known until MPI_Finalize says so."""
    if _live[0]:
        return True
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return False
    # MPI_Finalize deletes COMM_SELF's attributes first: then every remembered call is
    # forgotten, so that a later call takes the full path, which asks MPI again.
    MPI.COMM_SELF.Set_attr(MPI.Comm.Create_keyval(delete_fn=_finalizing), True)
    _live[0] = True
    return True


_live = [False]  # MPI seen running, and not finalized since


def not_running() -> RingMPIError:
    """The error for a call while MPI is not running."""
    if MPI.Is_finalized():
        return RingMPIError(
            "MPI is finalized: no MPI call, ringmpi's included, may follow MPI.Finalize()"
        )
    return RingMPIError(
        "MPI is not initialized: call MPI.Init() first (importing mpi4py.MPI does, unless "
        "mpi4py.rc.initialize is False)"
    )


# The contexts of the communicators last used, by the Python object (it is held, so
# its id names no other); emptied when any communicator is freed or broken off.
_recent: Bounded[int, tuple[MPI.Intracomm, Context]] = _cache.derived(Bounded(16))


def made(comm: MPI.Intracomm) -> Context | None:
    """``comm``'s :class:`Context` if a call has made it, else None (nothing is made)."""
    hit = _recent.get(id(comm))
    if hit is not None and hit[0] is comm:
        return hit[1]
    return None if _keyval is None else cast("Context | None", comm.Get_attr(_keyval))


def context(comm: MPI.Intracomm, timeout: float = 0.0) -> Context:
    """The cached :class:`Context` of ``comm`` (collective on first use: it duplicates
    comm, after a barrier that gives up after ``timeout`` seconds, if any)."""
    hit = _recent.get(id(comm))
    if hit is not None and hit[0] is comm:
        return hit[1]
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
    # (mpi4py's stub types attribute values as a predefined attribute's int)
    ctx = cast("Context | None", comm.Get_attr(_keyval))
    if ctx is None:
        if timeout:
            _arrive(comm, timeout)
        ctx = Context(comm)
        comm.Set_attr(_keyval, ctx)
    _recent.put(id(comm), (comm, ctx))
    return ctx
