"""examples/train_digits.py, hot_loop.py, symmetric.py and threads.py as a user runs them:
under mpirun, from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cli import _mpirun

from ringmpi.tools._units import buffer_sets

# They start mpirun; what they check (the tool's output, the example's training) is
# ringmpi's own, so they run under MPICH only (the MPI suite checks each family).

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train_digits.py"


@pytest.mark.parametrize(("nranks", "flags"), [(1, []), (3, ["--bfloat16"])])
def test_the_script_under_mpirun(tmp_path, nranks, flags):
    pytest.importorskip("sklearn")
    out = tmp_path / "w.npz"
    cmd = [*_mpirun(), "-n", str(nranks), sys.executable, str(SCRIPT), "--steps", "60",
           *flags, "--out", str(out)]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith(f"ranks {nranks}, training accuracy 0.9")
    assert last.endswith("weights identical on every rank: True")
    weights = np.load(out)
    assert [weights[k].shape for k in weights.files] == [(64, 32), (32,), (32, 10), (10,)]


def test_the_hot_loop_off_the_cache_loops_over_enough_arrays_and_stays_exact(tmp_path):
    script = SCRIPT.parent / "hot_loop.py"
    cmd = [*_mpirun(), "-n", "2", sys.executable, str(script), "--max", "64K",
           "--off-cache", "1M"]  # fmt: skip
    env = {**os.environ, "RINGMPI_TUNER": str(tmp_path), "NUMBA_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[0] == "# off the cache: arrays that touch twice 1 MiB on the node"
    rows = [line.split() for line in lines[2:]]
    # 8 B to 32 KiB; one in-place array a set
    assert [int(r[0]) for r in rows] == [8, 64, 512, 4096, 32768]
    assert [(r[-2], int(r[-1])) for r in rows] == [
        ("True", buffer_sets(int(r[0]), 1 << 20, 2, 64, buffers=1)) for r in rows
    ]
    assert [int(r[-1]) for r in rows] == [64, 64, 64, 64, 32]


def test_window_resident_arrays_run_symmetric_from_1_mib_and_stay_exact():
    script = SCRIPT.parent / "symmetric.py"
    cmd = [*_mpirun(), "-n", "2", sys.executable, str(script), "--min", "1M", "--max", "4M",
           "--rounds", "1"]  # fmt: skip
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.strip().splitlines()[2:]]
    assert [(int(r[0]), r[-2], r[-1]) for r in rows] == [
        (1 << 20, "True", "(symmetric)"),
        (4 << 20, "True", "(symmetric)"),
    ]


def test_threads_per_rank_give_one_threads_bits_and_the_exact_sum():
    # 3 ranks (uneven chunks), a count that no thread count divides, 1-4 threads a rank
    script = SCRIPT.parent / "threads.py"
    cmd = [*_mpirun(), "-n", "3", sys.executable, str(script), "--size", "1000004",
           "--threads", "1,2,3,4", "--rounds", "1"]  # fmt: skip
    env = {**os.environ, "NUMBA_NUM_THREADS": "4"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.strip().splitlines()[2:]]
    assert [(int(r[0]), r[-2], r[-1]) for r in rows] == [(t, "True", "True") for t in (1, 2, 3, 4)]
