"""Calls that repeat under MPI: the remembered path must see every change."""

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
import ringmpi._api
from ringmpi import algorithms, verify

pytestmark = pytest.mark.mpi

REPEATED = ["ring", "recursive_doubling", "rabenseifner", "hierarchical", "shared_memory", "mpi",
            "auto"]  # fmt: skip


@pytest.mark.parametrize("shape", [(1009,), (7, 13)], ids=["1-D", "2-D"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("algorithm", REPEATED)
def test_repeated_calls_on_the_same_arrays(algorithm, in_place, shape):
    count = shape
    send = np.empty(count)
    recv = np.empty(count)
    problems = []
    for k in range(4):  # the third and fourth take the remembered path
        x = inputs(count) * (k + 1)
        if in_place:
            recv[...] = x
            ringmpi.Allreduce(MPI.IN_PLACE, recv, algorithm=algorithm)
        else:
            send[...] = x
            ringmpi.Allreduce(send, recv, algorithm=algorithm)
        problems += mismatch(f"call {k}", recv, expected(count) * (k + 1))
    if not any(e.recv() is recv for e in ringmpi._repeat.entries.values()):
        problems.append("the calls were not remembered: the repeat path was not taken")
    agree(WORLD, problems)


@needs_two_ranks  # one rank has no step to segment, and reads no segment setting
def test_a_repeat_sees_a_new_setting(environ):
    buf = inputs(64)
    for _ in range(3):
        ringmpi.Allreduce(MPI.IN_PLACE, buf.copy(), algorithm="ring")
    out = buf.copy()
    for _ in range(3):
        ringmpi.Allreduce(MPI.IN_PLACE, out, algorithm="ring")
    environ.set("RINGMPI_SEGMENT_BYTES", "lots")
    message = raised(ValueError, ringmpi.Allreduce, MPI.IN_PLACE, out, algorithm="ring")
    agree(WORLD, says(message, "RINGMPI_SEGMENT_BYTES must be a whole number"))


# "mpi" repeats from compiled code, which checks the arrays itself; the others in Python.
@pytest.mark.parametrize("algorithm", ["recursive_doubling", "mpi"])
def test_a_repeat_sees_the_array_change_in_place(algorithm):
    count = 64
    a = np.empty(count, np.float32)
    problems = []
    for _ in range(3):
        a[...] = verify.verify_inputs(MPI.SUM, "float32", RANK, count)
        ringmpi.Allreduce(MPI.IN_PLACE, a, algorithm=algorithm)
    a.dtype = np.int32  # the same memory, now 64 int32
    a[...] = verify.verify_inputs(MPI.SUM, "int32", RANK, count)
    ringmpi.Allreduce(MPI.IN_PLACE, a, algorithm=algorithm)
    problems += mismatch("as int32", a, verify.verify_expected(MPI.SUM, "int32", SIZE, count))
    a.flags.writeable = False
    message = raised(ValueError, ringmpi.Allreduce, MPI.IN_PLACE, a, algorithm=algorithm)
    problems += says(message, "read-only")
    a.flags.writeable = True
    a.shape = (8, 8)
    a[...] = verify.verify_inputs(MPI.SUM, "int32", RANK, count).reshape(8, 8)
    ringmpi.Allreduce(MPI.IN_PLACE, a, algorithm=algorithm)
    want = verify.verify_expected(MPI.SUM, "int32", SIZE, count).reshape(8, 8)
    problems += mismatch("as 8x8", a, want)
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", ["recursive_doubling", "mpi"])
def test_a_repeat_out_of_place_sees_the_arrays_change(algorithm):
    count = 64
    send, recv = np.empty(count, np.float64), np.empty(count, np.float64)
    x = verify.verify_inputs(MPI.SUM, "float64", RANK, count)
    want = verify.verify_expected(MPI.SUM, "float64", SIZE, count)
    problems = []
    for k in range(3):
        send[...] = x
        ringmpi.Allreduce(send, recv, algorithm=algorithm)
        problems += mismatch(f"call {k}", recv, want)
    send.flags.writeable = False  # a read-only contribution is still read
    recv[...] = SENTINEL
    ringmpi.Allreduce(send, recv, algorithm=algorithm)
    problems += mismatch("read-only sendbuf", recv, want)
    send.flags.writeable = True
    send.dtype = np.int64  # sendbuf's dtype no longer recvbuf's: refused, nothing sent
    message = raised(TypeError, ringmpi.Allreduce, send, recv, algorithm=algorithm)
    problems += says(message, "dtype")
    agree(WORLD, problems)


def counted(work, red, ctx, source=None, timeout=0.0):
    """The ring, counting its calls on this rank."""
    COUNTED.append(work.size)
    algorithms.get("ring").run(work, red, ctx, source, timeout)


COUNTED: list[int] = []


def test_a_repeat_sees_configure(settings):
    algorithms.register("counted", counted)
    try:
        COUNTED.clear()
        buf = inputs(64)
        settings(algorithm="mpi")
        for _ in range(3):  # remembered, running the library's call
            ringmpi.Allreduce(MPI.IN_PLACE, buf)
        settings(algorithm="counted")
        problems = []
        for k in range(2):
            buf[...] = inputs(64)
            ringmpi.Allreduce(MPI.IN_PLACE, buf)
            problems += mismatch(f"call {k}", buf, expected(64))
        problems += [] if COUNTED == [64, 64] else [f"'counted' ran {COUNTED}, not twice"]
    finally:
        algorithms.unregister("counted")
    agree(WORLD, problems)


def test_a_repeat_inside_a_trace_is_counted():
    buf = inputs(1009)
    for _ in range(3):
        ringmpi.Allreduce(MPI.IN_PLACE, buf, algorithm="ring")
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, buf, algorithm="ring")
    want = (1, 2 * (SIZE - 1))
    problems = [] if (t.calls, t.steps) == want else [f"(calls, steps) {(t.calls, t.steps)}"]
    agree(WORLD, problems)


def test_a_repeat_on_a_freed_communicator_is_refused():
    comm = WORLD.Dup()
    buf = inputs(16)
    for _ in range(3):
        ringmpi.Allreduce(MPI.IN_PLACE, buf.copy(), comm=comm)
        ringmpi.Allreduce(MPI.IN_PLACE, buf, comm=comm)
    comm.Free()
    message = raised(TypeError, ringmpi.Allreduce, MPI.IN_PLACE, buf, comm=comm)
    agree(WORLD, says(message, "COMM_NULL"))


@needs_two_ranks
@pytest.mark.parametrize("algorithm", algorithms.names())
def test_a_call_remembered_on_some_ranks_only_stays_in_step(algorithm):
    """Whether a call is remembered is each rank's own affair (its arrays' ids): rank 0
    calls on the same array again and again, the others on a new one each time, so
    only rank 0 prepares the repeat. Preparing it must send nothing: a message there
    would wait for ranks that never send it, and the calls after it would not meet.
    On a communicator nothing was made for yet, exact, with a timeout that names a
    rank left waiting."""
    comm = WORLD.Dup()
    same = inputs(1009)
    kept = []  # the other ranks' arrays, alive: no id comes back
    problems = []
    for k in range(5):
        buf = same if RANK == 0 else inputs(1009)
        kept.append(buf)
        buf[...] = inputs(1009) * (k + 1)
        try:
            ringmpi.Allreduce(MPI.IN_PLACE, buf, comm=comm, algorithm=algorithm, timeout=20)
        except ringmpi.RingMPIError as exc:
            problems.append(f"call {k}: {exc}")
            break
        problems += mismatch(f"call {k}", buf, expected(1009) * (k + 1))
    remembered = any(e.recv() is same for e in ringmpi._repeat.entries.values())
    if remembered != (RANK == 0):
        problems.append(f"remembered on this rank: {remembered}")
    comm.Free()
    agree(WORLD, problems)
