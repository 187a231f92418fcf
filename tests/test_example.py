"""examples/train_digits.py as a user runs it: under mpirun, from the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cli import _mpirun

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
