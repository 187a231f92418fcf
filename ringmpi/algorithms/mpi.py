"""The baseline: the MPI library's own MPI_Allreduce, on the same private communicator.

A first call goes through mpi4py. A call that repeats reaches MPI_Allreduce
from compiled code instead: no buffer parsing, no datatype lookup, one C call.
:func:`compiled` prepares it (its handles in an int64 array, ringmpi._capi's CELL_*
layout): the API's C repeat path (ringmpi._direct) makes that call itself, and
_direct's compiled calls, which check the arrays first, make it from the API's
Python repeat path.
"""

from __future__ import annotations

import numba
import numpy as np
from mpi4py import MPI

from .. import _builtins, _direct, _progress
from .._capi import CELL_COMM, CELL_DATATYPE, CELL_OP, CELL_OWN, handle, mpi_allreduce, peek, poke
from .._comm import Context, complete, library_allreduce
from ..kernels import DTYPES, Reduction
from .registry import STALE, Call, register


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


def _cells(red: Reduction, comm: MPI.Comm, count: int, fn: int = 0, *own: int) -> np.ndarray:
    # In CELL_* order, then ``own`` from CELL_OWN; the datatype is the predefined one
    # mpi4py itself sends this dtype as.
    return np.array([int(MPI.IN_PLACE), handle(MPI._typedict[red.dtype.char]),
                     handle(red.mpi_op), handle(comm), count, _direct.number(red.dtype), fn, 0,
                     *own], np.int64)  # fmt: skip


def direct(red: Reduction, count: int, timeout: float = 0.0) -> bool:
    """Whether MPI_Allreduce of ``count`` elements of ``red`` can be made straight from
    compiled code: not with a timeout (which polls the nonblocking call), nor for AVG
    (which divides after), nor above a C int's count (mpi4py calls MPI_Allreduce_c)."""
    return not timeout and count <= _INT_MAX and red.partials() is red


def compiled(red: Reduction, ctx: Context, count: int, timeout: float = 0.0):
    """(in_place, from, cells): MPI_Allreduce once more straight from compiled code,
    for the API's repeat path; None where the call needs Python (a timeout polls
    the nonblocking call, AVG divides after, a count above a C int goes through
    mpi4py)."""
    if not direct(red, count, timeout):
        return None
    return _direct.again_in_place, _direct.again_from, _cells(red, ctx.comm, count)


# A leased call's cells (_cells' and then) the address of its class's cell of calls
# left (see leased), and that of _progress.in_job.
_LEFT, _IN_JOB = CELL_OWN, CELL_OWN + 1


def _leased_call(cells, sbuf, rbuf, count):
    """The C function of a leased call (_capi's CELL_FN): STALE, sending nothing,
    once its class has no calls left or inside a nonblocking call's job; else one
    call fewer left, and MPI_Allreduce."""
    left = peek(cells + 8 * _LEFT)
    calls = peek(left)
    if calls <= 0 or peek(peek(cells + 8 * _IN_JOB)) != 0:
        return STALE
    poke(left, calls - 1)
    datatype, op = peek(cells + 8 * CELL_DATATYPE), peek(cells + 8 * CELL_OP)
    return np.int64(mpi_allreduce(sbuf, rbuf, count, datatype, op, peek(cells + 8 * CELL_COMM)))


def leased(red: Reduction, comm: MPI.Intracomm, count: int, left: np.ndarray) -> Call:
    """MPI_Allreduce of ``count`` elements of ``red`` on ``comm`` itself (the user's
    communicator: the library's own collective needs no private one) while ``left``
    (an int64 cell, shared by every call of a size class) holds calls left, each
    call counting it down; then, and inside a nonblocking call's job, STALE,
    sending nothing (the caller takes the full path, where auto's tuner goes on).
    For :func:`direct` calls only."""
    cells = _cells(red, comm, count, _builtins.compiled(_leased_call), left.ctypes.data,
                   _progress.in_job.ctypes.data)  # fmt: skip

    def again(work: np.ndarray, source: np.ndarray) -> None:
        err = (_direct.again_in_place(work, cells) if source is work
               else _direct.again_from(work, source, cells))  # fmt: skip
        if err == STALE:  # no calls left, or other arrays: the call through mpi4py
            MPI.Comm.Allreduce(comm, MPI.IN_PLACE if source is work else source, work, red.mpi_op)
        elif err:
            raise MPI.Exception(err)

    again.left = left  # type: ignore[attr-defined]  # kept: its address is in the cells
    return Call(again, cells, _direct.again_in_place, _direct.again_from)


def warm(kinds) -> None:
    """Compile (or load from Numba's cache) the repeat's calls for 1-D arrays of the
    dtypes whose lanes are ``kinds`` (the baseline reduces the user's dtype itself:
    a complex dtype's lanes are its real parts)."""
    cells = numba.typeof(np.zeros(1, np.int64))
    for dt in DTYPES:
        if dt in kinds or (dt.kind == "c" and np.dtype(f"f{dt.itemsize // 2}") in kinds):
            arr = numba.typeof(np.zeros(1, dt))
            _direct.again_in_place.compile((arr, cells))
            _direct.again_from.compile((arr, arr, cells))
    _direct.warm()
    _builtins.compiled(_leased_call)


register("mpi", mpi_allreduce_run, own=False, compiled=compiled, warm=warm,
         no_half="MPI has no bfloat16 datatype, and MPI_Allreduce on float16 (MPIX_C_FLOAT16, "
         "where it exists) rounds every partial result to 16 bits")  # fmt: skip


def mpi_reduce_scatter_run(work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray,
                           timeout: float, counts) -> None:  # fmt: skip
    """MPI_Reduce_scatter of the loaded MPI library (the baseline; not traced)."""
    if red.half and red.name == "avg":
        raise TypeError(f"reduce-scatter: {red.describe()} through the library's call: MPI has "
                        "no average, and a 16-bit sum divided afterwards would round twice "
                        "(shared_memory, on one node, averages with one rounding)")  # fmt: skip
    comm, r = ctx.comm, ctx.rank
    into = source if np.may_share_memory(work, source) else work  # in place: MPI's own way
    send = MPI.IN_PLACE if into is source else source
    even = len(set(counts)) == 1
    if timeout:
        req = (comm.Ireduce_scatter_block(send, into, red.mpi_op) if even
               else comm.Ireduce_scatter(send, into, list(counts), red.mpi_op))  # fmt: skip
        complete(req, ctx, timeout, f"rank {r}: mpi MPI_Ireduce_scatter",
                 "the other ranks (MPI does not say which)")  # fmt: skip
    elif even:
        comm.Reduce_scatter_block(send, into, red.mpi_op)
    else:
        comm.Reduce_scatter(send, into, list(counts), red.mpi_op)
    if into is source and work.ctypes.data != source.ctypes.data:  # not already there
        work[...] = source[: counts[r]]
    if not red.half:
        red.finish(work, ctx.size)


def mpi_allgather_run(work: np.ndarray, red: Reduction, ctx: Context, source: None,
                      timeout: float, counts) -> None:  # fmt: skip
    """MPI_Allgather of the loaded MPI library (the baseline; not traced)."""
    if timeout:
        complete(
            ctx.comm.Iallgather(MPI.IN_PLACE, work),
            ctx,
            timeout,
            f"rank {ctx.rank}: mpi MPI_Iallgather",
            "the other ranks (MPI does not say which)",
        )
    else:
        ctx.comm.Allgather(MPI.IN_PLACE, work)


register("mpi", mpi_reduce_scatter_run, collective="reduce_scatter", own=False,
         half=mpi_reduce_scatter_run)  # fmt: skip
register("mpi", mpi_allgather_run, collective="allgather", own=False)


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
