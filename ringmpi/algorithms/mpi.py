"""The baseline: the MPI library's own MPI_Allreduce, on the same private communicator."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .._comm import Context
from ..kernels import Reduction
from . import register


@register("mpi", own=False)
def mpi_allreduce(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """MPI_Allreduce of the loaded MPI library (the baseline; its traffic is not traced)."""
    ctx.comm.Allreduce(MPI.IN_PLACE if source is None else source, work, op=red.mpi_op)
    red.finish(work, ctx.size)
