"""The cost model auto chooses by, its tuning file, and the fit python -m ringmpi.tune does."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ringmpi import tuning
from ringmpi.tune import fit

D = tuning.DEFAULTS


def test_terms_are_the_closed_forms():
    assert tuning.terms("ring", 100, 4) == {"call": 1, "alpha": 6, "beta": 150, "gamma": 75}
    assert tuning.terms("recursive_doubling", 100, 8) == {
        "call": 1, "alpha": 3, "beta": 300, "gamma": 300,
    }  # fmt: skip
    # 6 ranks: p' = 4 run the plan, 2 fold in and out (2 steps, the buffer twice more)
    assert tuning.terms("rabenseifner", 100, 6) == {
        "call": 1, "alpha": 4 + 2, "beta": 150 + 200, "gamma": 75 + 100,
    }  # fmt: skip
    assert tuning.terms("ring", 100, 1) == {"call": 1}


def test_hierarchical_terms_count_pipeline_steps_and_the_ring_across_nodes():
    one = tuning.terms("hierarchical", 5 << 20, 4, nodes=1, per_node=4)
    assert one == {"node_call": 1, "node_step": 3 + 2, "node_byte": 5 << 20}
    two = tuning.terms("hierarchical", 4 << 20, 8, nodes=2, per_node=4)
    ring = tuning.terms("ring", 1 << 20, 2)  # each rail rings n/L over the M nodes
    assert two == {"node_call": 1, "node_step": 2 * (2 + 1), "node_byte": 4 << 20,
                   "alpha": ring["alpha"], "beta": ring["beta"], "gamma": ring["gamma"]}  # fmt: skip


def test_defaults_choose_latency_small_and_shared_memory_large():
    assert tuning.choose(D, 8, 2, 1, 2) == "recursive_doubling"
    assert tuning.choose(D, 8, 64, 1, 64) == "recursive_doubling"
    assert tuning.choose(D, 64 << 20, 2, 1, 2) == "hierarchical"
    # one rank per node: no shared memory to use, the ring's bandwidth wins
    assert tuning.choose(D, 64 << 20, 8, 8, 1) in ("ring", "rabenseifner")


def test_choice_is_the_smallest_prediction():
    for n in (8, 4096, 1 << 20, 64 << 20):
        for p in (2, 3, 8, 17):
            best = min(tuning.predict(D, a, n, p, 1, p) for a in tuning.CANDIDATES)
            assert tuning.predict(D, tuning.choose(D, n, p, 1, p), n, p, 1, p) == best


def _measured(costs, p, nodes, per_node):
    return [
        {"algorithm": a, "bytes": n, "seconds": tuning.predict(costs, a, n, p, nodes, per_node)}
        for a in tuning.CANDIDATES
        for n in (8, 512, 32768, 1 << 20, 8 << 20, 64 << 20)
    ]


@pytest.mark.parametrize(("p", "nodes", "per_node"), [(2, 1, 2), (8, 2, 4), (5, 1, 5)])
def test_fit_recovers_the_constants_that_made_the_data(p, nodes, per_node):
    known = tuning.Costs(alpha=2e-6, beta=3e-10, gamma=5e-11, call=6e-6, node_call=30e-6,
                         node_step=5e-6, node_byte=2e-10)  # fmt: skip
    got = fit(_measured(known, p, nodes, per_node), p, nodes, per_node)
    for f in dataclasses.fields(tuning.Costs):
        assert getattr(got, f.name) == pytest.approx(getattr(known, f.name), rel=1e-6), f.name


def test_fit_keeps_constants_non_negative():
    data = _measured(D, 2, 1, 2)
    for m in data:  # the per-call cost hidden by a machine that got faster at 8 B
        if m["bytes"] == 8:
            m["seconds"] *= 0.1
    got = fit(data, 2, 1, 2)
    assert all(v >= 0 for v in dataclasses.asdict(got).values())


def test_load_defaults_and_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv("RINGMPI_TUNING", raising=False)
    assert tuning.load() == D
    path = tmp_path / "t.json"
    costs = dataclasses.replace(D, alpha=9e-6)
    path.write_text(json.dumps({"costs": dataclasses.asdict(costs), "measured": []}))
    monkeypatch.setenv("RINGMPI_TUNING", str(path))
    assert tuning.load() == costs


def test_load_names_a_missing_or_bad_file(tmp_path, monkeypatch):
    monkeypatch.setenv("RINGMPI_TUNING", str(tmp_path / "nope.json"))
    with pytest.raises(ValueError, match=r"RINGMPI_TUNING: cannot read .*nope\.json"):
        tuning.load()
    bad = tmp_path / "bad.json"
    bad.write_text('{"costs": {"alpha": 1}}')
    monkeypatch.setenv("RINGMPI_TUNING", str(bad))
    with pytest.raises(ValueError, match=r"bad\.json' is not a tuning file"):
        tuning.load()
