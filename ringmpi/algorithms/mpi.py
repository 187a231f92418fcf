"""The baseline: the MPI library's own MPI_Allreduce, on the same private communicator."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._comm import Context, complete
from ..kernels import Reduction
from .registry import register


def mpi_allreduce(
    work: np.ndarray,
    red: Reduction,
    ctx: Context,
    source: np.ndarray | None = None,
    timeout: float = 0.0,
) -> None:
    """MPI_Allreduce of the loaded MPI library (the baseline; its traffic is not traced)."""
    send = MPI.IN_PLACE if source is None else source
    if timeout:
        # A blocking MPI_Allreduce cannot give up: with a timeout, the nonblocking
        # one, polled. MPI does not say which rank it waits for.
        req = ctx.comm.Iallreduce(send, work, op=red.mpi_op)
        complete(req, ctx, timeout, f"rank {ctx.rank}: mpi MPI_Iallreduce",
                 "the other ranks (MPI does not say which)")  # fmt: skip
    else:
        ctx.comm.Allreduce(send, work, op=red.mpi_op)
    red.finish(work, ctx.size)


def prepare(red: Reduction, ctx: Context, timeout: float = 0.0):
    """``again(work, source)``: MPI_Allreduce once more, straight to mpi4py (without a
    timeout; with one, the plain call, which polls the nonblocking one)."""
    if timeout:
        return None
    allreduce, op, finish, size = ctx.comm.Allreduce, red.mpi_op, red.finish, ctx.size

    def again(work: np.ndarray, source: np.ndarray) -> None:
        allreduce(MPI.IN_PLACE if source is work else source, work, op)
        finish(work, size)

    return again


register("mpi", mpi_allreduce, own=False, auto=False, prepare=prepare,
         no_half="MPI has no bfloat16 datatype, and MPI_Allreduce on float16 (MPIX_C_FLOAT16, "
         "where it exists) rounds every partial result to 16 bits")  # fmt: skip
