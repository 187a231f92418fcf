"""The baseline: the MPI library's own MPI_Allreduce, on the same private communicator.

A first call goes through mpi4py. A call that repeats reaches MPI_Allreduce
from compiled code instead: no buffer parsing, no datatype lookup, one C call.
:func:`prepare` prepares it (its handles in an int64 array, ringmpi._capi's CELL_*
layout): the API's C repeat path (ringmpi._direct) makes that call itself, and
_direct's compiled calls, which check the arrays first, make it from the API's
Python repeat path.
"""

from __future__ import annotations

import numba
import numpy as np
from mpi4py import MPI

from .. import _direct
from .._capi import handle
from .._comm import Context, complete, library_allreduce
from ..kernels import DTYPES, Reduction
from .registry import Algorithm, Call, compiled, plain, register


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


def prepare(algo: Algorithm, red: Reduction, ctx: Context, count: int, timeout: float) -> Call:
    """The record's ``prepare``: MPI_Allreduce once more straight from compiled code
    (the API's repeat path reads its cells), or through mpi4py where the call needs
    Python (a timeout polls the nonblocking call, AVG divides after, a count above a
    C int goes through MPI_Allreduce_c)."""
    if not direct(red, count, timeout):
        return plain(algo, red, ctx, count, timeout)
    return compiled(algo, red, ctx, timeout, _direct.again_in_place,
                    _direct.again_from, _cells(red, ctx.comm, count))  # fmt: skip


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


register("mpi", mpi_allreduce_run, own=False, prepare=prepare, warm=warm,
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
