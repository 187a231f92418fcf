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


register("mpi", mpi_allreduce, own=False, auto=False,
         no_half="MPI has no bfloat16 datatype, and MPI_Allreduce on float16 (MPIX_C_FLOAT16, "
         "where it exists) rounds every partial result to 16 bits")  # fmt: skip
