"""``python -m ringmpi.allreduce`` run for real under mpirun (this file itself runs without MPI)."""

from __future__ import annotations

import json
import os
import re
import resource
import socket
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
def test_off_cache_rotates_over_enough_buffers_and_stays_exact(tmp_path):
    out = tmp_path / "r.json"
    p = run(2, "-b", "64K", "-e", "1M", "-f", "16", "-n", "4", "-w", "1", "-a", "ring,mpi",
            "--off-cache", "1M", "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "# wrong elements in total: 0" in p.stdout
    # twice 1 MiB over 2 ranks' 64 KiB send and receive buffers: 8 sets; at 1 MiB one
    assert "# 64K: copy" in p.stdout and "; 8 sets of buffers, 2 MiB on the node" in p.stdout
    assert "; 1 set of buffers, 4 MiB on the node" in p.stdout
    data = json.loads(out.read_text())
    assert data["header"]["off_cache_bytes"] == 1 << 20
    assert [(r["size"], r["algorithm"], r["buffer_sets"], r["wrong"]) for r in data["rows"]] == [
        (65536, "ring", 8, 0), (65536, "mpi", 8, 0), (1 << 20, "ring", 1, 0), (1 << 20, "mpi", 1, 0)
    ]  # fmt: skip
    assert [r["steps"] for r in data["rows"] if r["algorithm"] == "ring"] == [2, 2]
    for r in data["rows"]:  # every input read once, every result written once, 2 ranks
        floor = 2 * r["size"] * 2 / (r["stream_GBs"] * 1e9) * 1e6
        assert r["floor_us"] == (None if r["size"] < 1 << 20 else pytest.approx(floor))


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
        (["--off-cache", "12"], "--off-cache 12: 12 B is no cache"),
        (["--off-cache", "lots"], "not a size"),
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
def test_ranks_that_disagree_on_the_settings_stop_together():
    # MPMD: rank 0 alone gets a bad RINGMPI_ALGORITHM; every rank must stop, not
    # rank 1 wait for rank 0 in the sweep.
    cmd = [*_mpirun(), "-n", "1", "env", "RINGMPI_ALGORITHM=bogus", PY, "-m", "ringmpi.allreduce",
           "-a", "auto", ":", "-n", "1", PY, "-m", "ringmpi.allreduce", "-a", "auto"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "error: rank 0: RINGMPI_ALGORITHM: unknown name 'bogus'" in p.stderr
    assert p.stdout == ""


@pytest.mark.family  # it starts mpirun
def test_an_exception_on_one_rank_aborts_the_whole_job():
    # MPMD: the ranks disagree on the dtype, which passes every rank's own checks; the
    # ring's first message tells them (or --timeout would), and they raise inside the
    # sweep: the job must end, not hang.
    args = ["-a", "ring", "-b", "64", "-e", "64", "-n", "1", "--timeout", "5"]
    cmd = [*_mpirun(), "-n", "1", PY, "-m", "ringmpi.allreduce", *args, "-d", "float64", ":",
           "-n", "1", PY, "-m", "ringmpi.allreduce", *args, "-d", "float32"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NUMBA_NUM_THREADS": "1"})  # fmt: skip
    assert p.returncode != 0
    assert re.search(r"rank \d failed, aborting the job", p.stderr), p.stderr


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
    # the size's two copy bandwidths, measured once and shown on each of its rows,
    # where the ranks have a core each (4 ranks on 2 cores: not measured)
    for key in ("copy_GBs", "stream_GBs"):
        assert hier[key] == ring[key]
        if data["header"]["oversubscribed"]:
            assert hier[key] is None
        else:
            assert hier[key] > 0


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
from ringmpi import _progress
x = np.full(1 << 18, MPI.COMM_WORLD.Get_rank() + 1.0)  # 2 MiB: ringmpi's own in every family
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    req = ringmpi.Iallreduce(MPI.IN_PLACE, x)
    avg = np.full(2, MPI.COMM_WORLD.Get_rank() + 1.0)
    ringmpi.Iallreduce(MPI.IN_PLACE, avg, op=ringmpi.AVG).Wait()  # MPI has no AVG
req.Wait()
if MPI.COMM_WORLD.Get_rank() == 0:
    print(type(req) is _progress.Request, x[:2].tolist(), avg.tolist(), len(w))
"""


@pytest.mark.family  # it starts mpirun
def test_nonblocking_calls_need_no_thread_multiple():
    cmd = [*_mpirun(), "-n", "2", PY, "-c", _NO_THREADS]
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "MPI4PY_RC_THREAD_LEVEL": "serialized"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    want = "True [3.0, 3.0] [1.5, 1.5] 0"  # ringmpi's calls, carried out in Wait; no warning
    assert out.stdout.strip().splitlines()[-1:] == [want], out.stdout + out.stderr


@pytest.mark.family  # it starts mpirun
@pytest.mark.parametrize("command", ["reduce_scatter", "allgather"])
def test_the_halves_benchmark_verifies_and_counts(command):
    cmd = [*_mpirun(), "-n", "2", PY, "-m", "ringmpi", command, "-b", "8", "-e", "256K", "-f",
           "64", "-n", "2", "-w", "2", "-a", "auto,ring,shared_memory,mpi4py"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "NUMBA_NUM_THREADS": "1"})  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if not line.startswith("#")]
    # auto below 64K: the library's call, in the timed loop and in the traced call alike
    assert [(r[0], r[2]) for r in rows] == [
        (s, a) for s in ("8", "512", "32K")
        for a in ("auto(mpi)", "ring", "shared_memory", "mpi4py")]  # fmt: skip
    for _size, count, algorithm, *_, wrong, sent, steps in rows:
        assert wrong == "0", rows
        # the ring: every chunk but one, (N-1)/N of the buffer, in N-1 steps; shared memory
        # sends nothing; mpi4py untraced
        want = (str(int(count) * 4 // 2), "1") if algorithm == "ring" else ("0", "0")
        assert (sent, steps) == want, rows


def _said(stdout: str) -> str:
    """The header's lines before the column names, each wrapped line joined again."""
    lines: list[str] = []
    for line in stdout.splitlines():
        if line.startswith("#     size"):
            break
        if line.startswith("#   ") and lines:
            lines[-1] += " " + line[4:]
        else:
            lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # it starts mpirun: one case under every family
        pytest.param(["-b", "0"], "-b/--minbytes must be 1 or more", marks=pytest.mark.family),
        (["-b", "0", "-e", "0"], "-b/--minbytes must be 1 or more bytes, not 0"),
        (["-b", "1G"], "-b/--minbytes 1G is larger than -e/--maxbytes 16M: no size to run"),
        (["-b", "1GB"], "-b/--minbytes 1G is larger than -e/--maxbytes 16M: no size to run"),
        (["-b", "64M", "-e", "8"], "-b/--minbytes 64M is larger than -e/--maxbytes 8"),
        (["-f", "0"], "argument -f/--stepfactor: must be 1 or more, not 0"),
        (["-f", "1"], "-f/--stepfactor 1 never gets from -b/--minbytes to -e/--maxbytes"),
        (["-n", "0"], "argument -n/--iters: must be 1 or more, not 0"),
        (["-w", "-1"], "argument -w/--warmup: must be 0 or more, not -1"),
        (["--budget", "-1"], "--budget must be 0 or more seconds, not -1"),
        (["-a", "mpi", "-d", "bfloat16"], "algorithm: 'mpi' cannot reduce sum on bfloat16"),
        (["-a", "mpi4py", "-d", "float16"], "algorithm: mpi4py (MPI's own Allreduce) cannot"),
        (["--plot", "r.txt"], "--plot r.txt: matplotlib writes no .txt file"),
    ],
)
def test_an_empty_or_endless_sweep_ends_the_job(args, message):
    p = run(2, *args, timeout=60)  # a sweep that never ends fails here, in bounded time
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"python -m ringmpi.allreduce: error: {message}" in p.stderr
    assert p.stdout == ""  # before the header: nothing ran


@pytest.mark.family  # it starts mpirun
def test_an_output_into_a_missing_folder_ends_the_job_before_the_sweep(tmp_path):
    for flag, name in (("--json", "r.json"), ("--plot", "r.png")):
        path = tmp_path / "missing" / name
        p = run(2, flag, str(path), timeout=60)
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"error: {flag} {path}: no folder {path.parent}" in p.stderr
        assert p.stdout == ""
    p = run(2, "--json", str(tmp_path), timeout=60)
    assert p.returncode == 2 and f"error: --json {tmp_path}: is a folder" in p.stderr


@pytest.mark.family  # MPI in this process
def test_an_output_that_fails_after_the_sweep_has_its_own_exit_status(
    tmp_path, monkeypatch, capsys
):
    # One process (N = 1, no mpirun): the check before the sweep passes, then the
    # folder is not there when the rows are written.
    from ringmpi.tools import allreduce as cli

    monkeypatch.setattr(cli, "_unwritable", lambda args: None)
    path = tmp_path / "gone" / "r.json"
    status = cli.main(["-b", "64", "-e", "64", "-n", "1", "-w", "0", "-a", "ring",
                       "--json", str(path)])  # fmt: skip
    assert status == cli.EXIT_OUTPUT == 3
    out, err = capsys.readouterr()
    assert "# wrong elements in total: 0" in out  # the rows stand
    assert f"error: --json {path}: No such file or directory" in err


@pytest.mark.family  # it starts mpirun
def test_the_header_says_cores_and_where_autos_choices_come_from(tmp_path):
    # Every rank on one core: 2 ranks oversubscribe it, whatever the machine.
    online = os.sysconf("SC_NPROCESSORS_ONLN")
    one = min(os.sched_getaffinity(0))
    cmd = [*_mpirun(), "-n", "2", PY, "-m", "ringmpi.allreduce", "-b", "8", "-e", "64",
           "-n", "1", "-w", "0", "-a", "auto,ring"]  # fmt: skip
    cache = tmp_path / "tuner"
    path = cache / f"allreduce-{socket.gethostname()}.json"
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "RINGMPI_TUNER": str(cache)}
    said = []
    for i in range(2):
        out = tmp_path / f"r{i}.json"
        p = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True,
                           timeout=240, env=env,
                           preexec_fn=lambda: os.sched_setaffinity(0, {one}))  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr
        said.append(_said(p.stdout))
        data = json.loads(out.read_text())
        header, rows = data["header"], data["rows"]
        assert (header["node_ranks"], header["node_cores_online"], header["node_cores_usable"],
                header["oversubscribed"]) == (2, online, 1, True)  # fmt: skip
        auto = header["auto_choices"]
        assert (auto["file"], auto["file_existed"]) == (str(path), i == 1)
        # auto's trials run in the first launch, and its choices come from the file after
        assert [r.get("tuned_in_this_run") for r in rows] == [i == 0, None] * 2
    for text in said:
        assert f"# cores: {online} online per node, 1 in the ranks' affinity" in text
        assert "# oversubscribed: 2 ranks share 1 core on a node:" in text
        assert "# there shared_memory hands a buffer on in pieces of up to 4 MiB, not 128 KiB:" \
            in text  # fmt: skip
    assert f"# auto's choices: tuned in this run (no tuner file yet; the choices are kept in " \
           f"{path})" in said[0]  # fmt: skip
    assert re.search(rf"# auto's choices: the tuner's file {re.escape(str(path))}, last "
                     r"written \d+ s ago;", said[1])  # fmt: skip
    off = run(2, "-b", "8", "-e", "8", "-n", "1", "-a", "auto", env={"RINGMPI_TUNER": "off"})
    assert "# auto's choices: the cost model alone (RINGMPI_TUNER=off)" in _said(off.stdout)


@pytest.mark.family  # it starts mpirun
def test_autos_trials_and_leads_calls_run_untimed_before_its_row(tmp_path):
    """An untuned class's trials and its lead's calls between them (the model's
    best) run before auto's row is timed: the row is the tuned choice's."""
    out = tmp_path / "trials.json"
    p = run(2, "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "-a", "auto", "--json", str(out),
            env={"RINGMPI_TUNER": "memory", "RINGMPI_SPACING": "7"})  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [r["tuned_in_this_run"] for r in rows] == [True, True, True]
    assert all(r["wrong"] == 0 for r in rows)


@pytest.mark.family  # it starts mpirun
def test_a_class_tuned_while_the_node_is_busy_is_not_saved(tmp_path):
    # Real load: more CPU-bound processes than the node has cores and ranks, so that
    # more threads are runnable than it can run.
    hogs = [subprocess.Popen([PY, "-c", "while True: pass"])
            for _ in range(max(os.cpu_count() or 1, 2) + 2)]  # fmt: skip
    try:
        outs = []
        for said in ("auto", "no"):
            cache = tmp_path / said
            out = tmp_path / f"{said}.json"
            p = run(2, "-b", "8", "-e", "64", "-n", "1", "-w", "0", "-a", "auto",
                    "--json", str(out),
                    env={"RINGMPI_TUNER": str(cache), "RINGMPI_OVERSUBSCRIBED": said})  # fmt: skip
            assert p.returncode == 0, p.stdout + p.stderr
            rows = json.loads(out.read_text())["rows"]
            outs.append((p.stdout, rows, cache / f"allreduce-{socket.gethostname()}.json"))
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    (busy, rows, path), (_, known_rows, known_path) = outs
    # auto: tuned on a busy node, run, and not written
    assert [(r["tuned_in_this_run"], r["tuned_on_a_busy_node"]) for r in rows] == [(True, True)] * 2
    assert "# auto tuned in this run at: 8 (node busy: not saved), 64 (node busy: not saved)" \
        in busy  # fmt: skip
    assert not path.exists()
    # the setting says the node's state is known: written as ever
    assert [r["tuned_on_a_busy_node"] for r in known_rows] == [False] * 2
    classes = next(iter(json.loads(known_path.read_text())["layouts"].values()))
    assert sorted(classes) == ["4", "7"]


def test_a_node_is_busy_where_more_threads_are_runnable_than_cores_and_ranks():
    from ringmpi import _host

    cores = os.cpu_count() or 1
    assert _host.runnable() >= 1  # this thread, where Linux says
    assert not _host.busy([], 1)
    assert not _host.busy([cores + 1] * 3, 1)  # one more than the cores comes and goes
    assert not _host.busy([cores + 2, cores, cores], 1)  # the median
    assert _host.busy([cores + 2, cores + 2, cores + 9], 1)
    assert not _host.busy([cores + 4] * 3, cores + 3)  # the node's own ranks, and one
    assert _host.busy([cores + 5] * 3, cores + 3)


@pytest.mark.family  # MPI in this process
def test_every_row_makes_the_same_call(tmp_path, monkeypatch):
    # One process (N = 1): every ringmpi row calls ringmpi.Allreduce(send, recv, op,
    # comm), no keyword, its algorithm set by the settings around the call; each row
    # on its own recvbuf object (one remembered call each).
    from mpi4py import MPI

    import ringmpi
    from ringmpi import _settings
    from ringmpi.tools import allreduce as cli

    calls = []
    real = ringmpi.Allreduce

    def spy(*args, **kwargs):
        now = _settings.current()
        calls.append((len(args), tuple(kwargs), now.algorithm, now.window_stores, id(args[1])))
        return real(*args, **kwargs)

    monkeypatch.setattr(ringmpi, "Allreduce", spy)
    out = tmp_path / "r.json"
    assert cli.main(["-b", "8", "-e", "8", "-n", "3", "-w", "1", "--budget", "0", "-a",
                     "all,hierarchical:cached", "--json", str(out)]) == 0  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    named = [*algorithms.usable(cli.context(MPI.COMM_WORLD)), "mpi"]
    assert [r["algorithm"] for r in rows][1:] == [*named, "mpi4py", "hierarchical:cached"]
    assert {(n, kw) for n, kw, *_ in calls} == {(4, ())}
    ways = {(algorithm, stores) for _, _, algorithm, stores, _ in calls}
    assert ways == {("auto", "auto"), *((a, "auto") for a in named), ("hierarchical", "cached")}
    recv = {(algorithm, stores): {r for *_, a, s, r in calls if (a, s) == (algorithm, stores)}
            for algorithm, stores in ways}  # fmt: skip
    assert all(len(ids) == 1 for ids in recv.values())  # one object per row
    assert len({next(iter(ids)) for ids in recv.values()}) == len(ways)  # none shared


@pytest.mark.family  # it starts mpirun
def test_the_timeout_is_on_ringmpis_rows_not_the_baseline(tmp_path):
    """--timeout on auto's row; mpi and mpi4py time the library's blocking call as a
    program makes it (with a timeout, mpi would poll MPI_Iallreduce)."""
    out = tmp_path / "r.json"
    p = run(2, "-b", "8", "-e", "8", "-n", "2", "-a", "auto,mpi,mpi4py", "--timeout", "30",
            "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr
    said = p.stdout.replace("\n#   ", " ")
    assert "# timeout 30 s on auto: a rank that waits" in said
    assert "; mpi, mpi4py without one: the library's blocking MPI_Allreduce" in said
    assert json.loads(out.read_text())["header"]["timeout_s"] == {"auto": 30.0, "mpi": 0.0}


def test_ranks_that_share_a_core_print_no_copy_rates(tmp_path):
    """Two ranks bound to one core: their copies cannot overlap, so the header gives
    no node bandwidth and no floor, rather than the sum of rates measured apart."""
    out = tmp_path / "r.json"
    cmd = ["taskset", "-c", "0", *_mpirun(), "-n", "2", PY, "-m", "ringmpi.allreduce",
           "-b", "1M", "-e", "1M", "-n", "1", "-w", "0", "-a", "mpi", "--json", str(out)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                       env={**os.environ, "NUMBA_NUM_THREADS": "1"})  # fmt: skip
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert data["header"]["oversubscribed"] is True
    assert "# no copy rates and no floor: ranks that share cores" in p.stdout
    assert re.search(r"^# 1M$", p.stdout, re.M), p.stdout
    [row] = data["rows"]
    assert row["copy_GBs"] is None and row["stream_GBs"] is None and row["floor_us"] is None


@pytest.mark.family  # it starts mpirun
def test_an_output_that_cannot_be_made_ends_the_job_before_the_sweep():
    """--json into a folder where no file can be made (/proc): status 2, before the
    header, where the check once passed (the folder exists, root may write) and the
    whole sweep ran first."""
    p = run(2, "-b", "8", "-e", "8", "--json", "/proc/nope.json", timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "error: --json /proc/nope.json: " in p.stderr and p.stdout == ""


def test_a_size_beyond_the_memory_ends_the_job_before_the_sweep():
    """-e larger than a rank can allocate (here: ulimit -v of 6 GiB): status 2 naming
    the flag, before the header, not a MemoryError and MPI_Abort mid-sweep."""

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    cmd = [*_mpirun(), "-n", "2", PY, "-m", "ringmpi.allreduce", "-b", "8G", "-e", "8G"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, preexec_fn=limited,
                       env={**os.environ, "NUMBA_NUM_THREADS": "1"})  # fmt: skip
    assert p.returncode == 2, p.stdout + p.stderr
    assert (
        "error: -e: the largest size, 8G of float32, needs about 18.2 GiB a rank, and "
        "ulimit -v leaves this process" in p.stderr
    ), p.stderr
    assert p.stdout == ""
