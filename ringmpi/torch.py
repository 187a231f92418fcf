"""PyTorch: the ``ringmpi`` backend of ``torch.distributed``, a DistributedDataParallel
communication hook that averages through ringmpi, and tensors in the node's window
(:func:`empty`, :func:`zeros`).

Importing this module registers the backend (:mod:`ringmpi._torch_group`)::

    import ringmpi.torch
    torch.distributed.init_process_group("ringmpi")   # under mpirun or srun: MPI's ranks
    model = DistributedDataParallel(model)             # every collective through MPI

The hook, on a Gloo group::

    ringmpi.torch.init_process_group()               # Gloo, from mpirun's ranks
    model = DistributedDataParallel(model)          # its Gloo process group, as before
    model.register_comm_hook(MPI.COMM_WORLD, ringmpi.torch.allreduce_hook)

DDP keeps its process group for everything else (broadcasting the first
weights, buffers); each gradient bucket is averaged by ringmpi's nonblocking
all-reduce instead, on the progress thread, while backward goes on. The
communicator's ranks must be the process group's, in the same order
(``MPI.COMM_WORLD`` under ``mpirun``). CPU tensors only.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as objects.
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from . import _requests, _torch_group  # (importing _torch_group registers the backend)
from .kernels import AVG

__all__ = ["allreduce_hook", "empty", "init_process_group", "zeros"]


def init_process_group(comm: MPI.Intracomm | None = None, backend: str = "gloo") -> None:
    """``torch.distributed.init_process_group`` with ``comm``'s ranks (None:
    ``MPI.COMM_WORLD``), for a job started by ``mpirun``, whatever the environment
    says: its store hosted by ``comm``'s rank 0 on a port it picks."""
    comm = MPI.COMM_WORLD if comm is None else comm
    dist.init_process_group(backend, store=_torch_group.mpi_store(comm),
                            rank=comm.Get_rank(), world_size=comm.Get_size())  # fmt: skip


def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s gradients over ``state``'s ranks (an mpi4py communicator;
    None: ``MPI.COMM_WORLD``), as DDP's default hook does, through ringmpi."""
    tensor = bucket.buffer()
    if tensor.device.type != "cpu":
        raise TypeError(
            f"ringmpi.torch.allreduce_hook averages CPU gradients, not {tensor.device.type} "
            "ones: keep DDP's default hook (NCCL) for GPU models"
        )
    comm = MPI.COMM_WORLD if state is None else state
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def then(error: BaseException | None) -> None:
        if error is None:
            future.set_result(tensor)
        else:
            future.set_exception(cast(Any, error))  # torch types its argument as the result's

    _requests.start(tensor, AVG, comm, then)
    return future


def empty(shape: Any, dtype: torch.dtype = torch.float32,
          comm: MPI.Intracomm | None = None) -> torch.Tensor:  # fmt: skip
    """A CPU tensor in the node's window, uninitialized: the memory of
    :func:`ringmpi.empty` (collective over ``comm``; every rank on one node), which
    ``ringmpi.Allreduce`` reads where it lies. bfloat16 is allocated as 16-bit
    integers and viewed as it (NumPy has no bfloat16)."""
    from . import empty as window_empty  # noqa: PLC0415 -- (the package's lazy names)

    if dtype == torch.bfloat16:
        return torch.from_numpy(window_empty(shape, np.uint16, comm)).view(torch.bfloat16)
    kind = torch.empty(0, dtype=dtype).numpy().dtype
    return torch.from_numpy(window_empty(shape, kind, comm))


def zeros(shape: Any, dtype: torch.dtype = torch.float32,
          comm: MPI.Intracomm | None = None) -> torch.Tensor:  # fmt: skip
    """:func:`empty`, filled with zeros."""
    tensor = empty(shape, dtype, comm)
    tensor.zero_()
    return tensor


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
