"""The jobs/ scripts submitted to a real Slurm with sbatch (``make test-slurm``).

Skipped unless ``sinfo`` answers: ``make slurm-up`` starts a one-node Slurm on this
machine (cluster/slurm-up.sh) and prints the ``SLURM_CONF`` to export; ``make
test-slurm`` does both, runs this file and stops the cluster. Each job runs a small
sweep and is waited for with a bounded timeout; its JSON is checked (ranks, rows,
no wrong element, the hierarchical rows' inter-node steps), then the report merges
them all.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
# Small sweeps: 8 B, 512 B and 32 KiB; the oversubscribed 2-core machine takes seconds.
SWEEP = {"MINBYTES": "8", "MAXBYTES": "64K", "STEPFACTOR": "64", "ITERS": "3", "WARMUP": "1"}
JOB_LIMIT = 420  # seconds a job may take, queueing and a cold Numba cache included


def _sinfo() -> str | None:
    """Why Slurm cannot be used here, or None when sinfo answers."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "no Slurm client (sbatch, sinfo): run `make test-slurm`"
    try:
        p = subprocess.run(["sinfo", "--noheader", "-o", "%t"], capture_output=True,
                           text=True, timeout=15)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s"
    if p.returncode != 0 or not p.stdout.strip():
        first = (p.stderr.strip().splitlines() or ["no output"])[0][:120]
        return (f"no Slurm answers (sinfo: {first}): run `make slurm-up` and export the "
                "SLURM_CONF it prints, or `make test-slurm`")  # fmt: skip
    return None


_WHY = _sinfo()
# make test-slurm sets it: there a Slurm that does not answer is a failure, not a skip.
_REQUIRED = os.environ.get("RINGMPI_REQUIRE_SLURM") == "1"


def slurm(test):
    """A test that submits jobs: marked slurm, skipped without a Slurm, given time."""
    test = pytest.mark.timeout(JOB_LIMIT + 60)(test)
    test = pytest.mark.skipif(_WHY is not None and not _REQUIRED, reason=_WHY or "")(test)
    return pytest.mark.slurm(test)


def test_shellcheck():
    """jobs/ and the cluster scripts are shellcheck-clean (warnings included)."""
    exe = shutil.which("shellcheck")
    if exe is None:
        pytest.skip("no shellcheck (apt-get install shellcheck; make lint-shell installs it)")
    scripts = [*sorted((ROOT / "jobs").glob("*")), *sorted((ROOT / "cluster").glob("slurm-*.sh"))]
    assert len(scripts) >= 6
    p = subprocess.run([exe, "-x", *map(str, scripts)], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


@slurm
def test_slurm_answers():
    assert _WHY is None, _WHY


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("slurm")


def _env(work: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGMPI_")}
    env.pop("NUMBA_CACHE_DIR", None)
    env.update(PYTHON=PY, RESULTS=str(work / "results"), **SWEEP, **extra)
    return env


def _state(job: str) -> tuple[str, str]:
    p = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True)
    fields = dict(f.split("=", 1) for f in p.stdout.split() if "=" in f)
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "?")


def submit(work: Path, *args: str, env: dict[str, str]) -> tuple[str, str, str]:
    """sbatch ARGS (options, then the script) from the repository root; wait for the job;
    (job id, final state and exit code, its output)."""
    cmd = ["sbatch", "--parsable", f"--output={work}/%x-%j.out", *args]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    deadline = time.monotonic() + JOB_LIMIT
    while True:
        state, code = _state(job)
        if state not in {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "UNKNOWN"}:
            break
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job])
            state = f"still {state} after {JOB_LIMIT} s (cancelled)"
            break
        time.sleep(1)
    outs = list(work.glob(f"*-{job}.out"))
    output = outs[0].read_text() if outs else "(no output file)"
    return job, f"{state} {code}", output


def _load(path: Path) -> dict:
    assert path.exists(), f"no {path.name}"
    return json.loads(path.read_text())


def _check(data: dict, ranks: int, sizes: int, algorithms: list[str], launcher: str) -> None:
    header, rows = data["header"], data["rows"]
    assert header["ranks"] == ranks
    assert header["job"]["launcher"] == launcher and header["job"]["id"]
    assert len(rows) == sizes * len(algorithms)
    assert [r["algorithm"] for r in rows[: len(algorithms)]] == algorithms
    assert all(r["wrong"] == 0 for r in rows), rows


RESULTS: list[Path] = []  # every JSON the jobs wrote, for the report test


@slurm
def test_single_node(work):
    """The default sweep (auto and the MPI baseline) at 4 ranks, srun with PMI-2, the
    install's own Numba cache (kept for the next job), the timeout on auto's row only
    (the baseline is the library's blocking call)."""
    job, state, out = submit(work, "--ntasks=4", "jobs/single-node.sbatch", env=_env(work))
    assert state == "COMPLETED 0:0", out
    assert "LAUNCHER=srun --mpi=pmi2" in out and "# wrong elements in total: 0" in out
    cache = subprocess.run([PY, "-c", "from ringmpi import _copy; "
                            "print(_copy.copy_bytes._cache._cache_path)"],
                           capture_output=True, text=True, env=_env(work)).stdout.strip()  # fmt: skip
    assert re.search(rf"^# Numba cache {re.escape(cache)} ready on 1 node\(s\) in \d+ s$",
                     out, re.M), out  # fmt: skip
    assert Path(cache).is_dir()
    said = out.replace("\n#   ", " ")  # the header's wrapped lines, whole
    assert "# timeout 120 s on auto: " in said and "; mpi without one: " in said, out
    path = work / "results" / f"single-node-{job}.json"
    data = _load(path)
    assert data["header"]["timeout_s"] == {"auto": 120.0, "mpi": 0.0}
    assert [r["algorithm"] for r in data["rows"]][1::2] == ["mpi"] * 3
    assert all(r["algorithm"].startswith("auto(") for r in data["rows"][::2])
    assert data["header"]["ranks"] == 4 and data["header"]["nodes"] == 1
    assert all(r["wrong"] == 0 for r in data["rows"])
    RESULTS.append(path)


@slurm
def test_multi_node_emulated(work):
    """Ring, hierarchical and MPI on one node cut into 2 emulated nodes of 2 ranks:
    hierarchical takes lg M = 1 inter-node step at 8 B (recursive doubling across the
    nodes) and at most 2(M-1) = 2 (the ring) at any size, the flat ring 2(N-1) = 6."""
    env = _env(work, NUMBA_CACHE_DIR=str(work / "numba"))
    job, state, out = submit(work, "--nodes=1", "--ntasks-per-node=4",
                             "jobs/multi-node.sbatch", env=env)  # fmt: skip
    assert state == "COMPLETED 0:0", out
    assert "one node: emulated nodes of 2 rank(s)" in out
    path = work / "results" / f"multi-node-{job}.json"
    data = _load(path)
    _check(data, 4, 3, ["ring", "hierarchical", "mpi"], "srun")
    assert data["header"]["emulated_ranks_per_node"] == 2
    steps = {(r["size"], r["algorithm"]): r["steps"] for r in data["rows"]}
    for size in (8, 512, 32768):
        assert steps[size, "ring"] == 6
        assert steps[size, "hierarchical"] in ((1,) if size == 8 else (1, 2))
        assert steps[size, "mpi"] is None
    RESULTS.append(path)


@slurm
def test_scaling_with_mpirun(work):
    """1 and 2 emulated nodes of 2 ranks, started by MPICH's mpirun inside the
    allocation (hydra starts its proxies with srun)."""
    env = _env(work, NUMBA_CACHE_DIR=str(work / "numba"), LAUNCHER="mpirun")
    job, state, out = submit(work, "--nodes=1", "--ntasks-per-node=4",
                             "jobs/scaling.sbatch", env=env)  # fmt: skip
    assert state == "COMPLETED 0:0", out
    for m, ranks in ((1, 2), (2, 4)):
        path = work / "results" / f"scaling-{job}-{m}nodes.json"
        data = _load(path)
        _check(data, ranks, 3, ["ring", "hierarchical", "mpi"], "mpirun")
        assert data["header"]["job"]["step_nodes"] == str(m)
        hier = [r["steps"] for r in data["rows"] if r["algorithm"] == "hierarchical"]
        # one node: no step; two: recursive doubling's 1 at 8 B, the ring's 2 at most
        assert len(hier) == 3 and hier[0] == m - 1 and max(hier) <= 2 * (m - 1)
        RESULTS.append(path)


@slurm
def test_bad_arguments_fail_the_job(work):
    """A sweep that cannot run fails the job with the command line's message."""
    env = _env(work, NUMBA_CACHE_DIR=str(work / "numba"), ALGORITHMS="ring,bogus")
    _, state, out = submit(work, "--ntasks=2", "jobs/single-node.sbatch", env=env)
    assert state.startswith("FAILED"), out
    assert "bogus" in out


HUNG_JOB = """#!/bin/bash
#SBATCH --job-name=hung
set -euo pipefail
source "$RINGMPI_JOBS_DIR/lib.sh"
warm_cache
launch 3 1 "$PYTHON" -m ringmpi.tools._reliability_job fault ring sleep 1
"""


@slurm
def test_hung_rank_ends_the_job(work):
    """A rank that never arrives ends the whole job within the timeout, and the output
    names it (RINGMPI_TIMEOUT, abort_on_error, MPI_Abort through srun --mpi=pmi2): the
    jobs' own launch, after their cache warm-up (float64, the fault job's dtype)."""
    script = work / "hung.sbatch"
    script.write_text(HUNG_JOB)
    env = _env(work, NUMBA_CACHE_DIR=str(work / "numba"), RINGMPI_TIMEOUT="5",
               RINGMPI_JOBS_DIR=str(ROOT / "jobs"), DATATYPE="float64")  # fmt: skip
    _, state, out = submit(work, "--ntasks=3", str(script), env=env)
    ended = time.time()
    assert state.startswith(("FAILED", "CANCELLED")), out
    assert "waited 5 s for rank 1" in out, out
    fault_at = float(out.split("fault sleep at ")[1].split()[0])
    # 5 s of timeout, 0.5 s before MPI_Abort, srun's teardown, and this test's polling.
    assert ended - fault_at < 30, out


TORCH_JOB = """#!/bin/bash
#SBATCH --job-name=torch-backend
srun --mpi=pmi2 --kill-on-bad-exit=1 "$PYTHON" -c '
import torch, torch.distributed as dist, ringmpi.torch
from mpi4py import MPI
dist.init_process_group("ringmpi")  # rank, size and rendezvous from MPI
x = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(x)
print("rank", MPI.COMM_WORLD.rank, "of", dist.get_world_size(), dist.get_backend(), x.tolist())
dist.destroy_process_group()'
"""


@slurm
def test_the_torch_backend_under_srun(work):
    """torch.distributed on the ringmpi backend in a job whose ranks srun starts
    (PMI-2), started as torch's own call with no variable set: torch's rank is MPI's,
    and the all-reduce is every rank's sum."""
    if subprocess.run([PY, "-c", "import torch"], capture_output=True).returncode:
        pytest.skip("no PyTorch in this venv (make test-torch installs it)")
    script = work / "torch.sbatch"
    script.write_text(TORCH_JOB)
    _, state, out = submit(work, "--ntasks=3", str(script), env=_env(work))
    assert state == "COMPLETED 0:0", out
    for rank in range(3):
        assert f"rank {rank} of 3 ringmpi [6.0, 6.0, 6.0]" in out, out


@slurm
def test_report_merges_the_jobs(work, tmp_path):
    if not RESULTS:
        pytest.skip("no job results (the jobs' tests failed or did not run)")
    plot = tmp_path / "jobs.png"
    p = subprocess.run([PY, "-m", "ringmpi", "report", *map(str, RESULTS), "--markdown",
                        "--plot", str(plot)], capture_output=True, text=True)  # fmt: skip
    assert p.returncode == 0, p.stderr
    rows = sum(len(json.loads(path.read_text())["rows"]) for path in RESULTS)
    assert f"{rows} rows from {len(RESULTS)} file(s); wrong elements in total: 0" in p.stdout
    assert "| 32K | hierarchical | 4 | 2* |" in p.stdout
    assert plot.stat().st_size > 10_000
