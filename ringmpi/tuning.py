"""The cost model ``algorithm="auto"`` chooses by.

Each algorithm's record gives its predicted time for ``n`` bytes on ``p``
ranks as terms -- how many of each machine constant it costs (its ``terms``)
-- and :func:`predict` sums constant x count (Thakur, Rabenseifner and Gropp,
2005; NCCL's tuner chooses the same way). The constants:

* alpha -- seconds per step (a message's latency, here through the step engine),
* beta -- seconds per byte sent,
* gamma -- seconds per byte reduced,
* call -- per call of an engine algorithm (the Python around the compiled loop),

and the shared-memory phases' own (``node_*``, ``shm_*``, see :class:`Costs`).
An algorithm may declare constants of its own, with defaults; a tuning file
may set them too.

The defaults (:func:`defaults`: :data:`DEFAULTS` fitted with 2 ranks on a
node, :data:`CROWDED` with 16, in between interpolated) are sensible for ranks
that share a node's memory; ``python -m ringmpi tune`` measures the constants
for the machine and layout at hand and writes them as JSON, which the
``tuning`` setting (``RINGMPI_TUNING``) points to. Every rank computes the
same prediction from the same inputs, so all choose alike without a message.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, fields

from ._settings import check_with, current

__all__ = [
    "CROWDED",
    "DEFAULTS",
    "Costs",
    "check_file",
    "choose",
    "defaults",
    "load",
    "predict",
    "pricing",
    "pricing_with",
]


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
    shm_wait: float  # shared_memory: per flag a rank waits on (p flags a wait)
    shm_byte: float  # shared_memory: per byte a rank stores to the window or loads from it
    # Constants an algorithm declares itself (Algorithm.constants), as a tuning file sets them.
    extra: tuple[tuple[str, float], ...] = ()


# Untuned, for nodes of 2 ranks: rounded from the fits of python -m ringmpi tune on a
# 2-core machine, gamma and node_call raised to its measured crossovers
# (docs/performance.md).
DEFAULTS = Costs(
    alpha=1.2e-6,
    beta=1.6e-10,
    gamma=3.0e-10,
    call=4.0e-6,
    node_call=40e-6,
    node_step=8e-6,
    node_byte=1.6e-10,
    shm_wait=0.1e-6,
    shm_byte=0.8e-10,
)

# Untuned, for nodes of 16 ranks: rounded from the fit to 16-rank sweeps on a 16-core
# host (docs/performance.md): shared memory bandwidth costs each byte more, and a
# node synchronisation waits for more ranks.
CROWDED = Costs(
    alpha=1.5e-6,
    beta=4.2e-10,
    gamma=0.3e-10,
    call=13e-6,
    node_call=10e-6,
    node_step=48e-6,
    node_byte=7.0e-10,
    shm_wait=12.8e-9,
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
    small, crowded = _constants(DEFAULTS), _constants(CROWDED)
    return Costs(**{k: small[k] ** (1 - t) * crowded[k] ** t for k in small})


def _constants(costs: Costs) -> dict[str, float]:
    """The model's own constants (not an algorithm's ``extra`` ones), by name."""
    return {f.name: getattr(costs, f.name) for f in fields(Costs) if f.name != "extra"}


def value(costs: Costs, algo, name: str) -> float:
    """Constant ``name`` for ``algo``: the model's, or one the algorithm declares
    (a tuning file's value, else the algorithm's default)."""
    if name in _MODEL:
        return getattr(costs, name)
    for key, v in costs.extra:
        if key == name:
            return v
    try:
        return algo.constants[name]
    except KeyError:
        raise ValueError(f"{algo.name}: its terms use {name!r}, a constant it does not "
                         "declare (Algorithm.constants)") from None  # fmt: skip


def predict(costs: Costs, algo, n: float, p: int, nodes: int = 1, per_node: int = 1) -> float:
    """Predicted seconds of one call of ``algo`` (a record with ``terms``)."""
    with pricing_with(costs):
        terms = algo.terms(n, p, nodes, per_node)
    return sum(value(costs, algo, k) * v for k, v in terms.items())


# The constants predict() prices with, while it asks an algorithm for its terms.
_pricing: contextvars.ContextVar[Costs | None] = contextvars.ContextVar("pricing", default=None)


@contextlib.contextmanager
def pricing_with(costs: Costs) -> Iterator[Costs]:
    """Price with ``costs`` inside a ``with`` block, as :func:`predict` does (a
    replay that must make the choices the model makes with them)."""
    token = _pricing.set(costs)
    try:
        yield costs
    finally:
        _pricing.reset(token)


def pricing(per_node: int) -> Costs:
    """The constants an algorithm with a choice inside (hierarchical's phase across
    nodes) makes it by: those :func:`predict` is pricing with, so that the terms it
    gives are the variant it would run; outside predict (a call), :func:`load`'s."""
    return _pricing.get() or load(per_node)


def choose(costs: Costs, n: float, p: int, nodes: int, per_node: int, candidates):
    """The candidate record with the smallest predicted time (the first of equals);
    records the model has no terms for (the MPI baseline) are not ranked."""
    modelled = [a for a in candidates if a.terms is not None]
    return min(modelled, key=lambda a: predict(costs, a, n, p, nodes, per_node))


_loaded: dict[tuple[str, float, int], Costs] = {}


def load(per_node: int = _SMALL) -> Costs:
    """The constants of the file ``RINGMPI_TUNING`` names, or :func:`defaults` for
    nodes of ``per_node`` ranks.

    A file is read once (and again when it changes); a missing or bad file is an
    error naming it, not a silent fallback.
    """
    path = current().tuning
    if not path:
        return defaults(per_node)
    return _read(path, per_node, "RINGMPI_TUNING")


def check_file(path: str, says: str) -> None:
    """ValueError, naming ``says``, unless ``path`` is a readable tuning file."""
    _read(path, _SMALL, says)


check_with("tuning", check_file)  # a file named from code or the environment is read there


def _read(path: str, per_node: int, says: str) -> Costs:
    try:
        stamp = os.stat(path).st_mtime
    except OSError as exc:
        raise ValueError(f"{says}: cannot read {path!r}: {exc.strerror}") from None
    found = _loaded.get((path, stamp, per_node))
    if found is None:
        try:
            with open(path) as fh:
                data = json.load(fh)
            given = dict(data["costs"])
            # A file written before the shared_memory algorithm keeps the defaults for it.
            for name in _LATER:
                given.setdefault(name, getattr(defaults(per_node), name))
            own = {name: float(given.pop(name)) for name in _MODEL}
            extra = tuple(sorted((str(k), float(v)) for k, v in given.items()))
            found = Costs(**own, extra=extra)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{says}: {path!r} is not a tuning file: {exc}") from None
        _loaded[(path, stamp, per_node)] = found
    return found


def as_dict(costs: Costs) -> dict[str, float]:
    """The constants by name, an algorithm's own ones too (a tuning file's "costs")."""
    return {**_constants(costs), **dict(costs.extra)}


_MODEL = frozenset(f.name for f in fields(Costs) if f.name != "extra")


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("tune")
