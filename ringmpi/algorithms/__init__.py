"""The registry of all-reduce algorithms.

Every algorithm has one signature, ``fn(work, red, ctx, source)``: ``work`` is
a 1-D C-contiguous array that receives the result; this rank's contribution is
``source`` (same size and dtype) or, when ``source`` is None, already in
``work``; ``red`` is the checked :class:`~ringmpi.kernels.Reduction` and ``ctx``
the communicator's :class:`~ringmpi._comm.Context`. Modules register
themselves with :func:`register`; ``algorithm=`` and the CLI's ``-a`` look
names up with :func:`lookup`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import _settings
from .._comm import Context
from ..kernels import Reduction

__all__ = ["Algorithm", "choose", "lookup", "names", "register"]

AlgorithmFn = Callable[[np.ndarray, Reduction, Context, "np.ndarray | None"], None]


@dataclass(frozen=True)
class Algorithm:
    name: str
    run: AlgorithmFn
    summary: str
    own: bool  # one of ringmpi's own (auto chooses among these), not a baseline


_REGISTRY: dict[str, Algorithm] = {}


def register(name: str, *, own: bool = True) -> Callable[[AlgorithmFn], AlgorithmFn]:
    """Class the decorated function as algorithm ``name``."""

    def deco(fn: AlgorithmFn) -> AlgorithmFn:
        summary = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        _REGISTRY[name] = Algorithm(name, fn, summary, own)
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


def choose(name: str, nbytes: int, ctx: Context) -> Algorithm:
    """The algorithm a call runs: ``auto`` is resolved here.

    ``RINGMPI_ALGORITHM`` overrides auto. Auto chooses among ringmpi's own
    algorithms; today that is the ring at every size (the latency algorithms
    and a cost model come later).
    """
    if name == "auto":
        name = _settings.get("RINGMPI_ALGORITHM") or "auto"
        lookup(name)
    if name == "auto":
        name = "ring"
    return _REGISTRY[name]


def get(name: str) -> Algorithm:
    return _REGISTRY[lookup(name)]


# Importing the modules registers them.
from . import hierarchical, latency, mpi, ring  # noqa: E402, F401
