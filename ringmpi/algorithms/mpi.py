"""The baseline: the MPI library's own MPI_Allreduce, on the same private communicator."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._comm import Context, complete
from ..kernels import Reduction
from . import register


@register("mpi", own=False)
def mpi_allreduce(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """MPI_Allreduce of the loaded MPI library (the baseline; its traffic is not traced)."""
    send = MPI.IN_PLACE if source is None else source
    if ctx.timeout:
        # A blocking MPI_Allreduce cannot give up: with a timeout, the nonblocking
        # one, polled. MPI does not say which rank it waits for.
        req = ctx.comm.Iallreduce(send, work, op=red.mpi_op)
        complete(req, ctx, f"rank {ctx.rank}: mpi MPI_Iallreduce",
                 "the other ranks (MPI does not say which)")  # fmt: skip
    else:
        ctx.comm.Allreduce(send, work, op=red.mpi_op)
    red.finish(work, ctx.size)
