"""The lease: an untuned size class's first calls run the library's own MPI_Allreduce.

Auto's tuner tries its candidates only after a class's first ``lease`` calls
(the setting; auto: as many as the trials cost, at least 50), which run the
library's call on the user's communicator, counted from Python and from the C
repeat path alike. Closed-form inputs: rank r contributes r + 1 + i at element i,
so every element's sum is known exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import _comm, _repeat, _settings
from ringmpi.algorithms import tuner

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
LEASE = 5


@pytest.fixture
def comm():
    c = WORLD.Dup()  # a new communicator: auto starts untuned on it, with no lease
    yield c
    c.Free()


def _inputs(comm, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(this rank's int32 contribution, the exact sum)."""
    i = np.arange(count, dtype=np.int64)
    mine = (comm.rank + 1 + i).astype(np.int32)
    n = comm.size
    return mine, (n * (n + 1) // 2 + n * i).astype(np.int32)


@pytest.mark.parametrize("count", [2, 1 << 14, 1 << 18])
def test_a_class_runs_the_library_for_its_lease_then_the_trials(settings, comm, count):
    settings(tuner="memory", lease=LEASE)
    mine, exact = _inputs(comm, count)
    out = np.empty_like(mine)
    problems = []
    with ringmpi.trace() as t:
        for i in range(LEASE + 1):
            ringmpi.Allreduce(mine, out, MPI.SUM, comm)
            if not np.array_equal(out, exact):
                problems.append(f"call {i} ({t.ran[-1]}) is not the exact sum")
    agree(comm, problems)
    if comm.size == 1:  # nothing to tune: the model's pick from the first call
        assert t.trials == [] and "mpi" not in t.ran
        return
    assert t.ran[:LEASE] == ["mpi"] * LEASE
    assert len(t.trials) == 1 and t.trials[0].size_class == mine.nbytes.bit_length()
    assert _comm.made(comm) is not None  # made by the trials, not by the lease


def test_calls_from_c_count_the_lease_down(settings, comm):
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune, no lease")
    settings(tuner="memory", lease=LEASE)
    mine, exact = _inputs(comm, 1000)
    out = np.empty_like(mine)
    problems = []
    for i in range(LEASE):  # remembered at once: every call after the first from C
        out[...] = 0
        ringmpi.Allreduce(mine, out, MPI.SUM, comm)
        if not np.array_equal(out, exact):
            problems.append(f"call {i} is not the exact sum")
    agree(comm, problems)
    assert id(out) in _repeat.latest  # the C repeat path's entry, remembered at once
    assert _comm.made(comm) is None  # no context of ringmpi's: none needed yet
    left = tuner.leases(comm, _settings.current()).left[mine.nbytes.bit_length()]
    assert left[0] == 0
    with ringmpi.trace() as t:  # the lease is over: the tuner's first trial
        ringmpi.Allreduce(mine, out, MPI.SUM, comm)
    assert np.array_equal(out, exact)
    assert len(t.trials) == 1


@pytest.mark.parametrize("why", ["tuner off", "reproducible", "validate", "named", "timeout"])
def test_no_lease_where_auto_would_not_tune_or_the_call_needs_python(settings, comm, why):
    settings(tuner="off" if why == "tuner off" else "memory", lease=LEASE)
    mine, exact = _inputs(comm, 100)
    x = mine.astype(np.float64)
    kwargs = {
        "reproducible": {"reproducible": True},
        "validate": {"validate": True},
        "named": {"algorithm": "ring"},
        "timeout": {"timeout": 30},
    }.get(why, {})
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, **kwargs)
    assert np.array_equal(x, exact.astype(np.float64))
    assert t.ran[0] != "mpi"  # auto's own choice, or its first trial: not the lease


def test_a_freed_communicator_forgets_its_leased_calls(settings):
    settings(tuner="memory", lease=LEASE)
    mine, exact = _inputs(WORLD, 10)
    out = np.empty_like(mine)
    for _ in range(3):
        c = WORLD.Dup()
        ringmpi.Allreduce(mine, out, MPI.SUM, c)
        ringmpi.Allreduce(mine, out, MPI.SUM, c)
        assert np.array_equal(out, exact)
        c.Free()  # its remembered calls name its handle: forgotten with it
        assert id(out) not in _repeat.latest


@pytest.mark.parametrize("progress", ["thread", "wait"])
def test_nonblocking_and_persistent_calls_count_off_the_same_lease(settings, comm, progress):
    """A nonblocking or persistent call of a leased class is the library's own request,
    started on the user's communicator where the program starts it (so MPI orders
    it among the program's own collectives), and counts off the lease the blocking
    calls count off; once none is left, ringmpi's own call."""
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune, no lease")
    settings(tuner="memory", lease=8, progress=progress)
    mine, exact = _inputs(comm, 1 << 18)  # 1 MiB: ringmpi's own nonblocking call, not MPI's
    out = np.empty_like(mine)
    for _ in range(2):  # leased, and remembered: the C repeat path holds the leased call
        ringmpi.Allreduce(mine, out, MPI.SUM, comm)
    left = tuner.leases(comm, _settings.current()).left[mine.nbytes.bit_length()]
    assert left[0] == 6
    problems = []
    persistent = ringmpi.Allreduce_init(mine, out, MPI.SUM, comm)
    with ringmpi.trace() as seen:
        for i in range(3):
            out[...] = 0
            req = ringmpi.Iallreduce(mine, out, MPI.SUM, comm)
            comm.Barrier()  # the program's own collective, while the call is under way
            req.Wait()
            if not np.array_equal(out, exact):
                problems.append(f"nonblocking call {i} is not the exact sum")
            out[...] = 0
            persistent.Start()
            comm.Barrier()
            persistent.Wait()
            if not np.array_equal(out, exact):
                problems.append(f"persistent start {i} is not the exact sum")
    if seen.ran != ["mpi"] * 6:
        problems.append(f"the leased calls ran {seen.ran}")
    if left[0] != 0:
        problems.append(f"{left[0]} calls left of the lease, not 0")
    for i in range(2):  # the lease is over: ringmpi's own calls (auto's trials first)
        out[...] = 0
        ringmpi.Iallreduce(mine, out, MPI.SUM, comm).Wait()
        persistent.Start()
        persistent.Wait()
        if not np.array_equal(out, exact):
            problems.append(f"call {i} after the lease is not the exact sum")
    persistent.Free()
    small = ringmpi.Allreduce_init(MPI.IN_PLACE, np.ones(4), MPI.SUM, comm)  # below the
    if small._library is None:  # size where ringmpi's requests pay: the library's, unleased
        problems.append("a small persistent request is not the library's own")
    small.Free()
    agree(comm, problems)
