"""The baseline: the MPI library's own MPI_Allreduce, on the same private communicator.

A first call goes through mpi4py. A call that repeats (the API's repeat path)
reaches MPI_Allreduce from compiled code instead: no buffer parsing, no
datatype lookup, one C call, so that it costs what mpi4py's own call costs
less mpi4py's argument handling.
"""

from __future__ import annotations

import numba
import numpy as np
from mpi4py import MPI

from .._capi import handle, mpi_allreduce
from .._comm import Context, library_allreduce
from ..kernels import DTYPES, Reduction
from .registry import register

# The cells of a compiled call: MPI_IN_PLACE's address, the datatype, op and
# communicator handles.
IN_PLACE, DATATYPE, OP, COMM = range(4)


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
_TOO_MANY = -1  # not an MPI error code (those are >= 0)


@numba.njit(cache=True)
def _allreduce(work, source, cells):
    """MPI_Allreduce of ``source`` (in place when it is ``work``) into ``work``;
    returns MPI's error code, or _TOO_MANY for a count above a C int."""
    if work.size > _INT_MAX:
        return _TOO_MANY
    send = cells[IN_PLACE] if source.ctypes.data == work.ctypes.data else source.ctypes.data
    return mpi_allreduce(send, work.ctypes.data, work.size, cells[DATATYPE], cells[OP],
                         cells[COMM])  # fmt: skip


def _entry(dtype: np.dtype):
    """The compiled call's entry point for arrays of ``dtype`` (past Numba's dispatcher:
    the API's repeat path has checked the arrays' dtype and layout)."""
    arr = numba.typeof(np.zeros(1, dtype))
    return _allreduce.compile((arr, arr, numba.typeof(np.zeros(4, np.int64))))


def prepare(red: Reduction, ctx: Context, timeout: float = 0.0):
    """``again(work, source)``: MPI_Allreduce once more, from compiled code (without a
    timeout; with one, the plain call, which polls the nonblocking one)."""
    if timeout:
        return None
    # The predefined datatype mpi4py itself sends this dtype as.
    cells = np.array([int(MPI.IN_PLACE), handle(MPI._typedict[red.dtype.char]),
                      handle(red.mpi_op), handle(ctx.comm)], np.int64)  # fmt: skip
    entry, size, comm, op = _entry(red.dtype), ctx.size, ctx.comm, red.mpi_op
    finish = red.finish if red.partials() is not red else None  # AVG divides

    def again(work: np.ndarray, source: np.ndarray) -> None:
        err = entry(work, source, cells)
        if err == _TOO_MANY:
            comm.Allreduce(MPI.IN_PLACE if source is work else source, work, op)
        elif err:
            raise MPI.Exception(err)
        if finish is not None:
            finish(work, size)

    return again


def warm(kinds) -> None:
    """Compile (or load from Numba's cache) the repeat's call for the dtypes whose
    lanes are ``kinds`` (the baseline reduces the user's dtype itself: a complex
    dtype's lanes are its real parts)."""
    for dt in DTYPES:
        if dt in kinds or (dt.kind == "c" and np.dtype(f"f{dt.itemsize // 2}") in kinds):
            _entry(dt)


register("mpi", mpi_allreduce_run, own=False, prepare=prepare, warm=warm,
         no_half="MPI has no bfloat16 datatype, and MPI_Allreduce on float16 (MPIX_C_FLOAT16, "
         "where it exists) rounds every partial result to 16 bits")  # fmt: skip
