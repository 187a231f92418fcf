"""Ranks that disagree on a call: validation names the field, and without it no rank
returns a result."""

from __future__ import annotations

import numpy as np
import pytest
from api_helpers import (
    RANK,
    SENTINEL,
    SIZE,
    WORLD,
    expected,
    inputs,
    mismatch,
    needs_two_ranks,
    raised,
    says,
)
from conftest import agree
from mpi4py import MPI

import ringmpi
import ringmpi._comm
import ringmpi.algorithms
from ringmpi import kernels

pytestmark = pytest.mark.mpi

# What each rank passes when the ranks disagree on one field (rank 0 differs from rank 1).
DISAGREE = {
    "count": {"count": 10 + RANK},
    "dtype": {"dtype": "float32" if RANK % 2 else "float64"},
    "op": {"op": MPI.MAX if RANK % 2 else MPI.SUM},
    "algorithm": {"algorithm": "mpi" if RANK % 2 else "ring"},
}


def _call(count=10, dtype="float64", op=MPI.SUM, algorithm="ring", validate=None) -> None:
    send, recv = np.ones(count, dtype), np.empty(count, dtype)
    ringmpi.Allreduce(send, recv, op, WORLD, algorithm=algorithm, validate=validate)


def same_everywhere(what: str, value: object) -> list[str]:
    everyone = WORLD.allgather(value)
    return [] if all(v == everyone[0] for v in everyone) else [f"{what} differ: {everyone}"]


@needs_two_ranks
@pytest.mark.parametrize("field_name", DISAGREE.keys())
def test_validate_names_the_field_ranks_disagree_on(field_name):
    message = raised(ringmpi.RingMPIError, _call, **DISAGREE[field_name], validate=True)
    agree(WORLD, says(message, f"disagree on {field_name}") + same_everywhere("messages", message))


@needs_two_ranks
def test_validate_from_the_environment(environ):
    environ.set("RINGMPI_VALIDATE", "1")
    message = raised(ringmpi.RingMPIError, _call, **DISAGREE["count"])
    agree(WORLD, says(message, "disagree on count") + same_everywhere("messages", message))


def test_validate_passes_when_ranks_agree():
    out = np.empty(1009)
    ringmpi.Allreduce(inputs(1009), out, validate=True)
    agree(WORLD, mismatch("result", out, expected(1009)))


# Without validation the ring notices at its first step, on every rank, when every
# rank's left neighbour disagrees with it. count = 10 + N*rank makes each rank's
# first received chunk a different size from what it expects. (count = 10 + rank
# would not: at N = 2, rank 0 expects chunk 1 of 10 elements, 5, and rank 1 sends
# chunk 1 of 11, also 5; rank 0 then waits forever for rank 1, which has raised.)
INT32_OPS = [spec.op for spec in kernels._OPS if np.dtype("int32") in spec.dtypes]
UNVALIDATED = {
    "count": (10 + SIZE * RANK, MPI.SUM, "disagree on count"),
    "op": (10, INT32_OPS[RANK % len(INT32_OPS)], "disagree on op"),
}


@needs_two_ranks
@pytest.mark.parametrize("policy", ["spin", "sleep"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("what", UNVALIDATED.keys())
@pytest.mark.parametrize(
    "algorithm", ["ring", "recursive_doubling", "rabenseifner", "shared_memory"]
)
def test_detects_disagreement_without_validation(environ, what, in_place, policy, algorithm):
    # The latency algorithms' fold makes a folded rank send and then wait for a
    # partner that may have raised: only where no rank folds (N a power of two)
    # does every rank notice at its first step (a timeout is what ends the rest:
    # test_disagreement_never_returns_a_result). shared_memory: every rank reads
    # every slot's header, so all notice.
    if algorithm in ("recursive_doubling", "rabenseifner") and SIZE & (SIZE - 1):
        pytest.skip("the latency algorithms fold ranks at this N")
    environ.set("RINGMPI_WAIT", policy)
    comm = WORLD.Dup()  # a failed call breaks its communicator off: a fresh one per test
    ringmpi._comm.context(comm)  # made now, under this policy
    count, op, words = UNVALIDATED[what]
    memory = np.full(count + 64, SENTINEL, np.int32)
    recv = memory[:count]
    recv[...] = 1
    send = MPI.IN_PLACE if in_place else np.ones(count, np.int32)
    message = raised(
        ringmpi.RingMPIError,
        ringmpi.Allreduce,
        send,
        recv,
        op,
        comm,
        algorithm=algorithm,
        validate=False,
    )
    problems = says(message, words)  # each rank names its own step: messages differ
    problems += mismatch("memory past recvbuf", memory[count:], np.full(64, SENTINEL, np.int32))
    # The step engine breaks the communicator off (messages may be in flight): every
    # later call on it raises, on every rank. shared_memory's ranks all stop at the
    # same flag, with nothing in flight: its next call just works.
    after = raised(ringmpi.RingMPIError, ringmpi.allreduce, inputs(1009), comm=comm,
                   algorithm=algorithm)  # fmt: skip
    if algorithm == "shared_memory":
        problems += [] if after is None else [f"the next call raised: {after}"]
    else:
        problems += says(after, "no longer uses this communicator")
    comm.Free()
    again = WORLD.Dup()
    problems += mismatch("a call on a new communicator", ringmpi.allreduce(
        inputs(1009), comm=again, algorithm=algorithm), expected(1009))  # fmt: skip
    again.Free()
    agree(WORLD, problems)


# The algorithms where some ranks cannot notice the disagreement themselves: the
# latency algorithms' folded ranks (N not a power of two), the chain (only the rank
# after the odd one sees its message), the hierarchical algorithm (its node
# announcement and, across emulated nodes, its rails). With a timeout every rank
# raises, either the disagreement or the timeout of waiting for a rank that raised.
TIMED_CASES = {
    "recursive_doubling": {},
    "rabenseifner": {},
    "chain": {},
    "hierarchical": {},
    "hierarchical-2-per-node": {"RINGMPI_RANKS_PER_NODE": "2"},
}


@needs_two_ranks
@pytest.mark.parametrize("what", UNVALIDATED.keys())
@pytest.mark.parametrize("case", TIMED_CASES.keys())
def test_disagreement_never_returns_a_result(environ, what, case):
    for key, value in TIMED_CASES[case].items():
        environ.set(key, value)
    algorithm = case.split("-")[0]
    comm = WORLD.Dup()  # a timeout breaks the communicator off: a fresh one per test
    ringmpi.allreduce(inputs(1009), comm=comm, algorithm=algorithm)  # set up, windows made
    count, op, words = UNVALIDATED[what]
    memory = np.full(count + 64, SENTINEL, np.int32)
    recv = memory[:count]
    recv[...] = 1
    message = raised(ringmpi.RingMPIError, ringmpi.Allreduce, np.ones(count, np.int32), recv,
                     op, comm, algorithm=algorithm, validate=False, timeout=1.0)  # fmt: skip
    problems = [] if message is not None else ["returned instead of raising"]
    problems += mismatch("memory past recvbuf", memory[count:], np.full(64, SENTINEL, np.int32))
    everyone = WORLD.allgather(message)
    if not any(words in m for m in everyone if m):
        problems.append(f"no rank says {words!r}: {everyone}")
    for m in everyone:
        if m and words not in m and "(timeout)" not in m:
            problems.append(f"neither the disagreement nor a timeout: {m!r}")
    comm.Free()
    # The job goes on, on another communicator.
    again = WORLD.Dup()
    problems += mismatch("the next call", ringmpi.allreduce(inputs(1009), comm=again,
                         algorithm=algorithm), expected(1009))  # fmt: skip
    again.Free()
    agree(WORLD, problems)


@needs_two_ranks
@pytest.mark.parametrize("field_name", ["count", "dtype", "op"])
@pytest.mark.parametrize("algorithm", sorted(set(ringmpi.algorithms.names()) - {"auto"}))
def test_validate_catches_every_algorithm(field_name, algorithm):
    fields = {**DISAGREE[field_name], "algorithm": algorithm}
    message = raised(ringmpi.RingMPIError, _call, **fields, validate=True)
    agree(WORLD, says(message, f"disagree on {field_name}") + same_everywhere("messages", message))
