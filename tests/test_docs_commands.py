"""Every shell command of README.md, CONTRIBUTING.md and docs/*.md, run as written.

The commands are the lines of the pages' ```sh blocks (and the ``$ `` lines of their
plain blocks), backslash continuations joined and trailing comments dropped. Each runs
with ``bash -c``, its text unchanged, in the environment the README tells users to enter
(``. .venv/bin/activate``: the venv's ``bin/`` first on PATH, VIRTUAL_ENV set; here the
venv of this interpreter), in a scratch copy of the repository, so that the files they
write (out.png, tuning.json, results/...) never touch the checkout. A page's commands run
in page order: what one sets (``export``, ``A=...``, an activation) holds for the next,
and what one writes is there for the next; a command an earlier page ran with the same
settings runs once. Each must exit 0, and report 0 wrong elements where it reports them.

A command that cannot run here, or takes over a minute at 2-4 ranks, is in SKIPPED with
the reason; every other command runs, so a page cannot gain a command that is neither.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs  # MPICH's venv only: not in make test-family

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
TIMEOUT = 240  # seconds a command may take under load; each runs in under a minute alone

_ANOTHER_FAMILY = "another MPI family's venv (make run MPI=...); make test-family runs it"
_SUITE = "the suite's own target, or this test's set-up: not run from within the suite"
_HOSTS = "needs root and the namespace hosts of make hosts-up: make test-hosts covers them"
_SLURM = "needs the Slurm of make slurm-up: make test-slurm submits every jobs/ script"
_TEMPLATE = "a template: its placeholders (N, P, $CACHE, [...]) are for the reader to fill"

# Commands not run here, each with the reason (the text as it reads on the page, with
# its spaces squeezed). Times: measured on 2 cores, 2026-12-03.
SKIPPED: dict[str, str] = {
    # the set-up and the suite
    "make run": _SUITE,
    "NUMBA_CACHE_DIR=$(mktemp -d) make run": (
        "make run remakes the venv where pyproject.toml is newer; its sweep is run above"
    ),
    "make test": _SUITE + "; about 40 minutes",
    "make test MPI=openmpi": _ANOTHER_FAMILY,
    "make test MPI=impi": _ANOTHER_FAMILY,
    "make test-family MPI=openmpi": _ANOTHER_FAMILY,
    "make test-mpi4py": _SUITE + "; about 3 minutes",
    "make test-torch": "installs PyTorch (about 5 GB); CI runs it",
    "make lint": _SUITE,
    "make docs": "installs the docs extra; CI runs it",
    "make bench": "three MPI families, about 10 minutes",
    "RINGMPI_TUNER=memory make bench": "three MPI families, about 10 minutes",
    "make simulate": "builds SimGrid from source, 7 minutes",
    "python -m pip install .": "changes this environment's ringmpi install",
    "python -m pip install '.[mpich]'": "changes this environment's ringmpi install",
    "python -m pip install -e '.[mpich,examples]'": (
        "changes this environment's ringmpi install; the test extra has the examples "
        "extra's scikit-learn (test_examples_extra_installed)"
    ),
    "python -m pip install -e .": "changes this environment's ringmpi install",
    'echo "$PWD" > "$(python -c \'import sysconfig; print(sysconfig.get_path("purelib"))\')'
    '/ringmpi-clone.pth"': "changes this environment's ringmpi install",
    "ulimit -v 6000000; mpirun -n 2 python -m ringmpi.allreduce -b 8G -e 8G": (
        "exits 2 on purpose, as the page shows: tests/test_cli.py checks its message"
    ),
    "python -m pytest tests/test_plans.py": "make test runs it; 72 s",
    "mpirun -n 2 /usr/bin/time -f '%M KiB' python -m ringmpi.allreduce -b 64M -e 64M -a ring": (
        "GNU time (Debian's time package) is not on every machine; it measures memory only"
    ),
    "mpirun -n 3 python -m pytest --with-mpi -m mpi tests/test_mpi_halves.py": (
        "make test runs it at 1-4 ranks; 32 s, 232 s while Numba compiled"
    ),
    # over a minute at 2 ranks
    "mpirun -n 2 python -m ringmpi.allreduce -d bfloat16 -b 512K -e 64M -f 2 "
    "-a hierarchical,ring,auto -n 10 -w 8 --budget 0": "114 s",
    # other MPI families
    "export OMPI_MCA_osc=^ucx PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe": (
        _ANOTHER_FAMILY
    ),
    "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1": _ANOTHER_FAMILY,
    ". .venv-impi/bin/activate": _ANOTHER_FAMILY,
    ". .venv-openmpi/bin/activate": _ANOTHER_FAMILY,
    "export I_MPI_FABRICS=shm": _ANOTHER_FAMILY,
    "export OMPI_MCA_osc=^ucx": _ANOTHER_FAMILY,
    "mpirun --allow-run-as-root --oversubscribe -n 4 python -m ringmpi.allreduce": (
        _ANOTHER_FAMILY
    ),
    "RINGMPI_TUNER=memory mpirun -n 4 python -m ringmpi.allreduce -b 16 -e 16M -f 16 -n 7 "
    "-a auto,mpi": "4 ranks with the tuner's trials at every size: over a minute on 2 cores",
    "RINGMPI_TUNER=memory mpirun -n 4 python -m ringmpi.allreduce -b 16 -e 16M -f 16 -n 7 "
    "-a all": "4 ranks, every algorithm and the tuner's trials at every size: over a minute",
    "RINGMPI_TUNER=memory mpirun -n 4 python -m ringmpi.allreduce -b 16 -e 16M -f 16 -n 7 "
    "-a chain,symmetric,rabenseifner_hybrid,mpi": "4 ranks, four rows to 16 MiB: over a minute",
    # more ranks than the 2-4 this test runs
    "mpirun -n 64 python -m ringmpi.allreduce": "64 ranks",
    "RINGMPI_TUNER=memory mpirun -n 64 python -m ringmpi.allreduce -a "
    "all,chain,symmetric,rabenseifner_hybrid": "64 ranks, every algorithm: about 5 minutes",
    "mpirun -n 8 python -m ringmpi.allreduce -d float64 -o max -a ring,mpi --json out.json": (
        "8 ranks"
    ),
    "mpirun -n 16 python -m ringmpi.allreduce -b 8 -e 8 -n 200 -w 20 --budget 0 -a all": (
        "16 ranks"
    ),
    "mpirun -n 16 python -m ringmpi.allreduce -b 1K -e 64M -f 4 -n 20 -w 8 --budget 2 -a all": (
        "16 ranks"
    ),
    # a cluster, Slurm, emulated hosts
    "module load mpi": "a site's module system",
    "python -m pip install --no-binary=mpi4py mpi4py": "builds mpi4py against a site's MPI",
    "srun python -m ringmpi.allreduce": "inside a Slurm allocation",
    "sbatch -N 4 --ntasks-per-node=32 jobs/multi-node.sbatch": _SLURM,
    "sbatch jobs/single-node.sbatch": _SLURM,
    "MINBYTES=8 MAXBYTES=64K STEPFACTOR=64 ITERS=3 WARMUP=1 RESULTS=mn sbatch --wait -N 1 "
    "--ntasks-per-node=4 jobs/multi-node.sbatch": _SLURM,
    "python -m ringmpi report mn/*.json --markdown": _SLURM + ", for the job's JSON",
    "sbatch -N 8 --ntasks-per-node=32 jobs/scaling.sbatch": _SLURM,
    "make slurm-up": _SLURM,
    "export SLURM_CONF=${TMPDIR:-/tmp}/ringmpi-slurm/slurm.conf": _SLURM,
    "sbatch jobs/single-node.sbatch; squeue; sinfo": _SLURM,
    "make slurm-down": _SLURM,
    "make test-slurm": _SLURM,
    "export NUMBA_CACHE_DIR=${TMPDIR:-/tmp}/ringmpi-numba": "a cluster's job set-up, with srun",
    'MPI4PY_RC_INITIALIZE=0 srun --mpi=none --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" '
    "--ntasks-per-node=1 python -m ringmpi kernels --warm": "inside a Slurm allocation",
    "make hosts-up NHOSTS=4": _HOSTS,
    "make hosts-down": _HOSTS,
    "make test-hosts": _HOSTS,
    'mpirun -launcher ssh -launcher-exec "$PWD/cluster/host-agent.sh" -localhost ringmpi-root '
    "-hosts ringmpi-h1:2,ringmpi-h2:2,ringmpi-h3:2,ringmpi-h4:2 python -m ringmpi.allreduce "
    "-a hierarchical,ring,mpi -b 8 -e 16M": _HOSTS,
    'mpirun -launcher ssh -launcher-exec "$PWD/cluster/host-agent.sh" -localhost ringmpi-root '
    '-hosts ringmpi-h1:2,ringmpi-h2:2 python -c "from mpi4py import MPI; import socket; '
    "print(MPI.COMM_WORLD.rank, socket.gethostname(), "
    'MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).size)"': _HOSTS,
    "ip netns exec ringmpi-h2 nsenter --uts=STATE/ringmpi-h2.uts --ipc=STATE/ringmpi-h2.ipc -- "
    'sh -c "$*"': "a line of cluster/host-agent.sh, quoted",
    "bash cluster/hosts-up.sh 4 [--rate 1gbit]": _HOSTS,
    "bash cluster/hosts-up.sh 2 [--rate 1gbit]": _HOSTS,
    "bash cluster/hosts-down.sh": _HOSTS,
    'NUMBA_NUM_THREADS=1 mpirun -launcher ssh -launcher-exec "$PWD/cluster/host-agent.sh" '
    "-localhost ringmpi-root -hosts ringmpi-h1:2,ringmpi-h2:2[,ringmpi-h3:2[,ringmpi-h4:2]] "
    "python -m ringmpi.allreduce -a hierarchical,ring,mpi -b 8 -e 16M -f 8 -n 10 "
    "--json run.json": _HOSTS,
    'mpirun -launcher ssh -launcher-exec "$PWD/cluster/host-agent.sh" -localhost ringmpi-root '
    "-hosts ringmpi-h1:1,ringmpi-h2:1 python -m ringmpi scaling --pingpong fabric.json "
    "-b 8 -e 16M": _HOSTS,
    'NUMBA_NUM_THREADS=1 mpirun -launcher ssh -launcher-exec "$PWD/cluster/host-agent.sh" '
    "-localhost ringmpi-root -hosts ringmpi-h1:1,ringmpi-h2:1[,ringmpi-h3:1[,ringmpi-h4:1]] "
    "python -m ringmpi.allreduce -a hierarchical,ring,recursive_doubling -b 8 -e 16M -f 8 "
    "-n 7 -w 1 --json run-M.json": _HOSTS,
    'NUMBA_NUM_THREADS=1 mpirun -launcher ssh -launcher-exec "$PWD/cluster/host-agent.sh" '
    "-localhost ringmpi-root -hosts ringmpi-h1:2,ringmpi-h2:2[,ringmpi-h3:2[,ringmpi-h4:2]] "
    "python -m ringmpi.allreduce -a hierarchical,ring,recursive_doubling -b 8 -e 16M -f 8 "
    "-n 7 -w 1 --json run-M.json": _HOSTS,
    "python -m ringmpi scaling --simulate --check run-*.json [--alpha 17.4e-6 --beta 8.39e-9]": (
        _TEMPLATE + "; needs SimGrid and the runs across hosts"
    ),
    "python -m ringmpi scaling --check run-*.json [--fabric fabric-1gbit.json] [--shared-nic]": (
        _TEMPLATE + "; needs the runs across hosts"
    ),
    # templates
    "rm -rf $CACHE; NUMBA_CACHE_DIR=$CACHE mpirun -n N python examples/cold_start.py": _TEMPLATE,
    "NUMBA_NUM_THREADS=1 mpirun -n P python -m ringmpi.allreduce -a hierarchical,ring,"
    "recursive_doubling -b 8 -e 16M -f 8 -n 7 -w 1 --json run-1xP.json": _TEMPLATE,
    "python -m ringmpi report FILE.json... [--markdown] [--plot OUT.png]": _TEMPLATE,
    # SimGrid, PyTorch
    "python -m ringmpi scaling --simulate --markdown --plot simulated.png": (
        "needs SimGrid (make simulate); 7 min 18 s"
    ),
    "python -m ringmpi scaling --simulate --markdown --alpha 1.5e-6 --beta 2e-11": (
        "needs SimGrid (make simulate)"
    ),
    "mpirun -n 2 python examples/ddp_cpu.py --width 1024 --steps 30": "needs PyTorch",
    "mpirun -n 2 python examples/ddp_cpu.py --width 2048 --steps 30": "needs PyTorch",
    "mpirun -n 2 python examples/torch_collectives.py": "needs PyTorch",
    "mpirun -n 2 python examples/fsdp_cpu.py --width 1024 --steps 30": "needs PyTorch",
    "mpirun -n 2 python examples/fsdp_cpu.py --width 2048 --steps 30": "needs PyTorch",
    # longer than a minute here (the same script runs with 9 rounds from the 16-core lines)
    "OMP_NUM_THREADS=1 mpirun -n 2 python examples/overlap.py --rounds 30": (
        "about 110 s at 2 ranks on 2 cores (30 rounds of NumPy work)"
    ),
    "RINGMPI_TUNER=$(mktemp -d) mpirun -n 2 python examples/hot_loop.py --max 1G": (
        "about 60 s and 6 GiB at 2 ranks (1 GiB arrays); test_example.py runs the script"
    ),
    "RINGMPI_TUNER=$(mktemp -d) mpirun -n 2 python examples/hot_loop.py --max 1G --off-cache": (
        "about 60 s and 6 GiB at 2 ranks (1 GiB arrays); test_example.py runs the script"
    ),
    "mpirun -n 2 python examples/symmetric.py": (
        "about 30 s and 6 GiB at 2 ranks (1 GiB arrays); test_example.py runs the script"
    ),
    # rewrites a tracked page
    "python -m ringmpi reliability --write docs/reliability.md": (
        "rewrites its page; about 6 minutes (make test runs its cases)"
    ),
    "python -m ringmpi reliability --write docs/reliability.md --big": (
        "rewrites its page; about 6 minutes plus 2.5 GiB at 2 ranks"
    ),
}

# Input a command reads that only a skipped command writes: made first by a small run.
PREPARED: dict[str, str] = {
    # the sbatch jobs' JSON
    "python -m ringmpi report results/*.json --markdown --plot results.png": (
        "mkdir -p results && mpirun -n 2 python -m ringmpi.allreduce -b 8 -e 4K -f 8 -n 3 -w 1 "
        "--json results/single-node.json"
    ),
}

_WRONG = re.compile(r"wrong elements(?: in total:)?\s*(\d+)")


def wrong_counts(output: str) -> list[int]:
    """Every count of wrong elements the output reports: its totals, and each row's
    ``#wrong`` column (right-aligned under its header)."""
    counts = [int(n) for n in _WRONG.findall(output)]
    end = None
    for line in output.splitlines():
        if "#wrong" in line:
            end = line.index("#wrong") + len("#wrong")
        elif end is not None and re.match(r"\s*\d", line):  # a row of the table
            field = line[:end].split()[-1:] if len(line) >= end and line[end - 1] != " " else []
            counts += [int(f) for f in field if f.isdigit()]
    return counts


def _strip_comment(line: str) -> str:
    """The line without its trailing ``# comment`` (a ``#`` starting a word, unquoted)."""
    quote = ""
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands_in(markdown: str) -> list[tuple[int, str]]:
    """(line number, command) for each command of a page, in order."""
    lines = markdown.splitlines()
    found: list[tuple[int, str]] = []
    fence = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if fence is None:
            m = re.match(r"^```(\w*)\s*$", line)
            if m:
                fence = m.group(1)
            i += 1
            continue
        if line.startswith("```"):
            fence = None
            i += 1
            continue
        start = i
        if fence in ("sh", "bash", "shell"):
            text = line
        elif fence == "" and line.startswith("$ "):
            text = line[2:]
        else:
            i += 1
            continue
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + lines[i]
        i += 1
        command = _strip_comment(text).strip()
        if command:
            found.append((start + 1, command))
    return found


def _key(command: str) -> str:
    return " ".join(command.split())


ALL = [(page, line, command) for page in PAGES for line, command in commands_in(page.read_text())]
RUN = [(p, n, c, [q for q, _, _ in ALL[:i]].count(p)) for i, (p, n, c) in enumerate(ALL)
       if _key(c) not in SKIPPED]  # fmt: skip


def _venv() -> Path:
    if sys.prefix == sys.base_prefix:
        pytest.skip("not run from a virtual environment")
    return Path(sys.prefix)


@pytest.fixture(scope="session")
def scratch(tmp_path_factory) -> Path:
    """A copy of the repository's files (the package itself stays installed), with .venv."""
    root = tmp_path_factory.mktemp("checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            text=True, check=False)  # fmt: skip
    names = [n for n in listed.stdout.split("\0") if n] if listed.returncode == 0 else []
    if not names:
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                 if p.is_file() and not any(s.startswith(".") for s in p.relative_to(REPO).parts)]  # fmt: skip
    for name in names:
        if name.startswith("ringmpi/") or not (REPO / name).is_file():
            continue
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, root / name)
    (root / ".venv").symlink_to(_venv(), target_is_directory=True)
    return root


_START_ENV = dict(os.environ)  # as the session started (a test may set a variable later)


def _activated(scratch: Path) -> dict[str, str]:
    """The session's environment after ``. .venv/bin/activate``; auto's online tuner on,
    as a user has it, keeping its choices in the scratch copy, not the user's cache;
    temporary files in the copy too."""
    venv = _venv()
    env = dict(_START_ENV)
    env["RINGMPI_TUNER"] = str(scratch / ".tuner")
    (scratch / ".tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(scratch / ".tmp")  # what $(mktemp -d) makes goes with the copy
    env.pop("PYTHONHOME", None)
    env["VIRTUAL_ENV"] = str(venv)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("NUMBA_NUM_THREADS", "1")  # as make test runs everything
    return env


_state: dict[Path, tuple[int, dict[str, str]]] = {}  # page -> (commands run, environment)
_done: dict[tuple[str, tuple], Path] = {}  # (command, settings) that passed -> page


def _bash(command: str, cwd: Path, env: dict[str, str], saved: Path):
    """Run ``command`` as written; save the environment it leaves (``set -a``: its
    assignments too) for the page's next command."""
    script = f'set -a\n{command}\n__status=$?\nenv -0 > "{saved}"\nexit $__status\n'
    proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{command!r} ran past {TIMEOUT} s:\n{out[-3000:]}")
    return proc.returncode, out


def _check(command: str, cwd: Path, env: dict[str, str]) -> dict[str, str]:
    saved = cwd / ".env-after"
    start = time.monotonic()
    status, out = _bash(command, cwd, env, saved)
    took = time.monotonic() - start
    assert status == 0, f"{command!r} exited {status} after {took:.0f} s:\n{out[-4000:]}"
    assert not any(wrong_counts(out)), f"{command!r} reported wrong elements:\n{out[-4000:]}"
    print(f"{took:6.1f} s  {command}")
    after = dict(s.split("=", 1) for s in saved.read_text().split("\0") if "=" in s)
    saved.unlink()
    for noise in ("_", "SHLVL", "PWD", "OLDPWD", "__status"):
        after.pop(noise, None)
    return after


_ACTIVATION = {"PATH", "PS1", "VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT", "_OLD_VIRTUAL_PATH",
               "_OLD_VIRTUAL_PS1", "_OLD_VIRTUAL_PYTHONHOME"}  # fmt: skip


def _settings(env: dict[str, str], scratch: Path) -> tuple:
    """What a page set beyond the activated environment: a repeated command with the
    same settings runs once."""
    base = _activated(scratch)
    own = {k: v for k, v in env.items() if k not in _ACTIVATION and base.get(k) != v}
    return tuple(sorted((k, v) for k, v in own.items() if not k.startswith("BASH_FUNC_")))


def _run_through(page: Path, index: int, cwd: Path) -> None:
    """Run the page's commands up to its ``index``-th, those not run yet, in order."""
    commands = [c for p, _, c in ALL if p == page]
    done, env = _state.get(page, (0, _activated(cwd)))
    for i in range(done, index + 1):
        command = commands[i]
        if _key(command) in SKIPPED:
            continue
        key = (_key(command), _settings(env, cwd))
        if key in _done:  # the same command with the same settings, on an earlier page
            continue
        if _key(command) in PREPARED:
            _check(PREPARED[_key(command)], cwd, env)
        env = _check(command, cwd, env)
        _done[key] = page
        _state[page] = (i + 1, env)
    _state[page] = (index + 1, env)


@pytest.mark.parametrize(
    ("page", "index"), [(p, i) for p, _, _, i in RUN], ids=[f"{p.name}:{n}" for p, n, _, _ in RUN]
)
def test_command_runs(page, index, scratch):
    _run_through(page, index, scratch)


def test_every_command_is_run_or_listed():
    """SKIPPED lists only commands some page has; every other command is run above."""
    keys = {_key(c) for _, _, c in ALL}
    assert not set(SKIPPED) - keys, f"no page has {sorted(set(SKIPPED) - keys)}"
    assert not set(PREPARED) - keys, f"no page has {sorted(set(PREPARED) - keys)}"
    assert len(RUN) + sum(_key(c) in SKIPPED for _, _, c in ALL) == len(ALL)
    assert RUN
    for page in PAGES:  # a page with commands says where they run
        if any(p == page and _key(c) not in SKIPPED for p, _, c in ALL):
            assert ".venv/bin/activate" in page.read_text(), page.name


def test_examples_extra_installed():
    """The README's example asks for the examples extra; the test extra has it too."""
    import importlib.util

    assert importlib.util.find_spec("sklearn") is not None, "pip install -e '.[mpich,test]'"


def test_commands_are_parsed():
    page = (
        "```sh\n"
        "mpirun -n 2 python x.py \\\n"
        "    --plot a.png   # a comment\n"
        "# only a comment\n"
        "A=1 echo '#x' \"#y\" $# a#b  # c\n"
        "```\n"
        "```\n$ python -m ringmpi schedule 4\noutput\n```\n"
        "```python\nprint(1)\n```\n"
    )
    table = "# x: wrong elements 0\n#wrong steps\n     0     6\n     2     6\nsee 7\n"
    assert wrong_counts(table) == [0, 0, 2]
    assert commands_in(page) == [
        (2, "mpirun -n 2 python x.py     --plot a.png"),
        (5, "A=1 echo '#x' \"#y\" $# a#b"),
        (8, "python -m ringmpi schedule 4"),
    ]
