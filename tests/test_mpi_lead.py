"""The lead: between an untuned size class's trials its calls run the incumbent.

Auto's tuner runs the incumbent (the model's best candidate) for a class's first
call and, before each trial, for ``spacing`` calls (the setting; auto: as many as
keep the trials within a budget of its time), counted off the class's cell of
calls left from Python and from the C repeat path alike.
Closed-form inputs: rank r contributes r + 1 + i at element i, so every element's
sum is known exactly.
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
SPACING = 5


@pytest.fixture
def comm():
    c = WORLD.Dup()  # a new communicator: auto starts untuned on it
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
def test_a_class_runs_the_models_best_between_its_trials(settings, comm, count):
    settings(tuner="memory", spacing=SPACING)
    mine, exact = _inputs(comm, count)
    out = np.empty_like(mine)
    problems = []
    with ringmpi.trace() as t:
        for i in range(2 * (1 + SPACING) + 1):
            ringmpi.Allreduce(mine, out, MPI.SUM, comm)
            if not np.array_equal(out, exact):
                problems.append(f"call {i} ({t.ran[-1]}) is not the exact sum")
    agree(comm, problems)
    if comm.size == 1:  # nothing to tune: the model's pick from the first call
        assert t.trials == [] and _tuner(comm) is None
        return
    klass = mine.nbytes.bit_length()
    trials = _tuner(comm).trying[klass]
    # the incumbent (the trials' first candidate, never the library) made the first
    # call and SPACING more, then its timed trial, SPACING calls, and then the next
    # candidate's first trial; then the lead's calls again
    lead = trials.names[0]
    assert t.ran[:-1] == [lead] * (1 + 2 * SPACING + 1) and lead != "mpi"
    assert [(x.algorithm, x.call) for x in t.trials] == [(lead, 1 + SPACING),
                                                         (trials.names[1], 2 + 2 * SPACING)]  # fmt: skip
    assert {x.size_class for x in t.trials} == {klass}
    assert trials.left[0] == SPACING


def test_calls_from_c_count_the_leads_calls_down(settings, comm):
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune")
    settings(tuner="memory", spacing=SPACING)
    mine, exact = _inputs(comm, 1000)
    out = np.empty_like(mine)
    problems = []
    for i in range(1 + SPACING):  # the lead's calls: remembered at once, every call
        # after the first repeats
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
    trials = _tuner(comm).trying[mine.nbytes.bit_length()]
    assert trials.left[0] == 0 and trials.runs[0] == 1 and sum(trials.runs) == 1
    with ringmpi.trace() as t:  # the lead's calls made: its timed trial
        ringmpi.Allreduce(mine, out, MPI.SUM, comm)
    assert np.array_equal(out, exact)
    assert [(x.algorithm, x.timed) for x in t.trials] == [(trials.names[0], True)]


@pytest.mark.parametrize("why", ["tuner off", "reproducible", "named"])
def test_no_trials_where_auto_would_not_tune(settings, comm, why):
    settings(tuner="off" if why == "tuner off" else "memory", spacing=SPACING)
    mine, exact = _inputs(comm, 100)
    x = mine.astype(np.float64)
    kwargs = {"reproducible": {"reproducible": True}, "named": {"algorithm": "ring"}}.get(why, {})
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, **kwargs)
    assert np.array_equal(x, exact.astype(np.float64))
    assert t.trials == []
    tuner = _tuner(comm)
    assert tuner is None or not tuner.trying  # no class's trials begun


@pytest.mark.parametrize("kwargs", [{"validate": True}, {"timeout": 30}])
def test_validated_and_timed_calls_count_off_the_leads_calls(settings, comm, kwargs):
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune")
    settings(tuner="memory", spacing=SPACING)
    mine, exact = _inputs(comm, 100)
    problems = []
    with ringmpi.trace() as t:
        for i in range(4):  # the lead's calls
            x = mine.astype(np.int64)  # integers: every candidate's bits alike, so tuned
            ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, **kwargs)
            if not np.array_equal(x, exact.astype(np.int64)):
                problems.append(f"call {i} is not the exact sum")
    agree(comm, problems)
    assert t.trials == [] and len(set(t.ran)) == 1 and t.ran[0] != "mpi"
    assert _tuner(comm).trying[(100 * 8).bit_length()].left[0] == 1 + SPACING - 4


def test_a_freed_communicator_forgets_its_leads_calls(settings):
    settings(tuner="memory", spacing=SPACING)
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
def test_nonblocking_and_persistent_calls_run_the_lead_uncounted(settings, comm,
                                                                  progress):  # fmt: skip
    """A nonblocking or persistent call of a class between its trials runs what the
    blocking calls run, the lead, as ringmpi's own call, and takes none of the lead's
    calls: its job runs no trial; the blocking calls go on counting them down."""
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune")
    settings(tuner="memory", spacing=8, progress=progress)
    mine, exact = _inputs(comm, 1 << 19)  # 2 MiB: ringmpi's own nonblocking call in every family
    out = np.empty_like(mine)
    with ringmpi.trace() as blocking:
        for _ in range(3):  # counted and remembered: the repeat path holds the counted call
            ringmpi.Allreduce(mine, out, MPI.SUM, comm)
    incumbent = blocking.ran[0]
    left = _tuner(comm).trying[mine.nbytes.bit_length()].left
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
        problems.append(f"{left[0]} of the lead's calls left, not 6")
    for i in range(6):  # the lead's last calls before the next trial
        out[...] = 0
        ringmpi.Allreduce(mine, out, MPI.SUM, comm)
        if not np.array_equal(out, exact):
            problems.append(f"blocking call {i} is not the exact sum")
    if left[0] != 0:
        problems.append(f"{left[0]} of the lead's calls left, not 0")
    persistent.Free()
    small = ringmpi.Allreduce_init(MPI.IN_PLACE, np.ones(4), MPI.SUM, comm)  # below the
    # size where ringmpi's requests made in Python pay: the library's, unless made in C
    in_c = progress == "wait" and _progress._MPIX.usable()
    if (small._library is None) != in_c:
        problems.append(f"a small persistent request the library's: {small._library is not None}")
    small.Free()
    agree(comm, problems)


def test_a_nonblocking_half_of_an_untuned_class_runs_the_incumbent(settings, comm):
    """A nonblocking reduce-scatter's job below tuner.REMEMBERED_BELOW runs no trial:
    the model's best, to the bit."""
    settings(tuner="memory", spacing=SPACING, progress="thread")
    per = tuner.REMEMBERED_BELOW // 8 // comm.size  # int32: half of REMEMBERED_BELOW in all
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


@pytest.mark.parametrize("buffers", [1, 16])
def test_large_nonblocking_calls_alone_count_the_leads_calls_alike(settings, comm, buffers):
    """From tuner.REMEMBERED_BELOW a nonblocking call's job counts the lead's calls and
    takes its turn in the trials, in Python on every rank (a call started in C on one
    rank and in Python on another would run other algorithms, and wait forever):
    calls of one array, or of arrays in turn, settle the class on one winner, every
    call exact."""
    if comm.size == 1:
        pytest.skip("one rank: nothing to tune")
    settings(tuner="memory", spacing=2, timeout=60)
    mine, exact = _inputs(comm, tuner.REMEMBERED_BELOW // 4)
    arrays = [np.empty_like(mine) for _ in range(buffers)]
    problems = []
    with ringmpi.trace() as t:
        for i in range(3 * tuner.most_trial_calls(mine.nbytes) + 2):
            if t.tuned:
                break
            x = arrays[i % buffers]
            x[...] = mine
            ringmpi.Iallreduce(MPI.IN_PLACE, x, MPI.SUM, comm).Wait()
            if not np.array_equal(x, exact):
                problems.append(f"call {i} is not the exact sum")
    agree(comm, problems)
    if _progress.mode(_comm.context(comm)) == "library":  # the library's requests
        assert t.trials == []
        return
    assert len(t.tuned) == 1 and len(set(comm.allgather(t.tuned[0].algorithm))) == 1
    assert comm.allgather([x.algorithm for x in t.trials])[0] == [x.algorithm for x in t.trials]
