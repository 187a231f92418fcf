"""The baseline: the MPI library's own MPI_Allreduce, on the same private communicator.

A first call goes through mpi4py. A call that repeats reaches MPI_Allreduce
from compiled code instead: no buffer parsing, no datatype lookup, one C call.
:func:`direct` prepares it (its handles in an int64 array): the API's C repeat
path (ringmpi._direct) makes that call itself, and the compiled calls below,
which check the arrays first, make it from the API's Python repeat path.
"""

from __future__ import annotations

import numba
import numpy as np
from mpi4py import MPI
from numba.extending import overload
from numba.np.numpy_support import as_dtype

from .. import _direct
from .._capi import (
    CELL_COMM,
    CELL_COUNT,
    CELL_DATATYPE,
    CELL_DTYPE,
    CELL_IN_PLACE,
    CELL_OP,
    handle,
    mpi_allreduce,
)
from .._comm import Context, library_allreduce
from ..kernels import DTYPES, Reduction
from .registry import STALE, register


def mpi_allreduce_run(
    work: np.ndarray,
    red: Reduction,
    ctx: Context,
    source: np.ndarray | None = None,
    timeout: float = 0.0,
) -> None:
    """MPI_Allreduce of the loaded MPI library (the baseline; its traffic is not traced)."""
    send = MPI.IN_PLACE if source is None else source
    library_allreduce(ctx, send, work, red.mpi_op, timeout, f"rank {ctx.rank}: mpi MPI_Iallreduce")
    red.finish(work, ctx.size)


# MPI_Allreduce takes a C int count; a larger one goes through mpi4py, which calls
# the large-count MPI_Allreduce_c.
_INT_MAX = 2**31 - 1


def _usable(array, written):
    """Whether compiled code may hand ``array`` to MPI as is: C-contiguous, aligned
    and, if MPI writes it, writeable (known from its type, when it compiles)."""


@overload(_usable)
def _usable_typed(array, written):
    ok = array.layout == "C" and array.aligned
    ok_written = ok and array.mutable
    return lambda array, written: ok_written if written else ok


def _dtype_number(work):
    """The NumPy number of ``work``'s dtype (known when it compiles)."""


@overload(_dtype_number)
def _dtype_number_typed(work):
    number = as_dtype(work.dtype).num
    return lambda work: number


@numba.njit(cache=True)
def _in_place(work, cells):
    """MPI_Allreduce(MPI_IN_PLACE, work): MPI's error code, or STALE (nothing sent)
    unless ``work`` is still what ``cells`` were made for."""
    if (
        not _usable(work, True)
        or work.size != cells[CELL_COUNT]
        or _dtype_number(work) != cells[CELL_DTYPE]
    ):
        return STALE
    return mpi_allreduce(cells[CELL_IN_PLACE], work.ctypes.data, work.size, cells[CELL_DATATYPE],
                         cells[CELL_OP], cells[CELL_COMM])  # fmt: skip


@numba.njit(cache=True)
def _from(work, source, cells):
    """MPI_Allreduce(source, work), as :func:`_in_place` (``source`` may be read-only)."""
    if (
        not _usable(work, True)
        or not _usable(source, False)
        or work.size != cells[CELL_COUNT]
        or source.size != work.size
        or _dtype_number(work) != cells[CELL_DTYPE]
        or _dtype_number(source) != cells[CELL_DTYPE]
    ):
        return STALE
    return mpi_allreduce(source.ctypes.data, work.ctypes.data, work.size, cells[CELL_DATATYPE],
                         cells[CELL_OP], cells[CELL_COMM])  # fmt: skip


def _number(dtype: np.dtype) -> int:
    """``dtype``'s number as compiled code sees it (int64's, for a ``longlong``)."""
    return as_dtype(numba.from_dtype(dtype)).num


def _cells(red: Reduction, ctx: Context, count: int) -> np.ndarray:
    # In CELL_* order; the datatype is the predefined one mpi4py itself sends this dtype as.
    return np.array([int(MPI.IN_PLACE), handle(MPI._typedict[red.dtype.char]),
                     handle(red.mpi_op), handle(ctx.comm), count, _number(red.dtype)],
                    np.int64)  # fmt: skip


def direct(red: Reduction, ctx: Context, count: int, timeout: float = 0.0):
    """(in_place, from, cells): MPI_Allreduce once more straight from compiled code,
    for the API's repeat path; None where the call needs Python (a timeout polls
    the nonblocking call, AVG divides after, a count above a C int goes through
    mpi4py)."""
    if timeout or count > _INT_MAX or red.partials() is not red:
        return None
    return _in_place, _from, _cells(red, ctx, count)


def warm(kinds) -> None:
    """Compile (or load from Numba's cache) the repeat's calls for 1-D arrays of the
    dtypes whose lanes are ``kinds`` (the baseline reduces the user's dtype itself:
    a complex dtype's lanes are its real parts)."""
    cells = numba.typeof(np.zeros(1, np.int64))
    for dt in DTYPES:
        if dt in kinds or (dt.kind == "c" and np.dtype(f"f{dt.itemsize // 2}") in kinds):
            arr = numba.typeof(np.zeros(1, dt))
            _in_place.compile((arr, cells))
            _from.compile((arr, arr, cells))
    _direct.warm()


register("mpi", mpi_allreduce_run, own=False, direct=direct, warm=warm,
         no_half="MPI has no bfloat16 datatype, and MPI_Allreduce on float16 (MPIX_C_FLOAT16, "
         "where it exists) rounds every partial result to 16 bits")  # fmt: skip
