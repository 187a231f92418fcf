"""The ``ringmpi`` backend through each of torch's own rendezvous, under mpirun
(make test-torch): env://, tcp:// and file://, torch's ranks given as MPI's."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ringmpi.torch  # noqa: E402, F401 -- registers the backend

pytestmark = [pytest.mark.mpi, pytest.mark.torch]

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_each_rendezvous_starts_the_backend(method, monkeypatch):
    port = WORLD.bcast(_free_port() if RANK == 0 else None)
    path = WORLD.bcast(tempfile.mktemp(prefix="ringmpi-rendezvous-") if RANK == 0 else None)
    kwargs = {"rank": RANK, "world_size": SIZE}
    if method == "env":
        for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                            "RANK": str(RANK), "WORLD_SIZE": str(SIZE)}.items():  # fmt: skip
            monkeypatch.setenv(name, value)
        kwargs = {"init_method": "env://"}
    elif method == "tcp":
        kwargs["init_method"] = f"tcp://127.0.0.1:{port}"
    else:
        kwargs["init_method"] = f"file://{path}"
    try:
        dist.init_process_group("ringmpi", **kwargs)
        x = torch.full((5,), float(RANK + 1))
        dist.all_reduce(x)
        assert dist.get_backend() == "ringmpi"
        assert torch.equal(x, torch.full((5,), float(SIZE * (SIZE + 1) // 2)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        WORLD.Barrier()
        if RANK == 0 and os.path.exists(path):
            os.remove(path)
