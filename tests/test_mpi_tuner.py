"""Auto's online tuner: trials of the candidates, one agreed winner, the cache file.

A test algorithm, ``dawdle``, is what the cost model ranks first (its only
term costs nothing) but takes 3 ms a call: the trials must find that out, and
every rank must keep the same, other, winner. Each test runs on a new
communicator, whose first auto call starts from the cache file alone. The calls
sum integers, which every candidate sums to the same bits at any rank count (the
tuner tries candidates only where their answers agree: test_mpi_stable_bits.py).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import _host, algorithms, verify
from ringmpi._comm import context
from ringmpi.algorithms import tuner

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
COUNT = 16  # int32: 64 bytes, size class 7
NBYTES = 4 * COUNT
KLASS = NBYTES.bit_length()


def dawdle(work, red, ctx, source=None, timeout=0.0):
    """MPI_Allreduce, then 3 ms of sleep (the model thinks it free)."""
    ctx.comm.Allreduce(MPI.IN_PLACE if source is None else source, work, op=red.mpi_op)
    red.finish(work, ctx.size)
    time.sleep(0.003)


@pytest.fixture(autouse=True)
def registered():
    algorithms.register("dawdle", dawdle, terms=lambda n, p, nodes=1, per_node=1: {"dawdle": 1.0},
                        constants={"dawdle": 0.0}, no_half="a test algorithm")  # fmt: skip
    yield
    algorithms.unregister("dawdle")


@pytest.fixture
def where():
    """A directory every rank sees (made by rank 0), removed after the test."""
    path = WORLD.bcast(tempfile.mkdtemp(prefix="ringmpi-tuner-") if WORLD.rank == 0 else None)
    yield path
    WORLD.Barrier()
    if WORLD.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def comm():
    c = WORLD.Dup()
    yield c
    c.Free()


def calls(comm, n: int, **kw) -> tuple[ringmpi.Trace, list[str]]:
    """``n`` auto calls of COUNT int32 on ``comm``, traced; the problems found."""
    problems = []
    x = verify.verify_inputs(MPI.SUM, "int32", comm.rank, COUNT)
    got = np.empty_like(x)
    with ringmpi.trace() as t:
        for i in range(n):
            ringmpi.Allreduce(x, got, MPI.SUM, comm, **kw)
            if verify.count_wrong(got, MPI.SUM, comm.size):
                problems.append(f"call {i}: {verify.count_wrong(got, MPI.SUM, comm.size)} wrong")
    if len(set(comm.allgather(got.tobytes()))) != 1:
        problems.append("the ranks' results differ")
    return t, problems


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
@pytest.mark.parametrize("timeout", [None, 30.0])
def test_the_trials_take_turns_then_every_rank_keeps_the_same_winner(settings, where, comm,
                                                                     timeout):  # fmt: skip
    settings(tuner=where)
    timed = tuner.timed_calls(NBYTES)
    first = algorithms.choose("auto", NBYTES, context(comm), None)
    assert isinstance(first, algorithms.Lead) and first.name == "dawdle"
    names = tuner.tuner(context(comm), ringmpi._settings.current(), 1, 1).trying[KLASS].names
    assert names[0] == "dawdle" and names[-1] == "mpi" and len(names) == 1 + tuner.SHORTLIST
    first_round = len(names) * (1 + timed)
    t, problems = calls(comm, first_round + 2 * timed + 3, timeout=timeout)
    agree(comm, problems)
    # The incumbent's first call (the class's first: not a trial) and its first timed
    # trial, then turns (the fewest trials first), each other candidate's first call
    # untimed; a candidate 1.5 times slower than a lead that made all its calls is
    # tried no more; where one of ringmpi's own led the library by little, a second
    # round of the two, all timed; then the winner.
    ran = [x.algorithm for x in t.trials]
    assert ran[: 2 * len(names) - 1] == names[:1] + names[1:] * 2
    assert len(t.tuned) == 1 and t.tuned[0].call == len(t.trials)
    won, pair = t.tuned[0].algorithm, set(t.tuned[0].seconds)
    second = len(pair) == 2  # the second round's pair, or every candidate
    assert pair == ({won, "mpi"} if second else set(names))
    assert not (second and "dawdle" in pair)
    for name in names:
        assert ran.count(name) <= 1 + timed + (timed if second and name in pair else 0)
    firsts = {ran.index(name) for name in names[1:]}  # each other's first call untimed
    assert [not x.timed for x in t.trials] == [i in firsts for i in range(len(ran))]
    assert [x.call for x in t.trials] == list(range(1, 1 + len(t.trials)))
    assert won != "dawdle" and t.tuned[0].seconds.get("dawdle", 1.0) >= 0.003
    fastest = min(t.tuned[0].seconds.values())
    if won == "mpi":  # the library's call stays within LIBRARY_MARGIN of the fastest
        assert fastest > t.tuned[0].seconds["mpi"] * (1 - tuner.LIBRARY_MARGIN)
    else:
        assert (
            t.tuned[0].seconds[won]
            == fastest
            < t.tuned[0].seconds["mpi"] * (1 - tuner.LIBRARY_MARGIN)
        )
    assert len(set(comm.allgather(won))) == 1
    assert algorithms.choose("auto", NBYTES, context(comm), None).name == won
    # Rank 0 wrote the winner down.
    if comm.rank == 0:
        data = json.loads(Path(tuner.cache_file(ringmpi._settings.current())).read_text())
        (layout,) = data["layouts"].values()
        assert layout[str(KLASS)]["algorithm"] == won
        assert layout[str(KLASS)]["bytes"] == "64-127"


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_a_class_starts_on_the_winner_of_a_class_near_it(settings, comm):
    """Once a class has settled, a class within tuner.NEAR of it starts on its winner
    (where that is one of its candidates), not on the model's best (dawdle); the
    winner is the same on every rank, and so is the new class's first call."""
    settings(tuner="memory")
    x = verify.verify_inputs(MPI.SUM, "int32", comm.rank, 2 * COUNT)  # the class above
    got = np.empty_like(x)
    with ringmpi.trace() as t:
        for _ in range(tuner.most_trial_calls(2 * NBYTES) + 1):
            if t.tuned:
                break
            ringmpi.Allreduce(x, got, MPI.SUM, comm)
    assert verify.count_wrong(got, MPI.SUM, comm.size) == 0
    (settled,) = t.tuned
    assert settled.size_class == KLASS + 1 and settled.algorithm != "dawdle"
    first = algorithms.choose("auto", NBYTES, context(comm), None)
    names = tuner.tuner(context(comm), ringmpi._settings.current(), 1, 1).trying[KLASS].names
    assert names[0] == first.name == (settled.algorithm if settled.algorithm in names
                                      else "dawdle")  # fmt: skip
    assert set(names) >= {"dawdle", "mpi"}
    assert len(set(comm.allgather(first.name))) == 1


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_nonblocking_calls_alone_tune_a_class_from_remembered_below(settings, comm):
    """From tuner.REMEMBERED_BELOW a nonblocking call's job takes its turn in the class's
    trials as a blocking call does: a program of Iallreduce calls alone settles the
    class, on the same winner on every rank, not the slow favourite (dawdle); every
    call exact. Where the requests are the library's, no trial."""
    from ringmpi import _progress

    settings(tuner="memory")
    count = tuner.REMEMBERED_BELOW // 4
    x = verify.verify_inputs(MPI.SUM, "int32", comm.rank, count)
    got = np.empty_like(x)
    wrong = 0
    with ringmpi.trace() as t:
        for _ in range(tuner.most_trial_calls(tuner.REMEMBERED_BELOW) + 1):
            if t.tuned:
                break
            ringmpi.Iallreduce(x, got, MPI.SUM, comm).Wait()
            wrong += verify.count_wrong(got, MPI.SUM, comm.size)
    assert wrong == 0
    if _progress.mode(context(comm)) == "library":  # the library's requests
        assert t.trials == [] and set(t.ran) == {"mpi"}
        return
    (settled,) = t.tuned
    assert settled.algorithm != "dawdle" and t.trials[0].algorithm == "dawdle"
    assert len(set(comm.allgather(settled.algorithm))) == 1
    order = [trial.algorithm for trial in t.trials]
    assert comm.allgather(order)[0] == order  # the same trials, in the same order


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_the_models_best_leads_and_the_others_trials_come_between_its_calls(settings, comm):
    """With the spacing auto, the model's best (dawdle) makes the first calls and its
    first timed trial, then runs the calls between the others' trials, spaced by
    their cost beyond it, and once one has made its timed calls faster, the calls
    between run that one; every call exact, one winner on every rank, and not the
    slow favourite."""
    settings(tuner="memory", spacing="auto")
    count = tuner.REMEMBERED_BELOW // 4
    x = verify.verify_inputs(MPI.SUM, "int32", comm.rank, count)
    got = np.empty_like(x)
    problems = []
    with ringmpi.trace() as t:
        for i in range(tuner.most_trial_calls(4 * count) * (1 + tuner.GAP_MOST) + 2):
            if t.tuned and t.tuned[0].call < i - 1:  # settled on every rank at once
                break
            ringmpi.Allreduce(x, got, MPI.SUM, comm)
            if verify.count_wrong(got, MPI.SUM, comm.size):
                problems.append(f"call {i}: wrong")
    agree(comm, problems)
    assert len(t.tuned) == 1 and t.tuned[0].algorithm != "dawdle"
    assert len(set(comm.allgather(t.tuned[0].algorithm))) == 1
    trials = {x.call: x for x in t.trials}
    timed = t.trials[0]  # after the first call and at least one more, dawdle's timed trial
    assert (timed.algorithm, timed.timed) == ("dawdle", True) and timed.call >= 2
    assert set(t.ran[: timed.call]) == {"dawdle"}
    # the first other trial comes after at least one of dawdle's calls and at most
    # gap_most of them (dawdle's median, agreed: the slowest rank's)
    inc = max(comm.allgather(timed.seconds))
    first = t.trials[1].call
    assert t.trials[1].algorithm != "dawdle" and set(t.ran[timed.call + 1 : first]) == {"dawdle"}
    assert 1 <= first - timed.call - 1 <= tuner.gap_most(inc)
    for name in {x.algorithm for x in t.trials} - {"dawdle"}:  # its first call untimed
        assert not next(x for x in t.trials if x.algorithm == name).timed
    # once another has made all its timed calls, 3 ms faster, it leads: dawdle runs
    # no call between the trials after it
    made = 1 + tuner.timed_calls(4 * count)
    done = next(x.call for x in t.trials
                if x.algorithm != "dawdle"
                and sum(y.algorithm == x.algorithm for y in t.trials if y.call <= x.call) == made)  # fmt: skip
    between = [name for i, name in enumerate(t.ran) if i > done and i not in trials]
    assert "dawdle" not in between


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_the_next_run_starts_tuned_and_an_old_entry_is_tried_again(settings, where, comm):
    settings(tuner=where)
    t, problems = calls(comm, tuner.most_trial_calls(NBYTES))
    agree(comm, problems)
    won = t.tuned[0].algorithm
    # A new communicator (as a new run): the file's choice, no trials.
    again = WORLD.Dup()
    try:
        t2, problems = calls(again, 3)
        agree(again, problems)
        assert t2.trials == [] and t2.tuned == []
        assert algorithms.choose("auto", NBYTES, context(again), None).name == won
    finally:
        again.Free()
    # Entries older than retune_days are tried again.
    path = tuner.cache_file(ringmpi._settings.current())
    if WORLD.rank == 0:
        data = json.loads(Path(path).read_text())
        for layout in data["layouts"].values():
            layout[str(KLASS)]["tuned_at"] -= 2 * 86400.0
        with open(path, "w") as fh:
            json.dump(data, fh)
    WORLD.Barrier()
    settings(retune_days=1)
    tried_again(t)


def tried_again(first: ringmpi.Trace) -> None:
    """On a new communicator (as in a new run) the class is tried again: its first
    calls are the trials ``first`` began with."""
    fresh = WORLD.Dup()
    try:
        t, problems = calls(fresh, 2 + tuner.SHORTLIST)
        agree(fresh, problems)
        began = [x.algorithm for x in first.trials[: 1 + tuner.SHORTLIST]]
        assert [x.algorithm for x in t.trials] == began and began[-1] == "mpi"
    finally:
        fresh.Free()


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_the_file_names_its_host_and_another_hosts_entries_are_tried_again(settings, where,
                                                                           comm):  # fmt: skip
    settings(tuner=where)
    t, problems = calls(comm, tuner.most_trial_calls(NBYTES))
    agree(comm, problems)
    path = tuner.cache_file(ringmpi._settings.current())
    if WORLD.rank == 0:
        data = json.loads(Path(path).read_text())
        (layout,) = data["layouts"]
        # this host: CPU model, last-level cache, cores online
        assert layout.endswith(f" | {_host.describe()}")
        assert f", {os.cpu_count()} cores" in layout and _host.cpu_model() in layout
        # The same machine name on other hardware (a VM moved to another host).
        moved = layout.replace(_host.describe(), "Another CPU, 1 MiB last-level cache, "
                               "1 cores")  # fmt: skip
        data["layouts"] = {moved: data["layouts"][layout]}
        Path(path).write_text(json.dumps(data))
    WORLD.Barrier()
    tried_again(t)


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_memory_tunes_without_a_file_and_off_is_the_cost_model(settings, where, comm):
    settings(tuner="memory")
    t, problems = calls(comm, tuner.most_trial_calls(NBYTES))
    agree(comm, problems)
    assert len(t.tuned) == 1 and t.tuned[0].algorithm != "dawdle"
    assert tuner.cache_file(ringmpi._settings.current()) is None
    assert os.listdir(where) == []
    settings(tuner="off")
    fresh = WORLD.Dup()
    try:
        t2, problems = calls(fresh, 2)
        agree(fresh, problems)
        assert (
            t2.trials == [] and algorithms.choose("auto", NBYTES, context(fresh)).name == "dawdle"
        )
    finally:
        fresh.Free()


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_a_damaged_cache_file_is_reported_and_rewritten(settings, where, comm, capfd):
    settings(tuner=where)
    path = tuner.cache_file(ringmpi._settings.current())
    if WORLD.rank == 0:
        with open(path, "w") as fh:
            fh.write("{not json")
    WORLD.Barrier()
    t, problems = calls(comm, tuner.most_trial_calls(NBYTES))
    agree(comm, problems)
    assert len(t.tuned) == 1
    if WORLD.rank == 0:
        assert f"ignoring the tuner's cache file {path}" in capfd.readouterr().err
        assert json.loads(Path(path).read_text())["version"] == 1
        assert not [f for f in os.listdir(where) if f.startswith(".")]  # nothing left aside


def test_one_rank_and_reproducible_mode_do_not_tune(settings, where):
    settings(tuner=where)
    ctx = context(WORLD)
    red = ringmpi.kernels.reduction(MPI.SUM, np.dtype(np.float32))
    assert not isinstance(algorithms.choose("auto", NBYTES, ctx, red, reproducible=True),
                          algorithms.Trial)  # fmt: skip
    if WORLD.size == 1:
        assert not isinstance(algorithms.choose("auto", NBYTES, ctx, red), algorithms.Trial)


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_untraced_trials_run_the_repeat_path_and_settle(settings, where, comm):
    """Without a trace the trials time each candidate's repeat (its compiled entry)."""
    settings(tuner="memory")
    x = verify.verify_inputs(MPI.SUM, "int32", comm.rank, COUNT)
    got = np.empty_like(x)
    problems = []
    for i in range(tuner.most_trial_calls(NBYTES)):
        ringmpi.Allreduce(x, got, MPI.SUM, comm)
        if verify.count_wrong(got, MPI.SUM, comm.size):
            problems.append(f"call {i}: wrong")
    agree(comm, problems)
    won = algorithms.choose("auto", NBYTES, context(comm), None)
    assert not isinstance(won, algorithms.Trial) and won.name != "dawdle"
    assert len(set(comm.allgather(won.name))) == 1


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_a_cached_algorithm_that_is_not_registered_is_tried_again(settings, where, comm):
    settings(tuner=where)
    t, problems = calls(comm, tuner.most_trial_calls(NBYTES))
    agree(comm, problems)
    path = tuner.cache_file(ringmpi._settings.current())
    if WORLD.rank == 0:
        data = json.loads(Path(path).read_text())
        for layout in data["layouts"].values():
            layout[str(KLASS)]["algorithm"] = "gone"  # an algorithm of another program
        Path(path).write_text(json.dumps(data))
    WORLD.Barrier()
    fresh = WORLD.Dup()
    try:
        t2, problems = calls(fresh, 4)  # the lead's first call, then three trials
        agree(fresh, problems)
        assert [x.algorithm for x in t2.trials] == [x.algorithm for x in t.trials[:3]]
    finally:
        fresh.Free()


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_the_library_is_not_tried_where_its_answer_differs(settings, where, comm):
    """SUM of int16 (Open MPI saturates it) is tuned apart, among ringmpi's own only."""
    settings(tuner="memory")
    x = verify.verify_inputs(MPI.SUM, "int16", comm.rank, 2 * COUNT)  # 64 bytes
    with ringmpi.trace() as t:
        for _ in range(tuner.SHORTLIST * (1 + tuner.timed_calls(NBYTES))):
            got = ringmpi.allreduce(x, MPI.SUM, comm)
            assert not verify.count_wrong(got, MPI.SUM, comm.size)
    tried = {c.algorithm for c in t.trials}
    assert "dawdle" in tried and "mpi" not in tried and len(tried) == tuner.SHORTLIST
    assert "mpi" not in {c.algorithm for c in t.trials}
    assert {c.size_class for c in t.trials} == {-KLASS}
    assert len(t.tuned) == 1 and t.tuned[0].algorithm != "dawdle"
    red = ringmpi.kernels.reduction(MPI.SUM, np.dtype(np.float32))
    assert algorithms.library_agrees(red) and not algorithms.library_agrees(
        ringmpi.kernels.reduction(MPI.SUM, np.dtype(np.int16)))  # fmt: skip


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_the_halves_winners_go_under_collectives_and_the_next_run_starts_tuned(settings, where,
                                                                              comm):  # fmt: skip
    """A reduce-scatter is tuned by the same tuner into the same file, under its own
    name (so a version that knows only the all-reduce's classes reads past it); an
    entry the tuner cannot read as a size class is skipped, not fatal."""
    settings(tuner=where)
    n, k = comm.size, 1 << 14  # int32 a block: past the library's small calls
    x = verify.verify_inputs(MPI.SUM, "int32", comm.rank, k * n)
    want = verify.verify_expected(MPI.SUM, "int32", n, k * n)[comm.rank * k : (comm.rank + 1) * k]
    want = want.astype(np.int32).tobytes()
    out = np.empty(k, np.int32)
    problems = []
    with ringmpi.trace() as t:
        for i in range(tuner.most_trial_calls(4 * k * n) + 1):  # the trials, then the winner
            ringmpi.Reduce_scatter_block(x, out, comm=comm)
            if out.tobytes() != want:
                problems.append(f"call {i}: wrong result")
    agree(comm, problems)
    assert len(t.tuned) == 1
    won = t.tuned[0].algorithm
    path = tuner.cache_file(ringmpi._settings.current())
    if WORLD.rank == 0:
        data = json.loads(Path(path).read_text())
        halves = data["collectives"]["reduce_scatter"]
        assert [list(classes) for classes in halves.values()] == [[str((4 * k * n).bit_length())]]
        assert not any(layout for layout in data.get("layouts", {}).values())
        for layout in halves:  # what another version might have written
            data.setdefault("layouts", {})[layout] = {"allgather:4": {"algorithm": "ring"}}
        Path(path).write_text(json.dumps(data))
    WORLD.Barrier()
    again = WORLD.Dup()
    try:
        with ringmpi.trace() as t2:
            ringmpi.Reduce_scatter_block(x, out, comm=again)
        assert (t2.trials, t2.ran, out.tobytes() == want) == ([], [won], True)
    finally:
        again.Free()


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
def test_a_thin_lead_over_the_library_is_timed_again_and_a_loser_dropped(settings, comm):
    settings(tuner="memory")
    ctx = context(comm)
    t = tuner.tuner(ctx, ringmpi._settings.current(), 1, 1)
    # dawdle 10 % faster than the library: too thin to keep at once
    first = tuner._Trials(["dawdle", "mpi"], 3, np.zeros(1, np.int64), 0)
    first.times = [[0.9e-3] * 3, [1.0e-3] * 3]
    t.trying[KLASS] = first
    t.settle(KLASS, first, ctx, 0.0)
    again = t.trying[KLASS]
    assert KLASS not in t.known and again.second and again.runs == [1, 1]  # no untimed call
    assert again.names == ["dawdle", "mpi"] and again.left is first.left and not again.finished
    assert again.times == [[0.9e-3] * 3, [1.0e-3] * 3]
    # its second round's calls 2 ms: the median of both rounds is the library's loss
    again.times[0] += [2e-3] * 3
    again.times[1] += [1.0e-3] * 3
    t.settle(KLASS, again, ctx, 0.0)
    assert t.known[KLASS] == "mpi" and KLASS not in t.trying
    # a lead of 50 %: kept at once
    clear = tuner._Trials(["dawdle", "mpi"], 3, np.zeros(1, np.int64), 0)
    clear.times = [[0.5e-3] * 3, [1.0e-3] * 3]
    t.trying[KLASS + 1] = clear
    t.settle(KLASS + 1, clear, ctx, 0.0)
    assert t.known[KLASS + 1] == "dawdle" and KLASS + 1 not in t.trying


def _evidence(comm, fastest: str, seconds: float) -> dict[str, float]:
    """Measured seconds per byte for every candidate of auto on ``comm``: ``fastest`` a
    call of CALIBRATED_FROM in ``seconds``, every other a hundred times that."""
    ctx = context(comm)
    pool = [a.name for a in algorithms._fitting(ctx) if a.terms is None or a.auto]
    per_byte = seconds / tuner.CALIBRATED_FROM
    return {name: per_byte * (1 if name == fastest else 100) for name in pool}


@pytest.mark.skipif(WORLD.size == 1, reason="one rank has nothing to choose")
@pytest.mark.parametrize("which", ["own", "mpi"])
def test_the_hosts_evidence_starts_a_large_class_on_the_measured_fastest(settings, comm,
                                                                        monkeypatch, which):  # fmt: skip
    """From tuner.CALIBRATED_FROM, with this host's evidence (tuner.calibrate), a class
    starts on the candidate measured fastest (another of ringmpi's own than the model's
    best, or the library's call), not on the model's best (dawdle); its trials still
    try the others (measured a hundred times slower: one measurement is no verdict)."""
    settings(tuner="memory")
    ctx = context(comm)
    now = ringmpi._settings.current()
    layout = (ctx.size, *ctx.nodes(now))
    count = tuner.CALIBRATED_FROM // 4
    shortlist = algorithms._auto(4 * count, ctx, now, False, False, True).shortlist
    fastest = shortlist[1].name if which == "own" else "mpi"
    assert shortlist[0].name == "dawdle" and fastest in [a.name for a in shortlist]
    monkeypatch.setattr(tuner, "_measured", {layout: _evidence(comm, fastest, 1e-3)})
    x = verify.verify_inputs(MPI.SUM, "int32", comm.rank, count)
    got = np.empty_like(x)
    problems = []
    with ringmpi.trace() as t:
        for _ in range(6):
            ringmpi.Allreduce(x, got, MPI.SUM, comm)
            if verify.count_wrong(got, MPI.SUM, comm.size):
                problems.append("wrong")
    agree(comm, problems)
    ran = [x.algorithm for x in t.trials]
    assert t.ran[0] == ran[0] == fastest  # its first call, then its first timed trial
    assert set(ran[1:]) - {fastest}, ran  # the others tried after it
