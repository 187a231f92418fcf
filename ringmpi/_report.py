"""The one report every compiled loop fills when it stops early, and its one decoder.

A loop's state array ends with :data:`CELLS` int64 cells, ``[what, step, rank,
x, y]``: what went wrong (:data:`OK` when nothing did), the step it happened in,
the rank it concerns (in the loop's own numbering) and two details:

============  ==============================================================
MPI_ERROR     x: MPI's error code; y: the bytes the receive expected
WRONG_COUNT   x: the bytes that came; y: the bytes expected
WRONG_TAG     x: the tag that came
TIMED_OUT     x: 1 waiting for ``rank`` to take this rank's message, else 0
DISAGREE      x, y: the count and the (op, dtype) code ``rank`` announced
============  ==============================================================

Compiled code returns, never raises; :func:`raise_from` turns the cells into the
RingMPIError (or the timeout) with the loop's own words for steps and ranks.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np
from mpi4py import MPI

from ._comm import Context, disagreement, timed_out
from ._errors import RingMPIError

__all__ = ["CELLS", "DISAGREE", "HEADER", "H_AVG_BY", "H_CODE", "H_HALF", "H_REPORT", "H_SLEEPY",
           "H_TAG", "H_TIMEOUT", "MPI_ERROR", "OK", "TIMED_OUT", "WRONG_COUNT", "WRONG_TAG",
           "header", "parameters", "raise_from"]  # fmt: skip

OK, MPI_ERROR, WRONG_COUNT, WRONG_TAG, TIMED_OUT, DISAGREE = range(6)
CELLS = 5

# Every compiled loop's parameters (one int64 array) open with one header at these
# indices, read through header(): the op's number, the call's tag, whether to wait
# sleepily (yield the core between polls), the timeout in ns (0: none), the half type
# (Reduction.half; 0: none), what a half-type AVG fold divides by (0: none), and where
# the report's CELLS cells are. The loop's own cells follow from HEADER.
H_CODE, H_TAG, H_SLEEPY, H_TIMEOUT, H_HALF, H_AVG_BY, H_REPORT, HEADER = range(8)


@numba.njit(cache=True, nogil=True)
def header(params):
    """(code, tag, sleepy, timeout ns, half, avg_by, the report's cells) of ``params``."""
    at = params[H_REPORT]
    return (params[H_CODE], params[H_TAG], params[H_SLEEPY] != 0, params[H_TIMEOUT],
            params[H_HALF], params[H_AVG_BY], params[at : at + CELLS])  # fmt: skip


def parameters(cells: int, *, code: int, tag: int, sleepy: bool, timeout: float, half: int = 0,
               avg_by: int = 0) -> np.ndarray:  # fmt: skip
    """A loop's parameters: ``cells`` cells (the header, filled here with ``timeout`` in
    seconds, then the loop's own from HEADER on), then the report, which ends the array."""
    params = np.zeros(cells + CELLS, np.int64)
    params[:HEADER] = (code, tag, int(sleepy), round(timeout * 1e9), half, avg_by, cells)
    return params


def _messages(name: str, sending: int) -> str:
    return f"{name} to take its message" if sending else f"{name}'s message"


def raise_from(
    cells: np.ndarray,
    ctx: Context,
    timeout: float,
    where: Callable[[int], str],
    name: Callable[[int], str],
    *,
    count: int = 0,
    tag: int = 0,
    waiting: Callable[[str, int], str] = _messages,
) -> None:
    """Raise what ``cells`` report. ``where(step)`` says where this rank was ("rank 3:
    ring reduce-scatter step 1"), ``name(rank)`` names a rank the user knows,
    ``waiting(name, x)`` what a timed-out rank waited for; ``count`` and ``tag`` are
    this rank's call (what another's differed from). Every error but DISAGREE
    (which every rank sees alike, before any message) breaks the communicator off:
    the call's messages may still be in flight."""
    what, step, rank, x, y = (int(c) for c in cells)
    at, who = where(step), name(rank)
    if what == TIMED_OUT:
        raise timed_out(ctx, timeout, at, waiting(who, x))
    if what == DISAGREE:
        raise RingMPIError(f"{at}: {who}: {disagreement(x, count, y, tag)}")
    if what == WRONG_COUNT:
        said = f"{who} sent {x} bytes in a segment of {y}; ranks disagree on count or dtype"
    elif what == WRONG_TAG:
        said = f"message from {who}: " + ctx.disagreement(x, tag)
    elif MPI.Get_error_class(x) in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
        said = f"{who} sent more than the {y} bytes expected; ranks disagree on count or dtype"
    else:
        said = f"MPI error: {MPI.Get_error_string(x)}"
    ctx.break_off(f"{at}: {said}")
    raise RingMPIError(f"{at}: {said}")
