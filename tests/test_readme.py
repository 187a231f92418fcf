"""The README's Python code, run as written under mpirun (this file itself runs without MPI)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli import _mpirun

# They start mpirun; the README's code is ringmpi's API, which the MPI suite checks under
# each family: MPICH only.

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def test_readme_has_code():
    assert python_blocks()


@pytest.mark.parametrize("nranks", [1, 3])
def test_readme_code_runs(tmp_path, nranks):
    for i, block in enumerate(python_blocks()):
        script = tmp_path / f"block{i}.py"
        script.write_text(block)
        cmd = [*_mpirun(), "-n", str(nranks), sys.executable, str(script)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, f"README block {i} at {nranks} ranks:\n{p.stderr}"
