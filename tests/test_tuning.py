"""The cost model auto chooses by, its tuning file, and the fit python -m ringmpi tune does."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from conftest import auto_choice

from ringmpi import algorithms, tuning
from ringmpi.tools.tune import fit

D = tuning.DEFAULTS


def terms(name: str, *args, **kw) -> dict[str, float]:
    return algorithms.get(name).terms(*args, **kw)


choose = auto_choice


def test_terms_are_the_closed_forms():
    assert terms("ring", 100, 4) == {"call": 1, "alpha": 6, "beta": 150, "gamma": 75}
    assert terms("recursive_doubling", 100, 8) == {
        "call": 1, "alpha": 3, "beta": 300, "gamma": 300,
    }  # fmt: skip
    # 6 ranks: p' = 4 run the plan, 2 fold in and out (2 steps, the buffer twice more)
    assert terms("rabenseifner", 100, 6) == {
        "call": 1, "alpha": 4 + 2, "beta": 150 + 200, "gamma": 75 + 100,
    }  # fmt: skip
    assert terms("ring", 100, 1) == {"call": 1}
    # shared_memory, per piece of 128 KiB: under 16 KiB every rank waits on p flags
    # once and stores n, loads (p - 1) n; sliced, it waits twice and loads 2 (p - 1) / p
    assert terms("shared_memory", 100, 4) == {"call": 1, "shm_wait": 4, "shm_byte": 400}
    sliced = terms("shared_memory", 200_000, 3)  # two pieces
    assert sliced == {"call": 1, "shm_wait": 2 * 2 * 3, "shm_byte": 200_000 * 7 / 3}


def test_hierarchical_terms_count_pipeline_steps_and_the_ring_across_nodes():
    one = terms("hierarchical", 5 << 20, 4, nodes=1, per_node=4)
    assert one == {"node_call": 1, "node_step": 3 + 2, "node_byte": 5 << 20}
    two = terms("hierarchical", 4 << 20, 8, nodes=2, per_node=4)
    ring = terms("ring", 1 << 20, 2)  # each rail rings n/L over the M nodes
    assert two == {"node_call": 1, "node_step": 2 * (2 + 1), "node_byte": 4 << 20,
                   "alpha": ring["alpha"], "beta": ring["beta"], "gamma": ring["gamma"]}  # fmt: skip


def test_defaults_choose_shared_memory_on_one_node_and_messages_across():
    assert choose(D, 8, 2, 1, 2) == "shared_memory"
    assert choose(tuning.defaults(64), 8, 64, 1, 64) == "shared_memory"
    messages = [a for a in algorithms.candidates() if a != "shared_memory"]  # several nodes
    assert choose(D, 8, 16, 4, 4, messages) == "recursive_doubling"
    # one node: the sliced way loads 2 (p - 1) / p of the buffer from the others at
    # every size from 16 KiB, as the hierarchical node phase does, without its rails
    for size in (1 << 20, 64 << 20):
        assert choose(D, size, 2, 1, 2) == "shared_memory"
        assert choose(tuning.defaults(16), size, 16, 1, 16) == "shared_memory"
    # several nodes: the hierarchical algorithm's rails for large buffers
    assert choose(D, 64 << 20, 8, 2, 4, messages) == "hierarchical"
    # one rank per node: no shared memory to use, the ring's bandwidth wins
    assert choose(D, 64 << 20, 8, 8, 1, messages) in ("ring", "rabenseifner")


def test_defaults_by_ranks_per_node():
    assert tuning.defaults(1) == tuning.defaults(2) == D
    assert tuning.defaults(16) == tuning.defaults(64) == tuning.CROWDED
    small, crowded = tuning.as_dict(D), tuning.as_dict(tuning.CROWDED)
    # 4 ranks lie a third of the way from 2 to 16 in log2: a geometric third
    four = tuning.as_dict(tuning.defaults(4))
    for k in small:
        assert four[k] == pytest.approx(small[k] ** (2 / 3) * crowded[k] ** (1 / 3)), k


def test_choice_is_the_smallest_prediction():
    for n in (8, 4096, 1 << 20, 64 << 20):
        for p in (2, 3, 8, 17):
            best = min(algorithms.predict(D, a, n, p, 1, p) for a in algorithms.candidates())
            assert algorithms.predict(D, choose(D, n, p, 1, p), n, p, 1, p) == best


def test_the_tuner_tries_the_best_of_each_kind():
    def tried(*names):
        return [a.name for a in algorithms.shortlist_of([algorithms.get(n) for n in names])]

    # the next of the other kind comes second, whatever its rank, then the model's next
    assert tried("shared_memory", "hierarchical", "rabenseifner", "ring") == [
        "shared_memory", "rabenseifner", "hierarchical"]  # fmt: skip
    assert tried("ring", "rabenseifner", "recursive_doubling", "hierarchical") == [
        "ring", "hierarchical", "rabenseifner"]  # fmt: skip
    assert tried("shared_memory", "recursive_doubling", "hierarchical") == [
        "shared_memory", "recursive_doubling", "hierarchical"]  # fmt: skip
    # none of the other kind: the model's next ones
    assert tried("hierarchical", "shared_memory", "symmetric") == [
        "hierarchical", "shared_memory", "symmetric"]  # fmt: skip
    assert tried("ring") == ["ring"]
    # with the defaults on one node of 2 ranks, shared memory's two come first from
    # 1 MiB: the message-passing best is tried beside both
    ranked = sorted(
        algorithms.candidates(), key=lambda a: algorithms.predict(D, a, 64 << 20, 2, 1, 2)
    )
    assert ranked[:2] == ["shared_memory", "hierarchical"]
    assert tried(*ranked) == ["shared_memory", "ring", "hierarchical"]


def test_the_trials_take_turns_and_the_fastest_done_leads():
    t = _trials(["incumbent", "fast", "slow"], 2)
    assert t.next() == 0  # the incumbent's first two trials
    t.runs = [1, 0, 0]
    assert t.next() == 0
    t.runs, t.agreed = [2, 0, 0], [0.010, 0.0, 0.0]
    assert t.next() == 1  # then the fewest trials made first, the lead's own among them
    t.runs, t.agreed = [2, 2, 1], [0.010, 0.005, 0.0]
    assert t.lead == 0 and t.next() == 2  # fast has made one of its two timed calls
    t.runs[1] = 3  # all its timed calls made, its agreed median the fastest: it leads
    assert t.lead == 1 and t.next() == 2
    t.runs[2], t.agreed[2] = 3, 0.004
    assert t.lead == 2 and t.next() == 0  # the incumbent's last trial
    t.dropped.add(2)
    assert t.lead == 1
    t.runs[0] = 3
    assert t.finished


def _trials(names, timed, spacing=None):
    from ringmpi.algorithms import tuner

    return tuner._Trials(names, timed, np.zeros(1, np.int64), spacing)


def test_the_trials_spend_ahead_then_keep_within_the_budget():
    from ringmpi.algorithms import tuner

    t = _trials(["incumbent", "a", "b"], 5)
    t.runs, t.calls, t.agreed = [2, 0, 0], 2, [0.004, 0.0, 0.0]
    per_call = tuner.TRIAL_BUDGET * 0.004  # what the budget grants a call of the lead
    ahead = tuner.BUDGET_AHEAD
    # nothing known of a: the lead's time again and ONE_TIME_S beyond it, less what
    # BUDGET_AHEAD calls grant (the credit: no more than that)
    assert t._spacing(0, 1) == math.ceil((0.004 + tuner.ONE_TIME_S) / per_call - ahead) == 3
    t.spent = 0.004  # what the trials took beyond the lead's calls so far: over budget
    assert t._spacing(0, 1) == math.ceil((0.008 + tuner.ONE_TIME_S) / per_call - ahead - 2) == 11
    t.first = 0.006  # a first trial took 6 ms, all told: the guess for another's first
    assert (0.004 + 0.002) / per_call - ahead - 2 < 1 and t._spacing(0, 1) == 1  # at least one
    t.runs[1], t.cost[1] = 1, 0.010  # its own first trial's time, all told
    assert t._spacing(0, 1) == math.ceil((0.004 + 0.006) / per_call - ahead - 2) == 3
    t.cost[1] = 0.0045  # slower than the lead, within the budget: one between
    assert t._spacing(0, 1) == 1
    t.cost[1] = 0.003  # faster than the lead: its trials one after another
    assert t._spacing(0, 1) == 0
    t.spent, t.calls = 0.0, 1000  # far under budget: the credit is BUDGET_AHEAD calls'
    t.cost[1] = 0.004 + 30 * per_call
    assert t._spacing(0, 1) == 30 - ahead
    t.spent = 1.0  # far over: at most gap_most of the lead's calls between
    assert t._spacing(0, 2) == tuner.gap_most(0.004) == tuner.GAP_MOST
    t.agreed[0] = 20e-6  # a lead of 20 us: up to GAP_S of its calls
    assert t._spacing(0, 2) == tuner.gap_most(20e-6) == math.ceil(tuner.GAP_S / 20e-6) > 64
    t.agreed[0], t.expected = 0.0, 0.0  # the lead's time not yet agreed, none expected
    assert t._spacing(0, 2) == tuner.GAP_MOST
    t.expected, t.spent, t.calls = 0.004, 0.0, 0  # the model's: the lead's timed trial
    assert t._spacing(0, 0) == math.ceil((tuner.TRIAL_S + 0.008) / per_call - ahead)
    assert _trials(["incumbent", "a"], 5, spacing=7)._spacing(0, 1) == 7  # the setting


def _measured(costs, p, nodes, per_node):
    return [
        {"algorithm": a, "bytes": n, "seconds": algorithms.predict(costs, a, n, p, nodes, per_node)}
        for a in algorithms.candidates()
        for n in (8, 512, 32768, 1 << 20, 8 << 20, 64 << 20)
    ]


@pytest.mark.parametrize(("p", "nodes", "per_node"), [(2, 1, 2), (8, 2, 4), (5, 1, 5)])
def test_fit_recovers_the_constants_that_made_the_data(p, nodes, per_node):
    known = tuning.Costs(alpha=2e-6, beta=3e-10, gamma=5e-11, call=6e-6, node_call=30e-6,
                         node_step=5e-6, node_byte=2e-10, shm_wait=1e-7, shm_byte=2e-10)  # fmt: skip
    got = fit(_measured(known, p, nodes, per_node), p, nodes, per_node)
    for f in dataclasses.fields(tuning.Costs):
        assert getattr(got, f.name) == pytest.approx(getattr(known, f.name), rel=1e-6), f.name


def test_fit_of_shared_memory_survives_small_sizes_below_the_call_cost():
    """Measured 8 B faster than the per-call cost fitted from the other algorithms
    (noise) must not zero the shared-memory constants: the fit weighs each size by
    its whole time, not by what is left over."""
    known = dataclasses.replace(D, shm_wait=5e-8, shm_byte=2e-10)
    data = _measured(known, 2, 1, 2)
    for m in data:
        if m["algorithm"] == "shared_memory" and m["bytes"] <= 512:
            m["seconds"] = 0.8 * known.call
    got = fit(data, 2, 1, 2)
    assert got.shm_byte == pytest.approx(known.shm_byte, rel=0.2)
    big = algorithms.predict(got, "shared_memory", 64 << 20, 2, 1, 2)
    assert big == pytest.approx(
        algorithms.predict(known, "shared_memory", 64 << 20, 2, 1, 2), rel=0.2
    )


def test_fit_keeps_constants_non_negative():
    data = _measured(D, 2, 1, 2)
    for m in data:  # the per-call cost hidden by a machine that got faster at 8 B
        if m["bytes"] == 8:
            m["seconds"] *= 0.1
    got = fit(data, 2, 1, 2)
    assert all(v >= 0 for v in tuning.as_dict(got).values())


def test_load_defaults_and_a_file(tmp_path, environ):
    environ.unset("RINGMPI_TUNING")
    assert tuning.load() == D
    assert tuning.load(8) == tuning.defaults(8)
    path = tmp_path / "t.json"
    costs = dataclasses.replace(D, alpha=9e-6)
    path.write_text(json.dumps({"costs": tuning.as_dict(costs), "measured": []}))
    environ.set("RINGMPI_TUNING", str(path))
    assert tuning.load() == costs
    assert tuning.load(8) == costs  # a file holds whatever layout it was measured on
    # a file from before shared_memory: its constants, the defaults for the new ones
    older = {k: v for k, v in tuning.as_dict(costs).items() if not k.startswith("shm_")}
    path.write_text(json.dumps({"costs": older, "measured": []}))
    assert tuning.load(16) == dataclasses.replace(
        costs, shm_wait=tuning.CROWDED.shm_wait, shm_byte=tuning.CROWDED.shm_byte
    )


def test_load_names_a_missing_or_bad_file(tmp_path, environ):
    environ.set("RINGMPI_TUNING", str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match=r"RINGMPI_TUNING: cannot read .*nope\.json"):
        tuning.load()
    bad = tmp_path / "bad.json"
    bad.write_text('{"costs": {"alpha": 1}}')
    environ.set("RINGMPI_TUNING", str(bad))
    with pytest.raises(ValueError, match=r"bad\.json' is not a tuning file"):
        tuning.load()


def test_the_trials_count_each_candidates_calls_and_a_second_round():
    from ringmpi.algorithms import tuner

    # 4 candidates at 8 B: an untimed and 30 timed calls each, then 2 x 30
    assert tuner.most_trial_calls(8) == 4 * 31 + 60
    assert tuner.most_trial_calls(64 << 20, 2) == 2 * 6 + 10
    assert tuner.gap_most(1.0) == tuner.GAP_MOST and tuner.gap_most(0.0) == tuner.GAP_MOST


def test_the_hosts_evidence_is_per_byte_per_layout_and_from_calibrated_from(monkeypatch):
    from ringmpi import _settings
    from ringmpi.algorithms import tuner

    class Ctx:
        size = 2

        def nodes(self, settings):
            return 1, 2

    n = tuner.CALIBRATED_FROM
    monkeypatch.setattr(tuner, "_measured", {(2, 1, 2): {"ring": 2e-10, "mpi": 4e-10}})
    now = _settings.current()
    assert tuner.measured(Ctx(), now, ["mpi", "ring"], 4 * n) == {
        "mpi": 4e-10 * 4 * n,
        "ring": 2e-10 * 4 * n,
    }
    assert tuner.measured(Ctx(), now, ["ring"], n - 1) is None  # below: the model's
    assert tuner.measured(Ctx(), now, ["ring", "chain"], n) is None  # one not measured
    Ctx.size = 4
    assert tuner.measured(Ctx(), now, ["ring"], n) is None  # another layout
