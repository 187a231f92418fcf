"""Helpers shared by the tests of the library API under MPI (tests/test_mpi_api_*.py).

Inputs are :func:`ringmpi.verify.verify_inputs` (SUM unless a test says
otherwise), so every expected value is exact. Every check collects problems and
hands them to :func:`conftest.agree`, so all ranks pass or fail a test together.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from mpi4py import MPI

from ringmpi import verify

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
SENTINEL = -1000  # never a result: |inputs| <= 4 per rank
ALGORITHMS = ("ring", "recursive_doubling", "rabenseifner", "shared_memory", "mpi", "auto")

needs_two_ranks = pytest.mark.skipif(SIZE < 2, reason="needs at least 2 ranks to disagree")


def communicators():
    """COMM_SELF, COMM_WORLD, one half of WORLD (color = rank % 2) and a duplicate of WORLD.

    A module's fixture: ``comms = pytest.fixture(scope="module")(communicators)``.
    """
    half = WORLD.Split(RANK % 2, RANK)
    dup = WORLD.Dup()
    yield {"self": MPI.COMM_SELF, "world": WORLD, "half": half, "dup": dup}
    half.Free()
    dup.Free()


def inputs(shape, dtype="float64", comm=WORLD, op=MPI.SUM) -> np.ndarray:
    """This rank's input of ``shape`` in ``comm``."""
    count = int(np.prod(shape, dtype=np.int64))
    return verify.verify_inputs(op, dtype, comm.Get_rank(), count).reshape(shape)


def expected(shape, dtype="float64", comm=WORLD, op=MPI.SUM) -> np.ndarray:
    """The exact all-reduce of :func:`inputs` over ``comm``."""
    count = int(np.prod(shape, dtype=np.int64))
    return verify.verify_expected(op, dtype, comm.Get_size(), count).reshape(shape)


def mismatch(what: str, got, want) -> list[str]:
    """No problem if ``got`` has the shape, dtype and values of ``want``; else one."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return [
            f"{what}: got {got.dtype}{list(got.shape)}, expected {want.dtype}{list(want.shape)}"
        ]
    if not np.array_equal(got, want):
        where = np.argwhere(got != want)[:3]
        at = tuple(where.T)
        return [f"{what}: at {where.tolist()} got {got[at]}, expected {want[at]}"]
    return []


def raised(exc: type[Exception], fn: Callable[..., object], *args, **kwargs) -> str | None:
    """The message of the ``exc`` that ``fn(*args, **kwargs)`` raises, or None if it returns."""
    try:
        fn(*args, **kwargs)
    except exc as e:
        return str(e)
    return None


def filled(shape, dtype="float64", order="C") -> np.ndarray:
    """An array of ``shape`` holding :data:`SENTINEL` everywhere."""
    return np.full(shape, SENTINEL, dtype, order=order)


def says(message: str | None, words: str) -> list[str]:
    """No problem if an error was raised and its ``message`` says ``words``."""
    if message is None:
        return ["no RingMPIError"]
    return [] if words in message else [f"{message!r} does not say {words!r}"]
