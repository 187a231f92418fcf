"""The environment under MPI: RINGMPI_ALGORITHM chooses the algorithm, RINGMPI_WAIT how
a waiting rank waits."""

from __future__ import annotations

import os

import numpy as np
import pytest
from api_helpers import SIZE, WORLD, expected, inputs, mismatch, raised
from conftest import agree
from mpi4py import MPI

import ringmpi
import ringmpi._comm
from ringmpi import _host
from ringmpi.algorithms import shared

pytestmark = pytest.mark.mpi


# --- RINGMPI_ALGORITHM ----------------------------------------------------------------


def test_algorithm_from_the_environment(environ):
    environ.set("RINGMPI_ALGORITHM", "mpi")
    with ringmpi.trace() as auto:
        out = ringmpi.allreduce(inputs(1009))
    with ringmpi.trace() as ring:
        ringmpi.allreduce(inputs(1009), algorithm="ring")  # an explicit name wins
    problems = mismatch("result", out, expected(1009))
    if auto.events or auto.calls != 1:
        problems.append(f"auto with RINGMPI_ALGORITHM=mpi traced {len(auto.events)} sends")
    if bool(ring.events) != (SIZE > 1):
        problems.append(f"algorithm='ring' traced {len(ring.events)} sends")
    if (auto.ran, ring.ran) != (["mpi"], ["ring"]):
        problems.append(f"the traces say auto ran {auto.ran} and the ring {ring.ran}")
    agree(WORLD, problems)


def test_unknown_algorithm_in_the_environment(environ):
    environ.set("RINGMPI_ALGORITHM", "tree")
    with pytest.raises(ValueError, match="tree"):
        ringmpi.allreduce(np.ones(4))


# --- RINGMPI_WAIT: how a waiting rank waits --------------------------------------------


@pytest.fixture(scope="module")
def waiting():
    """Two duplicates of WORLD whose ringmpi contexts wait by spinning and by sleeping."""
    comms = {}
    for policy in ("spin", "sleep"):
        with ringmpi.configured(wait=policy):
            comms[policy] = WORLD.Dup()
            ringmpi._comm.context(comms[policy])  # made now, under this policy
    yield comms
    for comm in comms.values():
        comm.Free()


def _crowded() -> bool:
    """Many more ranks on this node than it has cores: where "auto" polls and yields."""
    node = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    crowded = node.Get_size() >= ringmpi._comm._CROWDED * (os.cpu_count() or 1)
    node.Free()
    return crowded


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "rabenseifner"])
@pytest.mark.parametrize("count", [7, 4099, 300_001])
@pytest.mark.parametrize("policy", ["spin", "sleep"])
def test_both_ways_of_waiting_give_the_result(waiting, policy, count, algorithm):
    comm = waiting[policy]
    got = ringmpi.allreduce(inputs(count), comm=comm, algorithm=algorithm)
    problems = mismatch("result", got, expected(count))
    if ringmpi._comm.context(comm).sleepy != (policy == "sleep"):
        problems.append(f"RINGMPI_WAIT={policy} was not followed")
    agree(WORLD, problems)


def test_wait_auto_sleeps_only_on_a_crowded_node(environ):
    environ.set("RINGMPI_WAIT", "auto")
    comm = WORLD.Dup()
    ringmpi.allreduce(np.ones(3), comm=comm)
    sleepy = ringmpi._comm.context(comm).sleepy
    comm.Free()
    agree(WORLD, [] if sleepy == _crowded() else [f"sleepy is {sleepy} on this node"])


@pytest.mark.parametrize("said", ["auto", "yes", "no"])
def test_oversubscribed_sets_the_shared_windows_pieces(environ, said):
    """RINGMPI_OVERSUBSCRIBED: yes gives shared_memory's window pieces of
    CROWDED_SET_BYTES, no of SET_BYTES, auto as the node's affinity masks say (more
    ranks than the cores they hold: crowded); the result exact either way, here over
    two crowded pieces."""
    environ.set("RINGMPI_OVERSUBSCRIBED", said)
    comm = WORLD.Dup()
    count = 600_000
    got = ringmpi.allreduce(inputs(count), comm=comm, algorithm="shared_memory")
    problems = mismatch("result", got, expected(count))
    node = ringmpi._comm.context(comm).node
    crowded = node.Get_size() > len(frozenset().union(*node.allgather(_host.affinity())))
    want = (
        shared.CROWDED_SET_BYTES
        if said == "yes" or (said == "auto" and crowded)
        else shared.SET_BYTES
    )
    took = ringmpi._comm.context(comm).state(shared.SHARED_MEMORY).set_bytes
    problems += [] if took == want else [f"pieces of {took} bytes, not {want}"]
    comm.Free()
    agree(WORLD, problems)


def test_wait_unknown_policy(environ):
    environ.set("RINGMPI_WAIT", "fast")
    comm = WORLD.Dup()
    message = raised(ValueError, ringmpi.allreduce, np.ones(3), comm=comm)
    comm.Free()
    problems = [] if message and "RINGMPI_WAIT" in message else [f"raised {message!r}"]
    agree(WORLD, problems)
