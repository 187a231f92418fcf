"""``python -m ringmpi.allreduce`` run for real under mpirun (this file itself runs without MPI)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from conftest import auto_choice

from ringmpi import algorithms, tuning
from ringmpi.schedule import chunk_bounds
from ringmpi.tools import reliability

PY = sys.executable


def _mpirun() -> list[str]:
    """The launcher beside the interpreter, with Open MPI's flags (ringmpi.tools.reliability's)."""
    try:
        return reliability.mpirun()
    except FileNotFoundError:
        pytest.skip("no mpirun")


def run(nranks: int, *args: str, env: dict | None = None, timeout: float = 240):
    cmd = [*_mpirun(), "-n", str(nranks), PY, "-m", "ringmpi.allreduce", *args]
    full_env = {**os.environ, "NUMBA_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)


def ring_bytes_ratio(nranks: int, count: int) -> float:
    """Closed form: the most any rank sends, as a multiple of the buffer."""
    if nranks == 1:
        return 0.0
    b = chunk_bounds(count, nranks)
    size = [b[c + 1] - b[c] for c in range(nranks)]
    most = max(2 * count - size[(r + 1) % nranks] - size[(r + 2) % nranks] for r in range(nranks))
    return most / count


@pytest.mark.family  # it starts mpirun
@pytest.mark.parametrize("nranks", [1, 2, 3])
def test_sweep_verifies_and_counts(tmp_path, nranks):
    out = tmp_path / "r.json"
    p = run(nranks, "-b", "8", "-e", "1M", "-f", "32", "-n", "3", "-w", "1", "-a", "ring,mpi",
            "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert f"# ranks {nranks}, nodes 1" in p.stdout
    assert "# MPI: " in p.stdout and "numba" in p.stdout
    assert "first-call compile (or cache load) of the sum on float32 kernel" in p.stdout
    assert "# wrong elements in total: 0" in p.stdout
    data = json.loads(out.read_text())
    assert data["header"]["ranks"] == nranks
    rows = data["rows"]
    assert [(r["size"], r["algorithm"]) for r in rows] == [
        (s, a) for s in (8, 256, 8192, 262144) for a in ("ring", "mpi")
    ]
    for r in rows:
        assert r["wrong"] == 0 and r["count"] == r["size"] // 4 and r["time_us"] > 0
        if r["algorithm"] == "ring":
            assert r["steps"] == 2 * (nranks - 1)
            assert r["bytes_per_rank"] == pytest.approx(ring_bytes_ratio(nranks, r["count"]))
        else:  # the MPI baseline's traffic is not ringmpi's to count
            assert r["bytes_per_rank"] is None and r["steps"] is None
        factor = 2 * (nranks - 1) / nranks
        assert r["busbw_GBs"] == pytest.approx(r["algbw_GBs"] * factor)


@pytest.mark.family  # it starts mpirun
def test_auto_other_types_and_ops(tmp_path):
    out = tmp_path / "r.json"
    p = run(3, "-d", "float64", "-o", "max", "-a", "auto,ring,mpi", "-b", "24", "-e", "24K",
            "-f", "1024", "-n", "2", "-w", "0", "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["rows"]
    chosen = [auto_choice(tuning.defaults(3), n, 3, 1, 3) for n in (24, 24 << 10)]
    assert [r["algorithm"] for r in rows] == [f"auto({chosen[0]})", "ring", "mpi",
                                              f"auto({chosen[1]})", "ring", "mpi"]  # fmt: skip
    assert all(r["wrong"] == 0 and r["type"] == "float64" and r["redop"] == "max" for r in rows)
    # 24 B is 3 float64: one per rank; 24 KiB is 3072: even chunks, 2(N-1)/N exactly.
    assert rows[1]["bytes_per_rank"] == pytest.approx(4 / 3)
    assert rows[4]["bytes_per_rank"] == pytest.approx(4 / 3)


@pytest.mark.family  # it starts mpirun
def test_all_runs_every_algorithm_and_plots(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    p = run(2, "-a", "all", "-b", "8", "-e", "64K", "-f", "8192", "-n", "2", "-w", "0",
            "--json", str(out), "--plot", str(png))  # fmt: skip
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["rows"]
    names = ["ring", "recursive_doubling", "rabenseifner", "hierarchical", "shared_memory",
             "mpi", "mpi4py"]  # fmt: skip
    for size, group in ((8, rows[:8]), (65536, rows[8:])):
        auto = f"auto({auto_choice(tuning.DEFAULTS, size, 2, 1, 2)})"
        assert [r["algorithm"] for r in group] == [auto, *names]
        assert all(r["wrong"] == 0 and r["size"] == size for r in group)
        steps = {r["algorithm"]: r["steps"] for r in group}
        # 2 ranks: one swap for recursive doubling, two steps for the ring and
        # Rabenseifner, no message for hierarchical and shared_memory on one node
        assert (steps["recursive_doubling"], steps["ring"], steps["rabenseifner"]) == (1, 2, 2)
        assert steps["hierarchical"] == steps["shared_memory"] == 0
        assert steps["mpi"] is None and steps["mpi4py"] is None
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"# plot written to {png}" in p.stdout


@pytest.mark.family  # it starts mpirun
def test_a_tuning_file_from_tune_drives_auto(tmp_path):
    tuned = tmp_path / "t.json"
    cmd = [*_mpirun(), "-n", "2", PY, "-m", "ringmpi", "tune", "-b", "8", "-e", "64K", "-f", "64",
           "-n", "3", "--budget", "0.2", "-o", str(tuned)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "NUMBA_NUM_THREADS": "1"})  # fmt: skip
    assert p.returncode == 0, p.stderr
    data = json.loads(tuned.read_text())
    assert data["layout"] == {"ranks": 2, "nodes": 1, "ranks_per_node": 2}
    assert {(m["algorithm"], m["bytes"]) for m in data["measured"]} == {
        (a, n) for a in (*algorithms.candidates(), "mpi") for n in (8, 512, 32768)
    }
    assert all(v >= 0 for v in data["costs"].values())
    out = tmp_path / "r.json"
    p = run(2, "-a", "auto", "-b", "8", "-e", "8", "-n", "2", "--json", str(out),
            env={"RINGMPI_TUNING": str(tuned)})  # fmt: skip
    assert p.returncode == 0, p.stderr
    costs = tuning.Costs(**data["costs"])
    [row] = json.loads(out.read_text())["rows"]
    assert row["algorithm"] == f"auto({auto_choice(costs, 8, 2, 1, 2)})" and row["wrong"] == 0


@pytest.mark.family  # it starts mpirun
def test_the_dispatcher_runs_the_same_benchmark():
    cmd = [*_mpirun(), "-n", "2", PY, "-m", "ringmpi", "allreduce", "-b", "1K", "-e", "1K",
           "-n", "1", "-w", "0", "-a", "ring"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "NUMBA_NUM_THREADS": "1"})  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "# ranks 2, nodes 1" in p.stdout and "# wrong elements in total: 0" in p.stdout


@pytest.mark.family  # it starts mpirun
def test_unchecked_run_reports_no_wrong_count():
    p = run(2, "-c", "0", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0")
    assert p.returncode == 0, p.stderr
    assert " N/A " in p.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "max", "-d", "complex64"], "MPI.MAX is not defined for dtype complex64"),
        # it starts mpirun: one case under every family
        pytest.param(["-a", "ring,bogus"], "unknown name 'bogus'", marks=pytest.mark.family),
        (["-o", "mean"], "unknown name 'mean'"),
        (["-e", "lots"], "not a size"),
        (["-a", "ring:cached"], "only hierarchical takes a variant"),
        (["-a", "mpi4py", "-o", "avg"], "mpi4py (MPI's own Allreduce) has no AVG"),
        (["-a", "hierarchical:fast"], "one of auto, cached, streaming"),
    ],
)
def test_bad_arguments_end_the_job(args, message):
    t0 = time.monotonic()
    p = run(2, *args, timeout=120)
    assert p.returncode != 0
    assert message in p.stderr
    assert time.monotonic() - t0 < 60


@pytest.mark.family  # it starts mpirun
def test_a_bad_tuning_file_ends_the_job_before_it_starts(tmp_path):
    p = run(2, "-b", "8", "-e", "8", env={"RINGMPI_TUNING": str(tmp_path / "none.json")})
    assert p.returncode == 2
    assert "RINGMPI_TUNING: cannot read" in p.stderr and "none.json" in p.stderr


@pytest.mark.family  # it starts mpirun
def test_an_exception_on_one_rank_aborts_the_whole_job():
    # MPMD: rank 0 gets a bad RINGMPI_ALGORITHM and raises inside the sweep, while
    # rank 1 is already waiting in the collective; the job must end, not hang.
    cmd = [*_mpirun(), "-n", "1", "env", "RINGMPI_ALGORITHM=bogus", PY, "-m", "ringmpi.allreduce",
           "-a", "auto", ":", "-n", "1", PY, "-m", "ringmpi.allreduce", "-a", "auto"]  # fmt: skip
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    assert "rank 0 failed, aborting the job" in p.stderr
    assert "unknown name 'bogus'" in p.stderr
    assert time.monotonic() - t0 < 60


@pytest.mark.family  # MPI in this process
def test_wrong_results_give_a_nonzero_exit(monkeypatch, capsys):
    # One process (N = 1, no mpirun): make the reference disagree with the result in
    # the first element of its period, and the CLI must count it and fail.
    from ringmpi import verify
    from ringmpi.tools import allreduce as cli

    real = verify.verify_expected

    def off_by_one(*args):
        expected = real(*args).copy()
        expected[0] += 1
        return expected

    monkeypatch.setattr(verify, "verify_expected", off_by_one)
    # 64 B of float32: 16 elements, two periods of 8, so two are wrong.
    assert cli.main(["-b", "64", "-e", "64", "-n", "1", "-w", "0", "-a", "ring"]) == 1
    out = capsys.readouterr().out
    assert "# wrong elements in total: 2" in out


@pytest.mark.family  # it starts mpirun
@pytest.mark.parametrize("placement", ["block", "cyclic"])
def test_hierarchical_rows_count_inter_node_traffic(tmp_path, placement):
    # 4 ranks as 2 emulated nodes of 2: each rank rings half the buffer with one peer,
    # so it sends 2(M-1)/M of D/L = 0.5 D in 2(M-1) = 2 inter-node steps.
    out = tmp_path / "r.json"
    p = run(4, "-a", "hierarchical,ring", "-b", "64K", "-e", "64K", "-n", "2", "-w", "0",
            "--ranks-per-node", "2", "--node-placement", placement, "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert f"emulated nodes of 2 ranks, {placement} placement" in p.stdout
    data = json.loads(out.read_text())
    assert data["header"]["emulated_ranks_per_node"] == 2
    hier, ring = data["rows"]
    assert (hier["algorithm"], hier["wrong"], hier["steps"]) == ("hierarchical", 0, 2)
    assert hier["bytes_per_rank"] == pytest.approx(0.5)
    assert (ring["steps"], ring["bytes_per_rank"]) == (6, pytest.approx(1.5))
    # the size's two copy bandwidths, measured once and shown on each of its rows
    for key in ("copy_GBs", "stream_GBs"):
        assert hier[key] > 0 and hier[key] == ring[key]


@pytest.mark.family  # it starts mpirun
def test_both_ways_of_storing_in_one_launch(tmp_path):
    # hierarchical:WAY rows run with RINGMPI_WINDOW_STORES set for their calls only;
    # 2 MiB at 4 ranks in nodes of 2 takes the cached, the streaming and (auto) the
    # timed paths, every one verified.
    out = tmp_path / "r.json"
    p = run(4, "-a", "hierarchical:cached,hierarchical:streaming,hierarchical", "-b", "2M",
            "-e", "2M", "-n", "3", "-w", "8", "--budget", "0", "--ranks-per-node", "2",
            "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["algorithm"] for r in rows] == [
        "hierarchical:cached", "hierarchical:streaming", "hierarchical",
    ]  # fmt: skip
    assert all(r["wrong"] == 0 and r["steps"] == 2 for r in rows)
    # The auto row says which way its node last settled on, and each way's fastest
    # trial (the first call and 8 warm-ups, whatever --budget would allow, cover the
    # trials: a first call of each way, then 3 timed; trials that start over later
    # leave the last choice standing); the rows of a forced way say nothing.
    assert "window" not in rows[0] and "window" not in rows[1]
    said = re.fullmatch(r"window stores: (cached|streaming) \(fastest trial call: "
                        r"cached (\d+) us, streaming (\d+) us\)", rows[2]["window"])  # fmt: skip
    assert said, rows[2]["window"]
    if said[2] != said[3]:  # (equal once rounded to microseconds: either may be chosen)
        assert said[1] == ("cached" if int(said[2]) < int(said[3]) else "streaming")
    assert f"#   {rows[2]['window']}" in p.stdout


@pytest.mark.family  # it starts mpirun
def test_bad_node_settings_end_the_job():
    p = run(2, "--ranks-per-node", "0", timeout=120)
    assert p.returncode == 2
    assert "ranks_per_node must be a whole number >= 1" in p.stderr


_NO_THREADS = """
import warnings, numpy as np
from mpi4py import MPI
import ringmpi
x = np.full(4, MPI.COMM_WORLD.Get_rank() + 1.0)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    req = ringmpi.Iallreduce(MPI.IN_PLACE, x)
    avg = np.full(2, MPI.COMM_WORLD.Get_rank() + 1.0)
    ringmpi.Iallreduce(MPI.IN_PLACE, avg, op=ringmpi.AVG).Wait()  # MPI has no AVG
req.Wait()
if MPI.COMM_WORLD.Get_rank() == 0:
    print(type(req).__name__, x.tolist(), avg.tolist(), [str(m.message)[:36] for m in w])
"""


@pytest.mark.family  # it starts mpirun
def test_iallreduce_without_thread_multiple_falls_back_with_a_warning():
    cmd = [*_mpirun(), "-n", "2", PY, "-c", _NO_THREADS]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "MPI4PY_RC_THREAD_LEVEL": "serialized"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    want = "Request [3.0, 3.0, 3.0, 3.0] [1.5, 1.5] ['ringmpi: MPI was initialized without']"
    assert out.stdout.strip().splitlines()[-1:] == [want], out.stdout + out.stderr


@pytest.mark.family  # it starts mpirun
@pytest.mark.parametrize("command", ["reduce_scatter", "allgather"])
def test_the_halves_benchmark_verifies_and_counts(command):
    cmd = [*_mpirun(), "-n", "2", PY, "-m", "ringmpi", command, "-b", "8", "-e", "256K", "-f",
           "64", "-n", "2", "-w", "2", "-a", "ring,shared_memory,mpi4py"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "NUMBA_NUM_THREADS": "1"})  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if not line.startswith("#")]
    assert [(r[0], r[2]) for r in rows] == [(s, a) for s in ("8", "512", "32K")
                                           for a in ("ring", "shared_memory", "mpi4py")]  # fmt: skip
    for _size, count, algorithm, *_, wrong, sent, steps in rows:
        assert wrong == "0", rows
        # the ring: every chunk but one, (N-1)/N of the buffer, in N-1 steps; shared memory
        # sends nothing; mpi4py untraced
        want = (str(int(count) * 4 // 2), "1") if algorithm == "ring" else ("0", "0")
        assert (sent, steps) == want, rows
