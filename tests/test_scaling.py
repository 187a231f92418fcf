"""python -m ringmpi scaling: the cost model beyond one machine (this file runs without MPI)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from test_cli import _mpirun

from ringmpi import algorithms, tuning
from ringmpi.tools import scaling

PY = sys.executable
FAB = scaling.Fabric(alpha=20e-6, beta=1e-9)


@pytest.mark.parametrize("algorithm", scaling.ALGORITHMS)
@pytest.mark.parametrize("nodes", [1, 2, 8, 512])
@pytest.mark.parametrize("n", [8, 1 << 16, 1 << 28])
def test_prediction_is_tunings(algorithm, nodes, n):
    per_node = 8
    costs = scaling.costs_for(nodes, per_node, FAB)
    p = nodes * per_node
    want = algorithms.predict(costs, algorithm, n, p, nodes, per_node)
    assert scaling.predict(costs, algorithm, n, nodes, per_node) == want
    row = next(r for r in scaling.predict_grid(FAB, nodes=[nodes], sizes=[n]))
    assert row[algorithm]["seconds"] == want
    assert row["ranks"] == p
    assert row[algorithm]["busbw"] == pytest.approx(n / want * 2 * (p - 1) / p)


def test_costs_for_takes_alpha_beta_from_the_fabric_only_across_nodes():
    node = tuning.defaults(8)
    assert scaling.costs_for(1, 8, FAB) == node
    across = scaling.costs_for(4, 8, FAB)
    assert (across.alpha, across.beta) == (FAB.alpha, FAB.beta)
    assert dataclasses.replace(across, alpha=node.alpha, beta=node.beta) == node


def test_hierarchical_beats_the_flat_ring_at_8_bytes_on_512_nodes():
    row = scaling.predict_grid(FAB, nodes=[512], sizes=[8])[0]
    assert row["hierarchical"]["seconds"] < row["ring"]["seconds"]
    # latency terms: 2(M-1) against 2(N-1) steps
    assert row["ring"]["seconds"] / row["hierarchical"]["seconds"] > 4
    assert row["best"] == "recursive_doubling"  # lg N steps beat both at 8 bytes


def test_ring_busbw_tends_to_a_constant_and_times_grow_with_nodes():
    rows = scaling.predict_grid(FAB, nodes=[8, 64, 512], sizes=[1 << 34])
    bw = [r["ring"]["busbw"] for r in rows]
    # 2(N-1)/N n beta dominates: busbw near 1/(beta + gamma/2), whatever N
    limit = 1 / (FAB.beta + tuning.defaults(8).gamma / 2)
    assert all(b == pytest.approx(limit, rel=0.02) for b in bw)
    for a in scaling.ALGORITHMS:
        t = [r[a]["seconds"] for r in rows]
        assert t == sorted(t)
    # recursive doubling moves lg N times the buffer: its busbw falls with N
    rd = [r["recursive_doubling"]["busbw"] for r in rows]
    assert rd == sorted(rd, reverse=True)


def test_shared_nic_costs_hierarchical_l_times_the_rail_bytes():
    costs = scaling.costs_for(4, 8, FAB)
    n = 1 << 24
    own = scaling.predict(costs, "hierarchical", n, 4, 8)
    shared = scaling.predict(costs, "hierarchical", n, 4, 8, shared_nic=True)
    rail = 2 * (n / 8) * 3 / 4
    assert shared - own == pytest.approx(rail * FAB.beta * 7)
    assert scaling.predict(costs, "ring", n, 4, 8, shared_nic=True) == scaling.predict(
        costs, "ring", n, 4, 8
    )


def test_fit_fabric_recovers_a_line():
    sizes = [8 << (2 * i) for i in range(11)]
    fab = scaling.fit_fabric([(n, 15e-6 + n * 0.8e-9) for n in sizes])
    assert fab.alpha == pytest.approx(15e-6, rel=1e-3)
    assert fab.beta == pytest.approx(0.8e-9, rel=1e-6)


def test_markdown_table(capsys):
    assert scaling.main(["--markdown", "--alpha", "2e-5", "--beta", "1e-9"]) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith("|")]
    assert lines[0].startswith("| size | nodes x ranks | N | ring time |")
    assert lines[1].startswith("|---|")
    assert len(lines) == 2 + len(scaling.SIZES) * len(scaling.NODES)
    assert "| 8 B | 512 x 8 | 4096 |" in out
    assert all(line.count("|") == lines[0].count("|") for line in lines)


@pytest.mark.family
def test_plot_or_a_clear_error(tmp_path, capsys):
    out = tmp_path / "s.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        with pytest.raises(SystemExit):
            scaling.main(["--plot", str(out)])
        assert "needs matplotlib" in capsys.readouterr().err
        return
    assert scaling.main(["--plot", str(out)]) == 0
    assert out.stat().st_size > 10_000


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A real CLI run at 2 ranks (one node), as tests/test_cli.py makes them."""
    out = tmp_path_factory.mktemp("scaling") / "run.json"
    cmd = [*_mpirun(), "-n", "2", PY, "-m", "ringmpi.allreduce", "-b", "8", "-e", "64K", "-f",
           "64", "-n", "3", "-w", "1", "-a", "ring,recursive_doubling,hierarchical,mpi",
           "--json", str(out)]  # fmt: skip
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr
    return out


@pytest.mark.family
def test_check_compares_every_modelled_row(measured, capsys):
    run = json.loads(measured.read_text())
    checked = scaling.check([run], FAB)
    modelled = [r for r in run["rows"] if r["algorithm"] in scaling.ALGORITHMS]
    assert len(checked) == len(modelled) == 3 * 3  # 8 B, 512 B, 32 KiB; mpi left out
    for c, r in zip(checked, modelled, strict=True):
        assert (c["nodes"], c["per_node"], c["ranks"]) == (1, 2, 2)
        # one node: the node's own constants, not the fabric's
        want = algorithms.predict(tuning.defaults(2), r["algorithm"], r["size"], 2, 1, 2)
        assert c["predicted"] == want
        assert c["ratio"] == pytest.approx(r["time_us"] * 1e-6 / want)
    assert scaling.main(["--check", str(measured), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| nodes x ranks | size | algorithm | predicted | measured | measured/predicted |" in out
    assert "| 1 x 2 | 32 KiB | recursive_doubling |" in out
    assert "# 9 points, measured/predicted from" in out


def test_check_reads_nodes_from_the_header():
    run = {"header": {"ranks": 8, "nodes": 4, "emulated_ranks_per_node": None},
           "rows": [{"algorithm": "auto(hierarchical)", "size": 1 << 20, "time_us": 1000.0},
                    {"algorithm": "mpi", "size": 1 << 20, "time_us": 900.0}]}  # fmt: skip
    (c,) = scaling.check([run], FAB)
    costs = scaling.costs_for(4, 2, FAB)
    assert (c["nodes"], c["per_node"]) == (4, 2)
    assert c["predicted"] == algorithms.predict(costs, "hierarchical", 1 << 20, 8, 4, 2)


def test_check_refuses_uneven_nodes():
    run = {"header": {"ranks": 5, "nodes": 2, "emulated_ranks_per_node": None},
           "rows": [{"algorithm": "ring", "size": 8, "time_us": 10.0}]}  # fmt: skip
    with pytest.raises(ValueError, match="uneven"):
        scaling.check([run], FAB)


def test_a_tuning_file_gives_the_node_constants(tmp_path, capsys):
    import dataclasses
    import json

    from ringmpi.tools import scaling

    given = {f.name: getattr(tuning.DEFAULTS, f.name) for f in dataclasses.fields(tuning.Costs)
             if f.name != "extra"}  # fmt: skip
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"costs": given}))
    assert scaling.main(["--tuning", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"in-node: {path}" in out and "8 x 8" in out
