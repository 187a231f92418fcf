"""ringmpi's private state for each user communicator, cached on the communicator itself.

Every call runs on a duplicate of the user's communicator, so ringmpi's messages
live in their own context and can never match a receive the user posted (not
even one with ANY_SOURCE and ANY_TAG). The duplicate is made by the first call
on a communicator, stored as an MPI attribute of it, and freed by MPI's attribute
delete callback when the user frees the communicator (or MPI finalizes).
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from . import plans
from ._errors import RingMPIError
from ._settings import choice
from .kernels import Reduction, decode_tag

__all__ = [
    "Context", "check_comm", "complete", "context", "differences", "sleepy_barrier", "timed_out",
]  # fmt: skip

# Ranks per core from which waiting ranks poll and yield instead of spinning in MPI.
# Measured (docs/performance.md, 8-byte ring in the step engine on 2 cores):
# spinning is 2.5x faster at 16 ranks, even at 32, and 2.2x slower at 64.
_CROWDED = 16
# Plans kept per communicator (a few rows each; a program calls with few sizes).
_PLANS_KEPT = 64


class Context:
    """What ringmpi keeps per communicator: the duplicate, plans, reusable buffers."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        policy = _wait_policy()  # a bad setting fails before anything is made
        # Dup returns the caller's class; ringmpi.Comm overrides Allreduce, so keep a
        # plain Intracomm handle to the duplicate for the MPI baseline to call.
        self.comm = MPI.Intracomm(comm.Dup())
        # Errors come back as codes to the step engine, which names the step.
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._plans: dict[tuple[str, int], plans.Plan] = {}
        self.chosen: dict[tuple, str] = {}  # auto's choice per size and settings
        self.node_shape: tuple[int, int] | None = None  # (nodes, largest node's ranks)
        self._scratch = np.empty(0, np.uint8)
        self.alive = True  # until free(): the user freed the communicator
        # Set by each call (ringmpi._api): seconds a rank waits without progress
        # before it raises (0: forever), and whether the reduction order is fixed.
        self.timeout = 0.0
        self.reproducible = False
        # Why this communicator can no longer be used (a call that timed out may
        # have left messages in flight), or None.
        self.broken: str | None = None
        # Algorithms' own cached state (node layouts, shared windows); each has free().
        self.extra: dict = {}
        # This rank's shared-memory node: it decides how to wait, and the
        # hierarchical algorithm and the CLI build on it.
        self.node = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.sleepy = policy == "sleep" or (policy == "auto" and _crowded(self.node))
        # Message tags carry the (op, dtype) code below 1024 and, above it, the count
        # modulo a prime that fits this MPI's tag range: ranks that disagree notice.
        tag_ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        self._count_mod = max(1, min(65521, tag_ub // 1024 - 1))

    def tag(self, red: Reduction, count: int) -> int:
        """The tag of every message of a call: (op, dtype) and a fingerprint of the count."""
        return red.tag + 1024 * (count % self._count_mod)

    def disagreement(self, theirs: int, mine: int) -> str:
        """Say what two message tags disagree on: op, dtype and/or count."""
        (their_count, their_code), (my_count, my_code) = divmod(theirs, 1024), divmod(mine, 1024)
        (their_op, their_dt), (my_op, my_dt) = decode_tag(their_code), decode_tag(my_code)
        said = []
        if their_op != my_op:
            said.append(f"op: {their_op} there, {my_op} here")
        if their_dt != my_dt:
            said.append(f"dtype: {their_dt} there, {my_dt} here")
        if their_count != my_count:
            said.append(f"count: {their_count} there, {my_count} here (mod {self._count_mod})")
        return "ranks disagree on " + "; ".join(said)

    def plan(self, algorithm: str, count: int) -> plans.Plan:
        """This rank's plan of ``algorithm`` for ``count`` elements (cached)."""
        key = (algorithm, count)
        found = self._plans.get(key)
        if found is None:
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.clear()
            found = self._plans[key] = plans.plan(algorithm, self.size, self.rank, count)
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
        self.alive = False  # repeats of earlier calls take the checked path, which raises

    def arrive(self, comm: MPI.Intracomm, where: str) -> None:
        """Before a blocking collective on ``comm`` (setting up a window or a layout):
        with a timeout, first a nonblocking barrier that gives up in time."""
        if self.timeout:
            complete(comm.Ibarrier(), self, f"rank {self.rank}: {where}", _EVERYONE)

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
        self.alive = False
        for item in reversed(list(self.extra.values())):
            item.free()
        self.extra.clear()
        if self.node != MPI.COMM_NULL:
            self.node.Free()
        # A broken-off duplicate is never freed: MPI may give its context to a new
        # communicator, whose receives could then match the failed call's messages.
        if self.comm != MPI.COMM_NULL and self.broken is None:
            self.comm.Free()
        self._scratch = np.empty(0, np.uint8)


def sleepy_barrier(comm: MPI.Intracomm) -> None:
    """A barrier whose waiting ranks sleep rather than spin (for oversubscribed nodes)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def differences(their_count: int, my_count: int, their_tag: int, my_tag: int) -> str:
    """What two ranks' calls differ in: "count: 3 there, 4 here; op: ..." (tags are
    reductions' (op, dtype) codes)."""
    said = []
    if their_count != my_count:
        said.append(f"count: {their_count} there, {my_count} here")
    (their_op, their_dt), (my_op, my_dt) = decode_tag(their_tag), decode_tag(my_tag)
    if their_op != my_op:
        said.append(f"op: {their_op} there, {my_op} here")
    if their_dt != my_dt:
        said.append(f"dtype: {their_dt} there, {my_dt} here")
    return "; ".join(said)


_EVERYONE = "the other ranks to arrive (a barrier: MPI does not say which rank is missing)"


def timed_out(ctx: Context, where: str, waiting_for: str) -> RingMPIError:
    """The error for a wait that made no progress for ``ctx.timeout`` seconds (and the
    communicator is broken off: the call's messages may still be in flight).
    ``where``: "rank R: algorithm phase step S"; ``waiting_for``: whom, for what."""
    why = f"{where}: waited {ctx.timeout:g} s for {waiting_for} without progress (timeout)"
    ctx.break_off(why)
    return RingMPIError(why)


def complete(req: MPI.Request, ctx: Context, where: str, waiting_for: str) -> None:
    """Wait for ``req`` (a nonblocking collective or message), giving up after
    ``ctx.timeout`` seconds (0: wait as long as it takes)."""
    if not ctx.timeout:
        req.Wait()
        return
    start = time.monotonic()
    pause = 0.0
    while not req.Test():
        if time.monotonic() - start > ctx.timeout:
            raise timed_out(ctx, where, waiting_for)
        if ctx.sleepy or pause:
            time.sleep(pause or 0.0005)
        # Spin for the first millisecond, then poll every 0.5 ms.
        elif time.monotonic() - start > 1e-3:
            pause = 0.0005


def _arrive(comm: MPI.Intracomm, timeout: float) -> None:
    """The first call on ``comm``: wait for every rank, giving up after ``timeout``."""
    req = comm.Ibarrier()
    start = time.monotonic()
    while not req.Test():
        if time.monotonic() - start > timeout:
            raise RingMPIError(
                f"rank {comm.Get_rank()}: setting up the communicator (its first call): "
                f"waited {timeout:g} s for {_EVERYONE} without progress (timeout); the "
                "barrier stays posted on the communicator: end the job"
            )
        time.sleep(0.0005)


def _wait_policy() -> str:
    return choice("RINGMPI_WAIT", ("auto", "spin", "sleep"))


def _crowded(node: MPI.Intracomm) -> bool:
    return node.Get_size() >= _CROWDED * (os.cpu_count() or 1)


def _delete(comm: MPI.Comm, keyval: int, ctx: Context) -> None:
    ctx.free()


_keyval: int | None = None


def check_comm(comm: object) -> MPI.Intracomm:
    """The communicator to use; TypeError unless it is a valid intracommunicator."""
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm):
        kind = type(comm).__name__
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {kind}")
    if comm == MPI.COMM_NULL:
        raise TypeError("comm is MPI.COMM_NULL")
    return comm


def context(comm: MPI.Intracomm, timeout: float = 0.0) -> Context:
    """The cached :class:`Context` of ``comm`` (collective on first use: it duplicates
    comm, after a barrier that gives up after ``timeout`` seconds, if any)."""
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
    ctx = comm.Get_attr(_keyval)
    if ctx is None:
        if timeout:
            _arrive(comm, timeout)
        ctx = Context(comm)
        comm.Set_attr(_keyval, ctx)
    return ctx
