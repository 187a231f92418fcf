"""The registry of all-reduce algorithms.

Every algorithm has one signature, ``fn(work, red, ctx, source)``: ``work`` is
a 1-D C-contiguous array that receives the result; this rank's contribution is
``source`` (same size and dtype) or, when ``source`` is None, already in
``work``; ``red`` is the checked :class:`~ringmpi.kernels.Reduction` and ``ctx``
the communicator's :class:`~ringmpi._comm.Context`. Modules register
themselves with :func:`register`; ``algorithm=`` and the CLI's ``-a`` look
names up with :func:`lookup`.

In reproducible mode (``ctx.reproducible``) a floating or complex reduction
must be folded in communicator rank order: :data:`KEEP_ORDER` lists the
algorithms that do, and :func:`choose` keeps to them.

The half types (float16, bfloat16; ``red.half``) promise 16 bits on the wire and
one rounding: no algorithm that forwards partial results can keep both. An
algorithm takes them only where it registers a way to (``half=``): the ring
(inputs exchanged directly, then its all-gather), shared_memory (every rank
folds all inputs anyway) and hierarchical on one node (each slice's owner folds
the node's inputs at once; across nodes it refuses). The others raise
ValueError before any message, saying why (:data:`NO_HALF`); auto chooses among
the ones that take them. All fold in rank order in float32, so for the half
types they also keep the order.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .. import _engine, _settings, tuning
from .._comm import Context
from ..kernels import Reduction

__all__ = ["KEEP_ORDER", "NO_HALF", "Algorithm", "choose", "lookup", "names", "order_matters",
           "register"]  # fmt: skip

# The algorithms whose result is the left fold in communicator rank order, bitwise:
# the chain, and shared_memory (every rank folds the slots in local-rank order, and
# its node is the whole communicator, split with the rank as key: the same order).
KEEP_ORDER = ("chain", "shared_memory")

# Why each algorithm that has no half-type path cannot keep the half types' contract
# (16 bits on the wire, float32 inside, one rounding at the end).
NO_HALF = {
    "recursive_doubling": "it swaps and reduces partial results, rounded to 16 bits at every step",
    "rabenseifner": "it forwards partial results, rounded to 16 bits at every step",
    "chain": "it forwards partial results along the chain, rounded to 16 bits at every rank",
    "mpi": "MPI has no bfloat16 datatype, and MPI_Allreduce on float16 (MPIX_C_FLOAT16, where it "
    "exists) rounds every partial result to 16 bits",
}

AlgorithmFn = Callable[[np.ndarray, Reduction, Context, "np.ndarray | None"], None]


@dataclass(frozen=True)
class Algorithm:
    name: str
    run: AlgorithmFn
    summary: str
    own: bool  # one of ringmpi's own (auto chooses among these), not a baseline
    plan: str | None = None  # the plan the step engine runs for it (ringmpi.plans)
    # prepare(red, ctx) -> again(work, source): the call once more with the least
    # Python, for calls that repeat (an algorithm outside the step engine)
    prepare: Callable | None = None
    # How it runs the half types (its variant for them, see choose), or None: it refuses
    half: Algorithm | None = None


_REGISTRY: dict[str, Algorithm] = {}


def register(
    name: str,
    *,
    own: bool = True,
    plan: str | None = None,
    prepare: Callable | None = None,
    half: AlgorithmFn | bool = False,
) -> Callable[[AlgorithmFn], AlgorithmFn]:
    """Class the decorated function as algorithm ``name``; ``plan``: it is the step
    engine carrying out that plan, which the API may then repeat directly;
    ``prepare``: how the API prepares a repeat of it otherwise; ``half``: it takes
    the half types, True by the same function, or by the function given (which
    the API repeats as a plain call)."""

    def deco(fn: AlgorithmFn) -> AlgorithmFn:
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        algo = Algorithm(name, fn, summary, own, plan, prepare)
        if half is True:
            algo = replace(algo, half=algo)
        elif half:
            algo = replace(algo, half=Algorithm(name, half, summary, own))
        _REGISTRY[name] = algo
        return fn

    return deco


def names() -> list[str]:
    """Every name ``algorithm=`` accepts."""
    return ["auto", *_REGISTRY]


def lookup(name: str) -> str:
    """Check an algorithm name (ValueError listing the known ones); returns it."""
    if name != "auto" and name not in _REGISTRY:
        raise ValueError(f"algorithm: unknown name {name!r} (known: {', '.join(names())})")
    return name


def choose(name: str, nbytes: int, ctx: Context, red: Reduction | None = None) -> Algorithm:
    """The algorithm a call of ``red`` on ``nbytes`` runs: ``auto`` is resolved here.

    ``RINGMPI_ALGORITHM`` overrides auto. Auto chooses among ringmpi's own
    algorithms the one the cost model (:mod:`ringmpi.tuning`) predicts fastest
    for this size, rank count and node layout; the choice is kept per
    communicator and size, so it costs one lookup after the first call.

    Where the reduction order matters (``ctx.reproducible`` and a floating or
    complex ``red``; None counts as one) auto chooses among :data:`KEEP_ORDER`,
    and a named algorithm outside it raises ValueError, before any message.

    For a half type the algorithm's half variant is returned; auto chooses among
    the algorithms that have one, and a named one without it raises ValueError
    (:data:`NO_HALF` says why), before any message.
    """
    half = red is not None and red.half != 0
    ordered = ctx.reproducible and (red is None or order_matters(red))
    if name != "auto":
        return _checked(_REGISTRY[name], ordered, red, "algorithm")
    settings = _settings.snapshot(_AUTO_SETTINGS)
    if settings[0] and _settings.get("RINGMPI_ALGORITHM") != "auto":
        found = _REGISTRY[lookup(_settings.get("RINGMPI_ALGORITHM"))]
        return _checked(found, ordered, red, "RINGMPI_ALGORITHM")
    found = ctx.chosen.get((nbytes, settings, ordered, half))
    algo = _REGISTRY[found if found is not None else _auto(nbytes, ctx, settings, ordered, half)]
    return algo.half if half else algo  # type: ignore[return-value]


def _checked(algo: Algorithm, ordered: bool, red: Reduction | None, where: str) -> Algorithm:
    if red is None or not red.half:
        return _keeps_order(algo, ordered, red, where)
    if algo.half is None:
        # Every half-type path folds in rank order: reproducible mode needs no more.
        raise ValueError(
            f"{where}: {algo.name!r} cannot reduce {red.describe()} with one rounding: "
            f"{NO_HALF.get(algo.name, 'it has no half-type path')}; algorithms that can: auto, "
            f"{', '.join(half_algorithms())} (shared_memory and hierarchical on one node only)"
        )
    return algo.half


def half_algorithms() -> list[str]:
    """The algorithms that take the half types."""
    return [name for name, algo in _REGISTRY.items() if algo.half is not None]


def order_matters(red: Reduction) -> bool:
    """Whether the order of reduction can change the bits of ``red``'s result: for
    floating and complex dtypes, every op (MAX and MIN too, on -0.0 and NaN).
    Integer and bool arithmetic wraps exactly: any order gives the same bits. The
    half types count (every algorithm that takes them folds in rank order)."""
    return red.dtype.kind in "fc" or red.half != 0


def _keeps_order(algo: Algorithm, ordered: bool, red: Reduction | None, where: str) -> Algorithm:
    if not ordered or algo.name in KEEP_ORDER:
        return algo
    what = red.describe() if red is not None else "this reduction"
    raise ValueError(
        f"{where}: {algo.name!r} cannot keep the rank order that reproducible mode needs "
        f"for {what}; algorithms that do: auto, {', '.join(KEEP_ORDER)} (shared_memory on "
        "one node only)"
    )


# What auto's choice depends on besides the size: read together, they key its cache.
_AUTO_SETTINGS = ("RINGMPI_ALGORITHM", "RINGMPI_TUNING", "RINGMPI_RANKS_PER_NODE",
                  "RINGMPI_NODE_PLACEMENT")  # fmt: skip


def _auto(nbytes: int, ctx: Context, settings: tuple, ordered: bool, half: bool = False) -> str:
    nodes, per_node = hierarchical.node_shape(ctx, *hierarchical.node_settings())
    costs = tuning.load(per_node)
    if half:  # the ones with a half-type path (all of which keep the rank order);
        # hierarchical's on one node only, and not where ranks crowd the cores (below)
        hier = nodes == 1 and not ctx.sleepy
        candidates = [a for a in usable(ctx) if _REGISTRY[a].half is not None
                      and (a != "hierarchical" or hier)]  # fmt: skip
    elif ordered:
        one_node = ctx.node.Get_size() == ctx.size
        candidates = [a for a in KEEP_ORDER if a != "shared_memory" or one_node]
    else:
        # Where ranks crowd the cores (8 or more per core) every node synchronisation of
        # the hierarchical algorithm polls and sleeps: the model's constants do not hold
        # there, and the algorithms that only exchange messages are kept.
        candidates = [a for a in usable(ctx) if a != "hierarchical" or not ctx.sleepy]
    found = tuning.choose(costs, nbytes, ctx.size, nodes, per_node, candidates)
    if len(ctx.chosen) >= _CHOICES_KEPT:
        ctx.chosen.clear()
    ctx.chosen[(nbytes, settings, ordered, half)] = found
    return found


_CHOICES_KEPT = 256


def usable(ctx: Context) -> list[str]:
    """ringmpi's algorithms that can run on ``ctx``'s communicator: shared_memory
    only where every rank is on one node."""
    one_node = ctx.node.Get_size() == ctx.size
    return [a for a in tuning.CANDIDATES if a != "shared_memory" or one_node]


def warm(red: Reduction | None = None) -> float:
    """Compile (or load from Numba's cache) the compiled loops of every algorithm for
    ``red``'s dtype, or for every dtype when None; returns the seconds it took."""
    t0 = time.perf_counter()
    _engine.warm(red)
    shared.warm(_engine.lane_kinds(red))
    hierarchical.warm(_engine.lane_kinds(red))
    return time.perf_counter() - t0


def get(name: str) -> Algorithm:
    return _REGISTRY[lookup(name)]


# Importing the modules registers them.
from . import chain, hierarchical, latency, mpi, ring, shared  # noqa: E402, F401
