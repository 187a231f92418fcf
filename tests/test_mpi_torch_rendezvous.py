"""The ``ringmpi`` backend through each of torch's own rendezvous, under mpirun
(make test-torch): env://, tcp:// and file://, torch's ranks given as MPI's; and
env:// (``init_process_group("ringmpi")`` as the README has it) taking from MPI
what the environment leaves out."""

from __future__ import annotations

import os
import re
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


# what torch's env:// reads, and what torchrun sets besides
_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
              "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE")  # fmt: skip


def _environment(monkeypatch, given: dict[str, str]) -> None:
    """Of torch's variables, only ``given`` set."""
    for name in _VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)


def _closed_form_all_reduce(group=None) -> None:
    for _ in range(2):
        x = torch.full((5,), float(RANK + 1))
        dist.all_reduce(x, group=group)
        assert torch.equal(x, torch.full((5,), float(SIZE * (SIZE + 1) // 2)))


@pytest.mark.parametrize("given", [(), ("RANK", "WORLD_SIZE"), ("MASTER_ADDR", "MASTER_PORT"),
                                   ("MASTER_PORT",)], ids="+".join)  # fmt: skip
def test_mpi_gives_what_the_environment_does_not(given, monkeypatch):
    port = WORLD.bcast(_free_port() if RANK == 0 else None)
    values = {"RANK": str(RANK), "WORLD_SIZE": str(SIZE), "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(port)}  # fmt: skip
    _environment(monkeypatch, {name: values[name] for name in given})
    before = dict(os.environ)
    try:
        dist.init_process_group("ringmpi")
        assert dict(os.environ) == before  # nothing written into the environment
        assert (dist.get_rank(), dist.get_world_size()) == (RANK, SIZE)
        assert dist.get_backend() == "ringmpi"
        _closed_form_all_reduce()
        # the store is one torch can use: a Gloo group, which makes its own rendezvous
        # in it, agrees
        _closed_form_all_reduce(dist.new_group(backend="gloo"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        WORLD.Barrier()


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE"])
def test_an_environment_that_is_not_mpis_is_named_on_every_rank(name, monkeypatch):
    if name == "RANK" and SIZE == 1:
        pytest.skip("one rank: its ranks agree")
    value, said = {
        "RANK": ((RANK + 1) % SIZE, "needs torch's ranks to be MPI's: MPI rank 0 is torch rank 1"),
        "WORLD_SIZE": (SIZE + 1, f"torch's world size {SIZE + 1} is more than MPI's ({SIZE} "
                                 "ranks in MPI.COMM_WORLD)"),
    }[name]  # fmt: skip
    _environment(monkeypatch, {name: str(value)})
    try:
        with pytest.raises(RuntimeError, match=re.escape(said)):
            dist.init_process_group("ringmpi")
        assert not dist.is_initialized()
        monkeypatch.delenv(name)
        dist.init_process_group("ringmpi")  # and, the variable gone, the group starts
        _closed_form_all_reduce()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        WORLD.Barrier()
