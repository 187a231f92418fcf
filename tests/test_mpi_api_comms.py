"""The library API under MPI on communicators: COMM_SELF, splits, duplicates, user
traffic beside ringmpi's, and the ringmpi.Comm wrapper."""

from __future__ import annotations

import numpy as np
import pytest
from api_helpers import ALGORITHMS, RANK, SIZE, WORLD, communicators, expected, inputs, mismatch
from conftest import agree
from mpi4py import MPI

import ringmpi
import ringmpi._comm

pytestmark = pytest.mark.mpi

comms = pytest.fixture(scope="module")(communicators)


# --- communicators ------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", ["self", "world", "half", "dup"])
def test_communicators(comms, name, algorithm):
    comm = comms[name]
    x = inputs(1009, comm=comm)
    out = ringmpi.allreduce(x, comm=comm, algorithm=algorithm)
    problems = mismatch(f"{name} (N={comm.Get_size()})", out, expected(1009, comm=comm))
    if name == "self":
        problems += mismatch("COMM_SELF: the input itself", out, x)
    agree(WORLD, problems)


@pytest.mark.parametrize("make", ["Dup", "Split"])
def test_private_duplicate_is_freed_with_the_communicator(make):
    ringmpi.allreduce(np.ones(1))  # WORLD has its context before the copy is made
    comm = WORLD.Dup() if make == "Dup" else WORLD.Split(RANK % 2, RANK)
    out = ringmpi.allreduce(inputs(50, comm=comm), comm=comm)
    ctx = ringmpi._comm.context(comm)  # cached by the call above: no communication
    problems = mismatch("result", out, expected(50, comm=comm))
    if ctx is ringmpi._comm.context(WORLD):
        problems.append("the new communicator shares COMM_WORLD's private duplicate")
    if ctx.comm == MPI.COMM_NULL:
        problems.append("the private duplicate is null while the communicator lives")
    comm.Free()
    if ctx.comm != MPI.COMM_NULL:
        problems.append("the private duplicate outlived the communicator")
    problems += mismatch("WORLD afterwards", ringmpi.allreduce(inputs(50)), expected(50))
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
@pytest.mark.parametrize("name", ["world", "dup"])
def test_ringmpi_traffic_never_matches_user_receives(comms, name, algorithm):
    """A receive the user posted (ANY_SOURCE, ANY_TAG) sees only the user's message."""
    comm = comms[name]
    rank, n = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    mailbox = np.zeros(2, np.int64)
    req = comm.Irecv(mailbox, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    out = ringmpi.allreduce(inputs(1009, comm=comm), comm=comm, algorithm=algorithm)
    problems = mismatch("result", out, expected(1009, comm=comm))
    if req.Test():
        problems.append("the user's receive matched ringmpi's traffic")
    comm.Barrier()  # nobody sends the user's message before every rank has tested
    sent = comm.Isend(np.array([rank, 4242], np.int64), dest=right, tag=7)
    status = MPI.Status()
    req.Wait(status)
    sent.Wait()
    problems += mismatch("user message", mailbox, np.array([left, 4242], np.int64))
    if (status.Get_source(), status.Get_tag()) != (left, 7):
        problems.append(f"user message from {status.Get_source()} tag {status.Get_tag()}")
    agree(WORLD, problems)


# --- ringmpi.Comm ----------------------------------------------------------------------


def test_comm_wrapper_is_the_same_communicator():
    comm = ringmpi.Comm(WORLD)
    problems = []
    if not isinstance(comm, MPI.Intracomm):
        problems.append(f"ringmpi.Comm is a {type(comm).__mro__}")
    if comm.Compare(WORLD) != MPI.IDENT:
        problems.append("ringmpi.Comm(WORLD) is not COMM_WORLD itself")
    if (comm.Get_rank(), comm.Get_size()) != (RANK, SIZE):
        problems.append(f"rank/size {comm.Get_rank()}/{comm.Get_size()}")
    comm.Barrier()
    if comm.bcast("from 0" if RANK == 0 else None, root=0) != "from 0":
        problems.append("bcast")
    if ringmpi.Comm().Compare(WORLD) != MPI.IDENT:
        problems.append("ringmpi.Comm() is not COMM_WORLD")
    agree(WORLD, problems)


def test_comm_wrapper_routes_arrays_through_ringmpi():
    comm = ringmpi.Comm(WORLD)
    send, recv = inputs(1009), np.empty(1009)
    with ringmpi.trace() as upper:
        comm.Allreduce(send, recv, MPI.SUM)
    with ringmpi.trace() as lower:
        out = comm.allreduce(inputs((3, 5)))
    with ringmpi.trace() as obj:
        total = comm.allreduce(5)
        biggest = comm.allreduce(RANK, op=MPI.MAX)
    problems = mismatch("Allreduce", recv, expected(1009))
    problems += mismatch("allreduce(ndarray)", out, expected((3, 5)))
    for what, t in (("Allreduce", upper), ("allreduce(ndarray)", lower)):
        # auto may choose shared_memory: no message, but its loads from the window
        moved = bool(t.events) or t.shared_read > 0
        if t.calls != 1 or moved != (SIZE > 1):
            problems.append(
                f"{what}: {t.calls} ringmpi calls, {len(t.events)} sends and "
                f"{t.shared_read} shared-memory bytes read traced"
            )
    if (total, biggest) != (5 * SIZE, SIZE - 1):
        problems.append(f"allreduce(5) = {total!r}, allreduce(rank, MAX) = {biggest!r}")
    if obj.calls != 0:
        problems.append("allreduce of a Python object went through ringmpi")
    agree(WORLD, problems)


def test_comm_wrapper_on_a_new_communicator():
    """The first ringmpi call on a wrapped, fresh communicator duplicates the wrapper."""
    split = WORLD.Split(RANK % 2, RANK)
    half = ringmpi.Comm(split)
    out = half.allreduce(inputs(33, comm=half))
    recv = np.empty(33)
    half.Allreduce(inputs(33, comm=half), recv)
    problems = mismatch("allreduce", out, expected(33, comm=half))
    problems += mismatch("Allreduce", recv, expected(33, comm=half))
    if half.allreduce(1) != split.Get_size():
        problems.append("allreduce(1) on the wrapped split")
    split.Free()
    agree(WORLD, problems)
