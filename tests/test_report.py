"""``python -m ringmpi report`` on JSON written by real runs of the command line
(started under mpirun here, as tests/test_cli.py does; no Slurm needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ringmpi.tools import reliability, report

pytestmark = pytest.mark.family  # the tests here start mpirun

PY = sys.executable
SWEEP = ["-b", "8", "-e", "4K", "-f", "64", "-n", "2", "-w", "0"]


def run(nranks: int, *args: str) -> subprocess.CompletedProcess:
    """The command line under the environment's mpirun (MPICH's or Open MPI's)."""
    try:
        launcher = reliability.mpirun()
    except FileNotFoundError:
        pytest.skip("no mpirun")
    cmd = [*launcher, "-n", str(nranks), PY, "-m", "ringmpi.allreduce", *args]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Two real runs: 2 ranks flat (ring, mpi), and 2 ranks as 2 emulated nodes of one
    (hierarchical, ring), the second stamped with a job as the jobs/ scripts do."""
    work = tmp_path_factory.mktemp("report")
    flat, nodes = work / "flat.json", work / "nodes.json"
    p = run(2, *SWEEP, "-a", "ring,mpi", "--json", str(flat))
    assert p.returncode == 0, p.stderr
    p = run(2, *SWEEP, "-a", "hierarchical,ring", "--ranks-per-node", "1", "--json", str(nodes))
    assert p.returncode == 0, p.stderr
    data = json.loads(nodes.read_text())
    data["header"]["job"] = {"id": "42", "script": "multi-node", "host": "node7",
                             "commit": "abc1234", "launcher": "srun"}  # fmt: skip
    nodes.write_text(json.dumps(data))
    return flat, nodes


def test_merge_sorts_and_labels(results):
    flat, nodes = results
    lines = report.merge([flat, nodes])
    assert len(lines) == 2 * 2 + 2 * 2  # two sizes (8 B and 512 B) x two algorithms, twice
    assert [x.size for x in lines] == sorted(x.size for x in lines)
    by = {(x.source.endswith("nodes.json"), x.size, x.algorithm): x for x in lines}
    hier = by[True, 512, "hierarchical"]
    # 512 B across 2 emulated nodes: recursive doubling's one step (the ring would take 2)
    assert (hier.ranks, hier.nodes, hier.emulated, hier.steps) == (2, 2, True, 1)
    assert (hier.run, hier.host, hier.commit) == ("42 multi-node", "node7", "abc1234")
    ring = by[False, 512, "ring"]
    assert (ring.nodes, ring.emulated, ring.steps, ring.run, ring.host) == (
        1, False, 2, "flat", "-")  # fmt: skip
    assert by[False, 8, "mpi"].steps is None
    assert all(x.wrong == 0 for x in lines)


def test_text_and_markdown(results):
    lines = report.merge(list(results))
    text = report.render(lines)
    assert text.splitlines()[0].split()[:4] == ["size", "algorithm", "ranks", "nodes"]
    assert "nodes*: emulated" in text
    md = report.render(lines, markdown=True)
    assert md.startswith("| size | algorithm | ranks | nodes | time(us) | busbw(GB/s) |")
    assert "| 512 | hierarchical | 2 | 2* |" in md
    assert "| 42 multi-node | node7 | abc1234 |" in md


def test_command_line_and_plot(results, tmp_path):
    out = tmp_path / "merged.png"
    p = subprocess.run([PY, "-m", "ringmpi", "report", *map(str, results), "--plot", str(out)],
                       capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "# 8 rows from 2 file(s); wrong elements in total: 0" in p.stdout
    assert out.stat().st_size > 10_000


def test_wrong_elements_fail(results, tmp_path):
    data = json.loads(results[0].read_text())
    data["rows"][0]["wrong"] = 3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    p = subprocess.run([PY, "-m", "ringmpi", "report", str(bad)], capture_output=True, text=True)
    assert p.returncode == 1 and "wrong elements in total: 3" in p.stdout


@pytest.mark.parametrize("text", ["{}", "not json", '{"header": {}, "rows": []}'])
def test_not_a_result(tmp_path, text):
    path = tmp_path / "x.json"
    path.write_text(text)
    p = subprocess.run([PY, "-m", "ringmpi", "report", str(path)], capture_output=True, text=True)
    assert p.returncode == 2
    assert "not a result of python -m ringmpi.allreduce --json" in p.stderr


def test_plot_without_matplotlib(results, tmp_path):
    # A None entry in sys.modules makes the import fail, as when it is not installed.
    code = ("import sys; sys.modules['matplotlib'] = None; from ringmpi.tools.report import main; "
            f"raise SystemExit(main([{str(results[0])!r}, '--plot', 'x.png']))")  # fmt: skip
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 2
    assert "--plot needs matplotlib: pip install 'ringmpi[plot]'" in p.stderr
    assert not (tmp_path / "x.png").exists()


def _result(path, library, rows):
    header = {"ranks": 2, "nodes": 1, "mpi_library": library}
    path.write_text(json.dumps({"header": header, "rows": [
        {"size": s, "algorithm": a, "time_us": t, "busbw_GBs": 0.0, "wrong": 0, "steps": None}
        for s, a, t in rows
    ]}))  # fmt: skip
    return path


def test_versus_sets_auto_against_each_library(tmp_path, capsys):
    a = _result(tmp_path / "a.json", "MPICH Version:      5.0.2",
                [(8, "auto(shared_memory)", 3.0), (8, "mpi4py", 6.0),
                 (1024, "auto(ring)", 9.0), (1024, "mpi4py", 6.0)])  # fmt: skip
    b = _result(tmp_path / "b.json", "Open MPI v5.0.11, package: Open MPI",
                [(8, "auto(shared_memory)", 2.0), (8, "mpi", 1.0)])  # fmt: skip
    png = tmp_path / "v.png"
    assert report.main(["--versus", str(a), str(b), "--markdown", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert (
        "| size | MPICH (us) | auto (us) | auto / lib | Open MPI (us) | auto (us) | auto / lib |"
        in out
    )
    assert "| 8 | 6.0 | 3.0 shared_memory | 0.50 | 1.0 | 2.0 shared_memory | 2.00 |" in out
    assert "| 1K | 6.0 | 9.0 ring | 1.50 | - | - | - |" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):  # no baseline rows
        report.main(["--versus", str(_result(tmp_path / "c.json", "MPICH", [(8, "ring", 1.0)]))])
