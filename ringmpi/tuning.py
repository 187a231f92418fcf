"""The cost model ``algorithm="auto"`` chooses by.

Each of ringmpi's own algorithms gets a predicted time for ``n`` bytes on
``p`` ranks from three machine constants (Thakur, Rabenseifner and Gropp,
2005; NCCL's tuner chooses the same way):

* alpha -- seconds per step (a message's latency, here through the step engine),
* beta -- seconds per byte sent,
* gamma -- seconds per byte reduced,

plus a fixed cost per call, and, for the hierarchical algorithm's
shared-memory phase, a fixed cost, a cost per pipeline step and one per byte
of the buffer; for the shared_memory algorithm a cost per rank it waits for
and per byte it folds. With p' the largest power of two <= p and the fold of
the other p - p' ranks (two more steps moving the whole buffer)::

    ring                2(p-1) alpha + 2n(p-1)/p beta + n(p-1)/p gamma
    recursive_doubling  lg p' (alpha + n beta + n gamma)               + fold
    rabenseifner        2 lg p' alpha + 2n(p'-1)/p' beta + n(p'-1)/p' gamma + fold
    hierarchical        node phase + the ring over the M nodes on n/L bytes
    shared_memory       2 k p shm_wait + n p shm_byte   (k pieces of 64 KiB; one node)
    chain               (P + K)(r alpha + r n/P beta + n/P gamma)   (reproducible mode)

The chain (:func:`ringmpi.plans.chain`) takes P + K ticks of one piece of n/P
bytes, K = 1 at 2 ranks and 2p - 4 beyond, r = 1 row per tick at 2 ranks and
2 beyond (a partial, then a finished piece). It never wins against the ring
(more rows, as many bytes or more), so auto considers it only in reproducible
mode, against shared_memory, the one other algorithm that keeps rank order.

The defaults (:func:`defaults`: :data:`DEFAULTS` measured with 2 ranks on a
node, :data:`CROWDED` with 16, in between interpolated) are sensible for ranks
that share a node's memory; ``python -m ringmpi.tune`` measures the constants for the machine and
layout at hand and writes them as JSON, which ``RINGMPI_TUNING`` points to.
Every rank computes the same prediction from the same inputs, so all choose
alike without a message.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, fields

from ._settings import get
from .plans import chain_pieces

__all__ = ["CROWDED", "DEFAULTS", "Costs", "choose", "defaults", "load", "predict", "terms"]

# The algorithms auto chooses among (each is registered under this name).
CANDIDATES = ("ring", "recursive_doubling", "rabenseifner", "hierarchical", "shared_memory")

# Bytes of the buffer a hierarchical pipeline step handles (its cached way's piece).
_PIECE = 1 << 21
# Bytes of the buffer one shared_memory synchronisation carries (its SET_BYTES).
_SET = 1 << 16


@dataclass(frozen=True)
class Costs:
    """The model's constants, in seconds."""

    alpha: float  # per step
    beta: float  # per byte sent
    gamma: float  # per byte reduced
    call: float  # per call of an engine algorithm (the Python around the compiled loop)
    node_call: float  # per hierarchical call (its Python and its first synchronisation)
    node_step: float  # per hierarchical pipeline step (a node synchronisation)
    node_byte: float  # per byte of the buffer in the hierarchical node phase
    shm_wait: float  # shared_memory: per flag a rank waits on (a rank, twice a piece)
    shm_byte: float  # shared_memory: per byte of one rank's contribution folded


# Untuned, for nodes of 2 ranks: a node's ranks talking through shared memory,
# rounded from the fits of python -m ringmpi.tune on a 2-core virtual machine
# (2026-11-30), with gamma and node_call raised to where that machine's measured
# crossovers are (recursive doubling up to a few KiB, where MPICH's message cost
# steps up; the ring up to 256 KiB; hierarchical from 1 MiB at 2 ranks):
# docs/performance.md.
DEFAULTS = Costs(
    alpha=1.2e-6,
    beta=1.6e-10,
    gamma=3.0e-10,
    call=4.0e-6,
    node_call=40e-6,
    node_step=8e-6,
    node_byte=1.6e-10,
    shm_wait=0.1e-6,
    shm_byte=0.3e-9,
)

# Untuned, for nodes of 16 ranks: rounded from the fit of the same model to the
# 16-rank sweeps of every algorithm on a 16-core host (MPICH 5.0.2, 2026-11-30,
# docs/performance.md). Memory bandwidth shared by more ranks costs each byte
# more, and a node synchronisation waits for more ranks.
CROWDED = Costs(
    alpha=1.5e-6,
    beta=4.2e-10,
    gamma=0.3e-10,
    call=13e-6,
    node_call=10e-6,
    node_step=48e-6,
    node_byte=7.0e-10,
    shm_wait=6.4e-9,
    shm_byte=1.3e-10,
)
_SMALL, _CROWDED = 2, 16  # the ranks per node of DEFAULTS and CROWDED
_LATER = ("shm_wait", "shm_byte")  # constants tuning files may lack (added later)


def defaults(per_node: int) -> Costs:
    """The untuned constants for nodes of ``per_node`` ranks: DEFAULTS at 2 and
    below, CROWDED at 16 and above, each constant geometrically in between (in
    log2 of the ranks per node; the fits at 4 and 8 ranks lie close to that line)."""
    if per_node <= _SMALL:
        return DEFAULTS
    if per_node >= _CROWDED:
        return CROWDED
    t = math.log(per_node / _SMALL) / math.log(_CROWDED / _SMALL)
    small, crowded = asdict(DEFAULTS), asdict(CROWDED)
    return Costs(**{k: small[k] ** (1 - t) * crowded[k] ** t for k in small})


def _fold(p: int) -> tuple[int, int]:
    """(p', rem): the power of two the latency plans run on, and the folded ranks."""
    q = 1 << (p.bit_length() - 1)
    return q, p - q


def terms(algorithm: str, n: float, p: int, nodes: int = 1, per_node: int = 1) -> dict[str, float]:
    """The model's terms for ``algorithm``: how many of each constant it costs.

    ``nodes`` and ``per_node`` (the largest node's ranks) matter only to the
    hierarchical algorithm.
    """
    if p <= 1:
        return {"call": 1.0}
    if algorithm == "ring":
        return {"call": 1.0, "alpha": 2.0 * (p - 1), "beta": 2 * n * (p - 1) / p,
                "gamma": n * (p - 1) / p}  # fmt: skip
    q, rem = _fold(p)
    lg = math.log2(q)
    fold = {"alpha": 2.0, "beta": 2.0 * n, "gamma": n} if rem else {}
    if algorithm == "recursive_doubling":
        t = {"call": 1.0, "alpha": lg, "beta": n * lg, "gamma": n * lg}
    elif algorithm == "rabenseifner":
        t = {"call": 1.0, "alpha": 2 * lg, "beta": 2 * n * (q - 1) / q, "gamma": n * (q - 1) / q}
    elif algorithm == "hierarchical":
        pieces = max(1, math.ceil(n / _PIECE))
        steps = pieces + 2 if nodes == 1 else 2 * (pieces + 1)
        t = {"node_call": 1.0, "node_step": float(steps), "node_byte": n if per_node > 1 else 0.0}
        if nodes > 1:
            across = terms("ring", n / per_node, nodes)
            t.update({k: v for k, v in across.items() if k != "call"})
        return t
    elif algorithm == "shared_memory":
        pieces = max(1, math.ceil(n / _SET))
        return {"call": 1.0, "shm_wait": 2.0 * pieces * p, "shm_byte": n * p}
    elif algorithm == "chain":
        pieces = chain_pieces(p, max(1, int(n)))
        ticks, rows = pieces + (1 if p == 2 else 2 * p - 4), 1 if p == 2 else 2
        return {"call": 1.0, "alpha": float(rows * ticks), "beta": rows * ticks * n / pieces,
                "gamma": ticks * n / pieces}  # fmt: skip
    else:
        raise ValueError(f"no cost model for {algorithm!r}")
    for k, v in fold.items():
        t[k] = t.get(k, 0.0) + v
    return t


def predict(costs: Costs, algorithm: str, n: float, p: int, nodes: int = 1, per_node: int = 1):
    """Predicted seconds of one call."""
    return sum(getattr(costs, k) * v for k, v in terms(algorithm, n, p, nodes, per_node).items())


def choose(costs: Costs, n: float, p: int, nodes: int, per_node: int, candidates=CANDIDATES) -> str:
    """The candidate with the smallest predicted time (the first of equals)."""
    return min(candidates, key=lambda a: predict(costs, a, n, p, nodes, per_node))


_loaded: dict[tuple[str, float, int], Costs] = {}


def load(per_node: int = _SMALL) -> Costs:
    """The constants of the file ``RINGMPI_TUNING`` names, or :func:`defaults` for
    nodes of ``per_node`` ranks.

    A file is read once (and again when it changes); a missing or bad file is an
    error naming it, not a silent fallback.
    """
    path = get("RINGMPI_TUNING")
    if not path:
        return defaults(per_node)
    try:
        stamp = os.stat(path).st_mtime
    except OSError as exc:
        raise ValueError(f"RINGMPI_TUNING: cannot read {path!r}: {exc.strerror}") from None
    found = _loaded.get((path, stamp, per_node))
    if found is None:
        try:
            with open(path) as fh:
                data = json.load(fh)
            given = dict(data["costs"])
            # A file written before the shared_memory algorithm keeps the defaults for it.
            for name in _LATER:
                given.setdefault(name, getattr(defaults(per_node), name))
            found = Costs(**{f.name: float(given[f.name]) for f in fields(Costs)})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"RINGMPI_TUNING: {path!r} is not a tuning file: {exc}") from None
        _loaded[(path, stamp, per_node)] = found
    return found


def as_dict(costs: Costs) -> dict[str, float]:
    return asdict(costs)
