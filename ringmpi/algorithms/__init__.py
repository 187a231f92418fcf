"""The all-reduce algorithms, and auto's choice among them.

Each module registers one record (:mod:`.registry`); everything here derives
from the records. In reproducible mode a floating or complex reduction must
be folded in communicator rank order: auto chooses among the algorithms that
keep it, and a named one that does not raises ValueError before any message.
The half types (float16, bfloat16) promise 16 bits on the wire and one
rounding: an algorithm takes them only through its half-type path (all of
which fold in rank order); auto chooses among those. Auto's online tuner times
candidates only where they all give the same bits (:func:`answers_agree`), so
that identical calls give identical bits from the first call on.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from .. import _engine, _host, _progress, _settings, tuning
from .._cache import Bounded
from .._comm import Context
from ..kernels import Reduction

# Importing a module registers its algorithm, in this order: auto's ties go to the
# first registered, and -a all lists them so.
# isort: off
from . import ring, latency, hierarchical, shared, chain, mpi, symmetric  # noqa: F401

# isort: on
from . import registry
from . import tuner as _tuner
from .registry import (
    STALE,
    Algorithm,
    Call,
    check,
    fits,
    get,
    lookup,
    names,
    prepare,
    prepared,
    records,
    register,
    unregister,
)
from .tuner import Lead, Trial

# What choose returns for a call of a class auto's tuner has not settled yet (its
# trials, its lead's calls between them): not kept, the next call may get another.
UNSETTLED = (Trial, Lead)

__all__ = [
    "STALE",
    "UNSETTLED",
    "Algorithm",
    "Call",
    "Lead",
    "Trial",
    "answers_agree",
    "calibrate",
    "candidates",
    "choose",
    "get",
    "half_algorithms",
    "library_agrees",
    "lookup",
    "names",
    "order_matters",
    "predict",
    "prepare",
    "prepared",
    "records",
    "register",
    "shortlist_of",
    "unregister",
    "usable",
    "warm",
    "warm_on_node",
]  # fmt: skip


def choose(name: str, nbytes: int, ctx: Context, red: Reduction | None = None,
           reproducible: bool = False,
           collective: str = "allreduce") -> Algorithm | Trial | Lead:  # fmt: skip
    """The record a call of ``red`` on ``nbytes`` runs: ``auto`` is resolved here.

    The ``algorithm`` setting (``RINGMPI_ALGORITHM``) overrides auto. Auto ranks
    ringmpi's own algorithms by the cost model (:mod:`ringmpi.tuning`) for this size,
    rank count and node layout; then the online tuner
    (:mod:`ringmpi.algorithms.tuner`) decides between the model's best, the best of
    the other kind, the model's next (:func:`shortlist_of`) and the library's
    MPI_Allreduce (where it gives ringmpi's answer: :func:`library_agrees`): while
    it tries them this returns a :class:`~ringmpi.algorithms.tuner.Trial`. It does
    so only where every candidate gives the same bits (:func:`answers_agree`;
    elsewhere the model's pick stands), so that no trial changes what a call returns.
    The choice is kept per communicator, size and settings, so it costs one lookup
    after the first call.

    Where the reduction order matters (``reproducible`` and a floating or complex
    ``red``; None counts as one) auto chooses among the algorithms that keep it,
    and a named algorithm that does not raises ValueError, before any message.
    For a half type the algorithm's half-type path is returned; auto chooses among
    the algorithms that have one, and a named one without it raises ValueError
    (its record says why), before any message.

    ``collective`` is that of the records (:data:`~.registry.COLLECTIVES`): for the
    halves auto runs the same way, among their records, and a named one is
    returned as it is (the half types are the caller's to check; the
    ``algorithm`` setting is the all-reduce's).
    """
    half = red is not None and red.half != 0
    ordered = reproducible and (red is None or order_matters(red))
    if collective != "allreduce":
        if name != "auto":
            return get(name, collective)
        settings = _settings.current()
    else:
        if name != "auto":
            return check(get(name), ordered, red, "algorithm")
        settings = _settings.current()
        if settings.algorithm != "auto":
            forced = get(lookup(settings.algorithm, "RINGMPI_ALGORITHM"))
            return check(forced, ordered, red, "RINGMPI_ALGORITHM")
    library = library_agrees(red)
    agreed = answers_agree(red, ctx.size)
    key = (nbytes, settings, ordered, half, library, agreed, collective)
    found = ctx.chosen.get(key)
    if found is None:
        # The model's ranking, made once: the trials' calls come back here each time.
        trying = ctx.trying.get(key)
        if trying is None:
            trying = _auto(nbytes, ctx, settings, ordered, half, library, collective, agreed)
            if isinstance(trying, _Trying):
                ctx.trying.put(key, trying)
        if isinstance(trying, _Trying):
            found = trying.tuner.choose(ctx, nbytes, trying.shortlist, trying.library,
                                        collective)  # fmt: skip
            if isinstance(found, UNSETTLED):
                return found  # not kept: the next call may try another
            ctx.trying.pop(key, None)
        else:
            found = trying
        ctx.chosen.put(key, found)
    return found.for_half if half and collective == "allreduce" else found


# A name given for the algorithm setting (configure, RINGMPI_ALGORITHM) is checked there.
_settings.check_with("algorithm", lookup)

# The tuner leaves the library's MPI_Allreduce out from 2 GiB: counts from 2^31 are
# refused by Open MPI 5.0 and summed wrong by Intel MPI 2021 (tests/test_mpi_stress.py).
_LIBRARY_MAX_BYTES = 1 << 31


class _Trying(NamedTuple):
    """A size class the online tuner decides: its candidates, best first."""

    tuner: _tuner.Tuner
    shortlist: list[Algorithm]
    library: bool  # the library's call is among them


def _auto(nbytes: int, ctx: Context, settings, ordered: bool, half: bool, library: bool,
          collective: str = "allreduce", agreed: bool = True) -> Algorithm | _Trying:  # fmt: skip
    """The model's choice, or the candidates the online tuner decides between where
    the candidates' answers agree (``agreed``)."""
    nodes, per_node = ctx.nodes(settings)
    pool = _fitting(ctx, collective)
    if half:  # every half-type path keeps the rank order
        pool = [a for a in pool if a.auto and a.half is not None]
        pool = [a for a in pool if nodes == 1 or not a.half_one_node]
    elif ordered:
        pool = [a for a in pool if a.keeps_order]
    else:
        pool = [a for a in pool if a.auto]
    ranked = _ranked(pool, tuning.load(per_node), settings, nbytes, ctx.size, nodes, per_node)
    if not ranked:  # a half's half types off one node: the library's call
        return next(a for a in records(collective) if a.terms is None)
    # The tuner decides where the choice is free: not in reproducible mode (whose
    # candidates differ in bits), nor for the half types, nor on one rank, nor where
    # the candidates' bits may differ (a trial would change the call's answer).
    if settings.tuner == "off" or half or ordered or ctx.size == 1 or not agreed:
        return ranked[0]
    shortlist = shortlist_of(ranked)
    library = library and nbytes < _LIBRARY_MAX_BYTES
    if library:
        shortlist += [a for a in pool if a.terms is None]  # the library's own call
    if len(shortlist) == 1:
        return ranked[0]
    return _Trying(_tuner.tuner(ctx, settings, nodes, per_node), shortlist, library)


def _fitting(ctx: Context, collective: str = "allreduce") -> list[Algorithm]:
    """The records of ``collective`` auto may run on ``ctx``'s communicator."""
    return [a for a in records(collective) if fits(a, ctx) and ctx.size >= a.auto_from
            and (a.crowded or not ctx.sleepy)]  # fmt: skip


def calibrate(ctx: Context, red: Reduction, timeout: float = 0.0) -> None:
    """Time auto's candidates and the library's call on this host and ``ctx``'s layout,
    once per process (:func:`ringmpi.algorithms.tuner.calibrate`; collective)."""
    pool = [a for a in _fitting(ctx) if (a.auto and a.terms is not None) or a.terms is None]
    _tuner.calibrate(ctx, red, pool if library_agrees(red) else [a for a in pool if a.own],
                     timeout)  # fmt: skip


def _ranked(pool: list[Algorithm], costs: tuning.Costs, settings, nbytes: int, p: int,
            nodes: int, per_node: int) -> list[Algorithm]:  # fmt: skip
    """``pool``'s modelled records ranked by the model, the first of equals first (as
    tuning.choose): worked out once per process for each size, layout, settings and
    pool, while the registry holds the same records (a record's prediction costs
    microseconds; every communicator's first call of a size asks)."""
    names_of = tuple((a.collective, a.name) for a in pool)
    key = (names_of, registry.changes[0], costs, settings, nbytes, p, nodes, per_node)
    found = _RANKINGS.get(key)
    if found is None:
        ranked = sorted(
            (a for a in pool if a.terms is not None),
            key=lambda a: tuning.predict(costs, a, nbytes, p, nodes, per_node),
        )
        found = _RANKINGS.put(key, ranked)
    return list(found)


_RANKINGS: Bounded[tuple, list[Algorithm]] = Bounded(1024)


def shortlist_of(ranked: list[Algorithm]) -> list[Algorithm]:
    """The own algorithms auto's tuner tries, of the model's ranking ``ranked``: the
    best, then the best of the other kind (those that exchange messages, a plan the
    step engine carries out, and those that share the node's memory), then the next
    best, SHORTLIST in all. Where the model is off on a host, it is off alike for
    algorithms of one kind (shared memory's and hierarchical's copies on one node),
    so that the other kind's best is the trial that can find it out."""
    first, rest = ranked[0], ranked[1:]
    other = [a for a in rest if (a.plan is None) != (first.plan is None)][:1]
    rest = [a for a in rest if not other or a is not other[0]]  # (identity: a quick test)
    return [first, *other, *rest][: _tuner.SHORTLIST]


def library_agrees(red: Reduction | None) -> bool:
    """Whether every MPI family's own MPI_Allreduce gives ringmpi's answer for
    ``red`` (None: any reduction that does), so that auto's tuner may run it: not
    MAX or MIN of floating or complex data (the libraries drop NaNs, and Intel MPI
    returns different signed zeros on different ranks), not SUM, PROD or AVG of 8-
    and 16-bit integers (Open MPI saturates them). README, "The three MPI families"."""
    if red is None:
        return True
    if red.name in ("max", "min"):
        return red.dtype.kind not in "fc"
    if red.name in ("sum", "prod", "avg"):
        return not (red.dtype.kind in "iu" and red.dtype.itemsize <= 2)
    return True


def answers_agree(red: Reduction | None, nranks: int) -> bool:
    """Whether every algorithm gives the same bits for ``red`` at ``nranks`` ranks, so
    that auto's tuner may try them on a call's own data (None: a reduction that does):
    where no order changes the result (integer and bool data), and at two ranks the
    sum, average and real product, one commutative operation an element (IEEE
    addition and multiplication are commutative bit for bit). Not MAX and MIN of
    floating data (which of -0.0 and 0.0, or of two NaNs, comes back depends on the
    order), nor a complex product, nor floating sums of three or more ranks (each
    algorithm adds in its own order)."""
    if red is None or not order_matters(red):
        return True
    if nranks != 2 or red.half:
        return False
    return red.name in ("sum", "avg") or (red.name == "prod" and red.dtype.kind == "f")


def candidates() -> list[str]:
    """The algorithms auto's cost model ranks by default (ringmpi's own; the online
    tuner adds the library's MPI_Allreduce to the model's best)."""
    return [a.name for a in records() if a.auto and a.terms is not None]


def usable(ctx: Context) -> list[str]:
    """Auto's candidates that can run on ``ctx``'s communicator (one node where they
    need one)."""
    return [a.name for a in records() if a.auto and a.terms is not None and fits(a, ctx)]


def half_algorithms() -> list[str]:
    """The algorithms that take the half types."""
    return [a.name for a in records() if a.half is not None]


def order_matters(red: Reduction) -> bool:
    """Whether the order of reduction can change the bits of ``red``'s result: for
    floating and complex dtypes, every op (MAX and MIN too, on -0.0 and NaN).
    Integer and bool arithmetic wraps exactly: any order gives the same bits. The
    half types count (every algorithm that takes them folds in rank order)."""
    return red.dtype.kind in "fc" or red.half != 0


def predict(costs: tuning.Costs, name: str, n: float, p: int, nodes: int = 1,
            per_node: int = 1) -> float:  # fmt: skip
    """Predicted seconds of one call of algorithm ``name`` (:func:`ringmpi.tuning.predict`)."""
    return tuning.predict(costs, get(name), n, p, nodes, per_node)


def warm(red: Reduction | None = None, record: Algorithm | None = None,
         kinds: set[np.dtype] | None = None) -> float:  # fmt: skip
    """Compile (or load from Numba's cache) the compiled loops of ``record`` (every
    algorithm when None) for ``red``'s dtype, or for every dtype when None (or for
    the lanes dtypes ``kinds``); returns the seconds it took."""
    t0 = time.perf_counter()
    if kinds is None:
        kinds = _engine.lane_kinds(red)
    lanes = frozenset(kinds)
    todo = records() if record is None else [record]
    done: set[tuple] = {(id(a), lanes) for a in todo}
    if record is None or record.plan is not None:
        done.add(("engine", lanes))
    if record is None:
        done.add(("progress", lanes))
    if done <= _warmed:
        return 0.0  # loaded in this process already: a first call on a new communicator
    if record is None or record.plan is not None:
        _engine.warm(kinds)
    if record is None:  # the nonblocking calls' too
        _progress.warm()
    for a in todo:
        if a.warm is not None:
            a.warm(kinds)
    _warmed.update(done)
    _kept.extend(todo)  # their ids stay theirs
    return time.perf_counter() - t0


# What warm() loaded in this process: (a record's id, "engine" or "progress"; lanes dtypes).
_warmed: set[tuple] = set()
_kept: list[Algorithm] = []


def warm_on_node(ctx: Context, red: Reduction, record: Algorithm | None = None,
                 timeout: float = 0.0) -> float:  # fmt: skip
    """:func:`warm` once per node: the node's first rank compiles into Numba's cache,
    while the node's other ranks wait (sleeping, so that they leave it the cores;
    ``timeout`` as for a call), then load what it wrote: collective over the
    communicator's node. Where the node's ranks have a core each, every rank
    compiles at once instead (as fast as one, without the others' loads after
    it), and none waits here: the call's own messages bring the ranks together.
    Returns this rank's seconds of compiling or loading."""
    # The reduction's own kernels (Reduction.fold) run in no algorithm: warmed only
    # with every algorithm.
    ranks = ctx.node.Get_size()
    everyone = ranks <= _host.cores()  # (the same on every rank of the node)
    compiles = everyone or ctx.node.Get_rank() == 0

    def load() -> float:
        return (red.warm() if record is None else 0.0) + warm(red, record)

    took = load() if compiles else 0.0
    if ranks > 1 and not everyone:
        ctx.wait_on_node(f"rank {ctx.rank}: waiting for its node's first rank to compile "
                         "ringmpi's loops", timeout)  # fmt: skip
    if not compiles:
        took = load()
    return took
