"""The lease: an untuned size class's first calls run the cost model's best.

Auto's tuner tries its candidates only after a class's first ``lease`` calls
(the setting; auto: as many as the trials cost), which run the incumbent (the
model's best candidate, the first the trials then run), counted off the class's
cell of calls left from Python and from the C repeat path alike. Closed-form
inputs: rank r contributes r + 1 + i at element i, so every element's sum is
known exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import _builtins, _comm, _direct, _progress, _repeat
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


def _tuner(comm):
    ctx = _comm.made(comm)
    return None if ctx is None else ctx.tuner


@pytest.mark.parametrize("count", [2, 1 << 14, 1 << 18])
def test_a_class_runs_the_models_best_for_its_lease_then_the_trials(settings, comm, count):
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
        assert t.trials == [] and _tuner(comm) is None
        return
    klass = mine.nbytes.bit_length()
    trials = _tuner(comm).trying[klass]
    # the lease ran the incumbent, the trials' first candidate, and never the library
    assert t.ran[:LEASE] == [trials.names[0]] * LEASE and trials.names[0] != "mpi"
    assert len(t.trials) == 1 and t.trials[0].size_class == klass
    assert _tuner(comm).left[klass][0] == 0


def test_calls_from_c_count_the_lease_down(settings, comm):
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune, no lease")
    settings(tuner="memory", lease=LEASE)
    mine, exact = _inputs(comm, 1000)
    out = np.empty_like(mine)
    problems = []
    for i in range(LEASE):  # remembered at once: every call after the first repeats
        out[...] = 0
        ringmpi.Allreduce(mine, out, MPI.SUM, comm)
        if not np.array_equal(out, exact):
            problems.append(f"call {i} is not the exact sum")
    agree(comm, problems)
    assert id(out) in _repeat.latest  # remembered at once, counted
    entry = _repeat.latest[id(out)]
    if entry.call.cells is not None and _builtins.layout_ok():  # the C repeat path holds it
        at = _direct._HEADER + _direct._WIDTH * _direct.slot(out, comm)
        assert _direct._state["holder"][at + _direct.RECV] == id(out)
    klass = mine.nbytes.bit_length()
    assert _tuner(comm).left[klass][0] == 0
    assert klass not in _tuner(comm).trying  # no trial yet
    with ringmpi.trace() as t:  # the lease is over: the tuner's first trial
        ringmpi.Allreduce(mine, out, MPI.SUM, comm)
    assert np.array_equal(out, exact)
    assert len(t.trials) == 1


@pytest.mark.parametrize("why", ["tuner off", "reproducible", "named"])
def test_no_lease_where_auto_would_not_tune(settings, comm, why):
    settings(tuner="off" if why == "tuner off" else "memory", lease=LEASE)
    mine, exact = _inputs(comm, 100)
    x = mine.astype(np.float64)
    kwargs = {"reproducible": {"reproducible": True}, "named": {"algorithm": "ring"}}.get(why, {})
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, **kwargs)
    assert np.array_equal(x, exact.astype(np.float64))
    assert t.trials == []
    tuner = _tuner(comm)
    assert tuner is None or not tuner.left  # no class's lease begun


@pytest.mark.parametrize("kwargs", [{"validate": True}, {"timeout": 30}])
def test_validated_and_timed_calls_count_off_the_lease(settings, comm, kwargs):
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune, no lease")
    settings(tuner="memory", lease=LEASE)
    mine, exact = _inputs(comm, 100)
    problems = []
    with ringmpi.trace() as t:
        for i in range(2):
            x = mine.astype(np.int64)  # integers: every candidate's bits alike, so tuned
            ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, **kwargs)
            if not np.array_equal(x, exact.astype(np.int64)):
                problems.append(f"call {i} is not the exact sum")
    agree(comm, problems)
    assert t.trials == [] and len(set(t.ran)) == 1 and t.ran[0] != "mpi"
    assert _tuner(comm).left[(100 * 8).bit_length()][0] == LEASE - 2


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
def test_nonblocking_and_persistent_calls_run_the_incumbent_off_the_lease(settings, comm,
                                                                           progress):  # fmt: skip
    """A nonblocking or persistent call of a class in its lease runs what the blocking
    calls run, the incumbent, as ringmpi's own call, and takes nothing off the lease:
    its job runs no trial; the blocking calls go on counting it down."""
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune, no lease")
    settings(tuner="memory", lease=8, progress=progress)
    mine, exact = _inputs(comm, 1 << 19)  # 2 MiB: ringmpi's own nonblocking call in every family
    out = np.empty_like(mine)
    with ringmpi.trace() as blocking:
        for _ in range(2):  # leased, and remembered: the repeat path holds the counted call
            ringmpi.Allreduce(mine, out, MPI.SUM, comm)
    incumbent = blocking.ran[0]
    left = _tuner(comm).left[mine.nbytes.bit_length()]
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
    if seen.ran != [incumbent] * 6 or seen.trials:
        problems.append(f"the nonblocking calls ran {seen.ran}, trials {seen.trials}")
    if left[0] != 6:
        problems.append(f"{left[0]} calls left of the lease, not 6")
    for i in range(8):  # the lease's last calls, then the trials begin
        out[...] = 0
        ringmpi.Allreduce(mine, out, MPI.SUM, comm)
        if not np.array_equal(out, exact):
            problems.append(f"blocking call {i} is not the exact sum")
    if left[0] != 0:
        problems.append(f"{left[0]} calls left of the lease, not 0")
    persistent.Free()
    small = ringmpi.Allreduce_init(MPI.IN_PLACE, np.ones(4), MPI.SUM, comm)  # below the
    # size where ringmpi's requests made in Python pay: the library's, unless made in C
    in_c = progress == "wait" and _progress._MPIX.usable()
    if (small._library is None) != in_c:
        problems.append(f"a small persistent request the library's: {small._library is not None}")
    small.Free()
    agree(comm, problems)


def test_a_nonblocking_half_of_an_untuned_class_runs_the_incumbent(settings, comm):
    """A nonblocking reduce-scatter's job below tuner.SPREAD_FROM runs no trial: the
    model's best, to the bit."""
    settings(tuner="memory", lease=LEASE, progress="thread")
    per = tuner.SPREAD_FROM // 8 // comm.size  # int32: half of SPREAD_FROM in all
    mine, exact = _inputs(comm, per * comm.size)
    out = np.empty(per, np.int32)
    problems = []
    with ringmpi.trace() as seen:
        for i in range(2):
            out[...] = 0
            ringmpi.Ireduce_scatter_block(mine, out, MPI.SUM, comm).Wait()
            if not np.array_equal(out, exact[comm.rank * per : (comm.rank + 1) * per]):
                problems.append(f"call {i} is not the exact sum")
    agree(comm, problems)
    assert seen.trials == []
    assert len(seen.ran) == 2 and seen.ran[0] == seen.ran[1]
