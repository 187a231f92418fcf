"""The registry: every algorithm is one self-describing :class:`Algorithm` record.

An algorithm module builds its record with :func:`register` and nothing else
in the package names it: ``algorithm=``, auto's choice, the CLI's ``-a all``,
the error messages and the plan tests all read the records. This module sits
at the bottom of the package and imports no algorithm.

A record carries out one of :data:`COLLECTIVES`: the all-reduce (the default),
or one of the ring's two halves, ``reduce_scatter`` (ringmpi.Reduce_scatter and
Reduce_scatter_block) and ``allgather``. Names are per collective: ``ring`` is
a record of each. Every algorithm has one signature, ``run(work, red, ctx,
source, timeout)``, and a half's one more argument, ``counts``:

* all-reduce: ``work`` is a 1-D C-contiguous array that receives the result;
  this rank's contribution is ``source`` (same size and dtype) or, when
  ``source`` is None, already in ``work``;
* reduce-scatter: ``source`` is this rank's whole input (``sum(counts)``
  elements, C-contiguous) and ``work`` receives rank r's reduced block,
  ``counts[r]`` elements from ``sum(counts[:r])`` on; ``work`` may be the first
  elements of ``source`` (in place);
* all-gather: ``work`` is the whole buffer as bytes (``red`` a reduction of
  uint8 that is never applied), ``counts`` the bytes per rank, this rank's
  block already in place; ``source`` is None;

``red`` is the checked :class:`~ringmpi.kernels.Reduction`, ``ctx`` the
communicator's :class:`~ringmpi._comm.Context` and ``timeout`` the call's
seconds without progress before a rank gives up (0: none).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

import numpy as np
from mpi4py import MPI

from .. import _direct, _engine
from .._comm import Context
from ..kernels import Reduction
from ..plans import Plan

__all__ = ["COLLECTIVES", "FORWARDS", "STALE", "Algorithm", "Call", "check", "compiled",
           "engine_prepare", "engine_run", "fits", "get", "half_prepare", "half_run",
           "listing", "lookup", "names", "plain", "prepare", "prepared", "records", "register",
           "repeats", "unregister"]  # fmt: skip

# Why a reduce-scatter that forwards partial results cannot take the half types.
FORWARDS = ("forwards partial results, rounded to 16 bits at every step (shared_memory "
            "folds every contribution at once; auto takes it on one node)")  # fmt: skip
# What a record carries out (its ``collective``); the all-reduce is the default.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")

AlgorithmFn = Callable[..., None]
# What a direct call returns when it sent nothing (not an error code: those are >= 0).
STALE = _direct.STALE
# (nranks, rank, count, itemsize) -> this rank's plan (pure)
PlanFn = Callable[[int, int, int, int], Plan]


class TermsFn(Protocol):
    """(n bytes, p ranks, M nodes, largest node's ranks) -> {model constant: how many of
    it}; called with n and p alone for one node (nodes and per_node default to 1)."""

    def __call__(
        self, n: float, p: int, nodes: int = 1, per_node: int = 1, /
    ) -> dict[str, float]: ...


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: how it runs, what it costs, and what it can do."""

    name: str
    run: AlgorithmFn
    summary: str
    collective: str = "allreduce"  # one of COLLECTIVES
    # The cost model's terms (pure): tuning.predict sums constant x count.
    terms: TermsFn | None = None
    # Model constants of its own, with their defaults (a tuning file may set them).
    constants: Mapping[str, float] = field(default_factory=dict)
    # The step engine carries out this plan for it (pure: the plan tests simulate it).
    # A half's: counts -> the plan builder for those counts per rank.
    plan: Callable[..., Any] | None = None
    own: bool = True  # one of ringmpi's own, traced; False: the MPI library's baseline
    auto: bool = True  # a candidate of auto (in the default mode)
    keeps_order: bool = False  # its result is the left fold in rank order, bitwise
    one_node: bool = False  # it needs every rank of the communicator on one node
    crowded: bool = True  # auto may choose it where ranks crowd the cores (8+ a core)
    auto_from: int = 1  # auto considers it from this many ranks (below: another's twin)
    across: bool = False  # hierarchical may run its plan across nodes (the across setting)
    # How it reduces the half types with one rounding, or why it cannot (no_half).
    half: AlgorithmFn | None = None
    no_half: str = "it has no half-type path"
    half_one_node: bool = False  # its half-type path works on one node only
    # Its per-communicator state: State(ctx), made on first use by ctx.state(name),
    # freed (state.free()) with the communicator.
    state: type | None = None
    # prepare(record, red, ctx, count, timeout) -> Call: its call of ``count`` elements
    # made ready, for every kind of call (a half's: its counts per rank for count); a
    # plan gives one, and None is the run in Python with no step (see prepare).
    prepare: Callable[..., Call] | None = None
    # warm(kinds): compile its loops for these lanes dtypes.
    warm: Callable[[set[np.dtype]], None] | None = None

    @functools.cached_property
    def for_half(self) -> Algorithm:
        """The record a half-type call runs: its half path, repeated as a plain call."""
        if self.half is None:
            raise ValueError(f"{self.name!r} has no half-type path: {self.no_half}")
        return replace(self, run=self.half, plan=None, prepare=None)


_REGISTRY: dict[str, dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}
# How many times a record was registered or forgotten (what was derived from the
# records before is out of date once it changes).
changes = [0]


def register(name: str, run: AlgorithmFn | None = None, **fields: Any) -> Algorithm:
    """Register algorithm ``name`` of its ``collective`` (the all-reduce unless given;
    replacing one of that name) and return its record.

    ``run`` defaults, for an algorithm with a ``plan``, to the step engine
    carrying it out (:func:`engine_run`, a half's :func:`half_run`). ``summary``
    defaults to the first line of ``run``'s docstring (a half's plan builder's).
    The other keywords are :class:`Algorithm`'s fields.
    """
    collective = fields.get("collective", "allreduce")
    if collective not in _REGISTRY:
        raise ValueError(f"algorithm {name!r}: collective must be one of "
                         f"{', '.join(COLLECTIVES)}, not {collective!r}")  # fmt: skip
    if run is None:
        if fields.get("plan") is None:
            raise TypeError(f"algorithm {name!r}: give a run function or a plan")
        plan = fields["plan"]
        if collective == "allreduce":
            run = engine_run(name, plan)
            fields.setdefault("prepare", engine_prepare)
        else:
            run = half_run(name, plan, collective)
            fields.setdefault("prepare", half_prepare)
    summary = fields.pop("summary", None) or (run.__doc__ or "").strip().split("\n")[0]
    algo = Algorithm(name, run, summary, **fields)
    _REGISTRY[collective][name] = algo
    changes[0] += 1
    return algo


def engine_run(name: str, plan: PlanFn) -> AlgorithmFn:
    """The run function of a plan algorithm: the step engine carries out its plan."""

    def run(work, red, ctx, source=None, timeout=0.0):
        _engine.run(ctx.plan(plan, work.size, red.dtype.itemsize), work, red, ctx, name,
                    timeout, source=source)  # fmt: skip

    run.__doc__ = plan.__doc__
    return run


def half_run(name: str, builder: Callable[..., Any], collective: str) -> AlgorithmFn:
    """The run function of a half with a plan: ``builder(counts)`` is the plan builder
    for ``counts`` per rank, which the step engine carries out on a working copy
    (reduce-scatter; rank r's block is copied out) or on the buffer itself
    (all-gather)."""
    if collective == "allgather":

        def run(work, red, ctx, source, timeout, counts):
            plan = ctx.plan(builder(tuple(counts)), work.size, 1)
            _engine.run(plan, work, red, ctx, name, timeout)

    else:

        def run(work, red, ctx, source, timeout, counts):
            total, r = sum(counts), ctx.rank
            scratch = ctx.scratch(total * red.dtype.itemsize).view(red.dtype)  # no page faults
            plan = ctx.plan(builder(tuple(counts)), total, red.dtype.itemsize)
            _engine.run(plan, scratch, red, ctx, name, timeout, source=source)
            start = sum(counts[:r])
            work[...] = scratch[start : start + counts[r]]

    run.__doc__ = builder.__doc__
    return run


def engine_prepare(algo: Algorithm, red: Reduction, ctx: Context, count: int,
                   timeout: float) -> Call:  # fmt: skip
    """The ``prepare`` of a plan algorithm: the step engine's step on its plan, which
    also makes its repeats."""
    plan = ctx.plan(algo.plan, count, red.dtype.itemsize)
    step = _engine.prepare(plan, red, ctx, algo.name, timeout)
    return Call(step, *repeats(step, red.dtype, count), step=step)


def half_prepare(algo: Algorithm, red: Reduction, ctx: Context, counts: Sequence[int],
                 timeout: float) -> Call:  # fmt: skip
    """The ``prepare`` of a half with a plan: its run in Python, with the step engine's
    step on the arrays :func:`half_run`'s run takes (the reduce-scatter on the same
    working copy, rank r's block copied out once done)."""
    counts, builder = tuple(counts), algo.plan
    assert builder is not None  # (register gives it only to a half with a plan)
    call = plain(algo, red, ctx, counts, timeout)
    if algo.collective == "allgather":
        step = _engine.prepare(ctx.plan(builder(counts), sum(counts), 1), red, ctx, algo.name,
                               timeout)  # fmt: skip
        return call._replace(step=lambda work, source, wait: step(work, work, wait))
    total, r = sum(counts), ctx.rank
    step = _engine.prepare(ctx.plan(builder(counts), total, red.dtype.itemsize), red, ctx,
                           algo.name, timeout)  # fmt: skip
    start = sum(counts[:r])

    def go(work, source, wait):
        scratch = ctx.scratch(total * red.dtype.itemsize).view(red.dtype)
        done = step(scratch, source, wait)
        if done:
            work[...] = scratch[start : start + counts[r]]
        return done

    return call._replace(step=go)


def records(collective: str = "allreduce") -> list[Algorithm]:
    """Every registered algorithm of ``collective``, in registration order."""
    return list(_REGISTRY[collective].values())


def names(collective: str = "allreduce") -> list[str]:
    """Every name ``algorithm=`` accepts for ``collective``."""
    return ["auto", *_REGISTRY[collective]]


def lookup(name: str, where: str = "algorithm", collective: str = "allreduce") -> str:
    """Check an algorithm name (ValueError listing the known ones); returns it."""
    if name != "auto" and name not in _REGISTRY[collective]:
        raise ValueError(f"{where}: unknown name {name!r} "
                         f"(known: {', '.join(names(collective))})")  # fmt: skip
    return name


def get(name: str, collective: str = "allreduce") -> Algorithm:
    """The record of algorithm ``name`` (ValueError for an unknown one)."""
    return _REGISTRY[collective][lookup(name, collective=collective)]


def unregister(name: str, collective: str = "allreduce") -> None:
    """Forget algorithm ``name`` (for tests that register their own)."""
    _REGISTRY[collective].pop(name, None)
    changes[0] += 1


def fits(algo: Algorithm, ctx: Context) -> bool:
    """Whether ``algo`` can run on ``ctx``'s communicator (one node where it needs one)."""
    return not algo.one_node or ctx.node.Get_size() == ctx.size


def check(algo: Algorithm, ordered: bool, red: Reduction | None, where: str) -> Algorithm:
    """The record a call of ``red`` runs for ``algo``, or ValueError, before any
    message, where ``algo`` cannot keep the call's contract (one rounding for a
    half type, rank order in reproducible mode)."""
    if red is not None and red.half:
        if algo.half is None:
            # Every half-type path folds in rank order: reproducible mode needs no more.
            raise ValueError(
                f"{where}: {algo.name!r} cannot reduce {red.describe()} with one rounding: "
                f"{algo.no_half}; algorithms that can: auto, {listing('half')}"
            )
        return algo.for_half
    if ordered and not algo.keeps_order:
        what = red.describe() if red is not None else "this reduction"
        raise ValueError(
            f"{where}: {algo.name!r} cannot keep the rank order that reproducible mode needs "
            f"for {what}; algorithms that do: auto, {listing('keeps_order')}"
        )
    return algo


def listing(capability: str, but: str = "") -> str:
    """The algorithms with ``capability`` (but ``but``), with their limits: "ring,
    shared_memory (one node only), ..."."""
    said = []
    for a in _REGISTRY["allreduce"].values():
        if getattr(a, capability) not in (None, False) and a.name != but:
            alone = a.one_node or (capability == "half" and a.half_one_node)
            said.append(a.name + (" (one node only)" if alone else ""))
    return ", ".join(said)


class Call(NamedTuple):
    """A record's call of one count, reduction and communicator, made ready by its
    ``prepare`` (once per communicator: :func:`prepared`): every kind of call makes it.

    ``again(work, source)`` carries it out once more on 1-D arrays of that count
    and dtype (``source is work``: in place), with the least Python, raising its
    errors. ``in_place(recvbuf, cells)`` and ``from_(recvbuf, sendbuf, cells)``
    make it on the arrays as the user passed them (the API's repeats), each
    returning 0, an MPI error code, or STALE (nothing sent: not arrays of its
    dtype and count, C-contiguous and aligned, ``recvbuf`` writeable); an own
    algorithm's raise its own errors. Where compiled code can make it with no
    Python between, ``cells`` holds it (ringmpi._capi's CELL_* layout; the API's
    C repeat path reads them, as do those two).

    Where the record's call can stop at a wait and go on later, ``step(work, source,
    wait)`` carries it out as far as it goes without waiting for another rank
    (``wait`` False: a nonblocking start or test) or to its end (True), and says
    whether it is done (None: not arrays of this call; nothing was done)."""

    again: Callable[[np.ndarray, np.ndarray], Any]
    in_place: Callable[..., int]
    from_: Callable[..., int]
    cells: np.ndarray | None = None
    step: Callable[[np.ndarray, np.ndarray, bool], bool | None] | None = None


def prepare(algo: Algorithm, red: Reduction, ctx: Context, count: Any, timeout: float) -> Call:
    """``algo``'s call of ``count`` elements of ``red``'s dtype on ``ctx`` (a half's: its counts
    per rank), made ready (its record's ``prepare``, or its run in Python)."""
    return (algo.prepare or plain)(algo, red, ctx, count, timeout)


def plain(algo: Algorithm, red: Reduction, ctx: Context, count: Any, timeout: float) -> Call:
    """The call that ``algo``'s run makes in Python, with no step (a half's: ``count``
    its counts per rank, and no repeats of the all-reduce's)."""
    run = algo.run
    if algo.collective != "allreduce":
        return Call(lambda work, source: run(work, red, ctx, source, timeout, count),
                    _no_repeat, _no_repeat)  # fmt: skip

    def again(work: np.ndarray, source: np.ndarray) -> None:
        run(work, red, ctx, None if source is work else source, timeout)

    return Call(again, *repeats(again, red.dtype, count))


def _no_repeat(*_arrays: Any) -> int:
    return STALE


def compiled(algo: Algorithm, red: Reduction, ctx: Context, timeout: float, in_place,
             from_, cells: np.ndarray, step=None) -> Call:  # fmt: skip
    """The call that ``in_place(recvbuf, cells)`` and ``from_(recvbuf, sendbuf, cells)``
    make from compiled code (see :class:`Call`): ``again`` is a builtin whose C
    function makes it (as the API's C repeat path does), ``algo``'s run where the
    arrays are not the ones it was made for."""
    run = algo.run

    def again(work: np.ndarray, source: np.ndarray) -> None:
        err = in_place(work, cells) if source is work else from_(work, source, cells)
        if err == STALE:  # not the arrays it was made for: the plain call
            run(work, red, ctx, None if source is work else source, timeout)
        elif err:
            raise MPI.Exception(err)

    return Call(_direct.caller(cells, red.dtype, again), in_place, from_, cells, step)


def repeats(again: Callable[[np.ndarray, np.ndarray], Any], dtype: np.dtype,
            count: int) -> tuple[Callable[..., int], Callable[..., int]]:  # fmt: skip
    """(in_place, from_) of a call that ``again`` makes in Python: each checks the
    arrays as the user passed them first, and returns STALE where ``again`` did (a
    counted call with none left: nothing sent)."""

    def in_place(recvbuf: np.ndarray, _cells: Any) -> int:
        if recvbuf.dtype is not dtype or recvbuf.size != count or not recvbuf.flags.carray:
            return STALE  # carray: C-contiguous, aligned and writeable, in one lookup
        work = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)  # a view, the same memory
        return STALE if again(work, work) == STALE else 0

    def from_(recvbuf: np.ndarray, sendbuf: np.ndarray, _cells: Any) -> int:
        if (
            recvbuf.dtype is not dtype
            or recvbuf.size != count
            or not recvbuf.flags.carray
            or sendbuf.dtype is not dtype
            or sendbuf.size != count
            or not sendbuf.flags.c_contiguous
        ):
            return STALE
        work = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
        source = sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)
        return STALE if again(work, source) == STALE else 0

    return in_place, from_


def prepared(algo: Algorithm, red: Reduction, ctx: Context, count: int, timeout: float) -> Call:
    """``algo``'s call of ``count`` elements of ``red``'s dtype on ``ctx``, made ready
    once per communicator (:func:`prepare`): every kind of call takes it from here."""
    key = (algo.name, algo.run, red.tag, count, timeout)  # (run: a half type's path)
    found = ctx.calls.get(key)
    if found is None:
        found = ctx.calls.put(key, prepare(algo, red, ctx, count, timeout))
    return found


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
