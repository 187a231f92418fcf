"""What a user types: every module run as a program, every flag's help, every command's
refusals, and their help said once under mpirun."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringmpi.tools import report
from ringmpi.tools._args import plain
from ringmpi.tools._registry import _registry
from ringmpi.tools._units import format_size, parse_count

PY = sys.executable
ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ringmpi"
ENV = {**os.environ, "NUMBA_NUM_THREADS": "1"}


def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, *argv], capture_output=True, text=True, timeout=timeout, env=ENV)


def ringmpi(*args: str) -> subprocess.CompletedProcess:
    return run("-m", "ringmpi", *args)


# --- a module run as a program says where its tool went ----------------------------

# The public modules, each with the commands its tail names (none: it points to the list).
# The entries that are programs: ringmpi/__main__.py and ringmpi/allreduce.py.
_PROGRAMS = {"ringmpi/__main__.py", "ringmpi/allreduce.py"}


def _public_modules() -> list:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if path.name.startswith("_") or name in _PROGRAMS:
            continue
        found.append(pytest.param(path, id=name))
    return found


def _tail(path: Path) -> ast.Call | None:
    """The call of the module's ``if __name__ == "__main__":`` block, if it has one."""
    for block in ast.parse(path.read_text()).body:
        if isinstance(block, ast.If) and "__main__" in ast.unparse(block.test):
            calls = [n for n in ast.walk(block) if isinstance(n, ast.Call)]
            return calls[-1] if calls else None
    return None


@pytest.mark.parametrize("path", _public_modules())
def test_every_public_module_run_as_a_program_names_its_tool(path):
    call = _tail(path)
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    assert call is not None, f"python -m {module} would exit 0 doing nothing"
    assert ast.unparse(call.func) == "not_a_program"
    named = [ast.literal_eval(a) for a in call.args]
    assert set(named) <= set(_registry), named


@pytest.mark.parametrize(
    ("module", "args", "said"),
    [
        ("ringmpi.schedule", ["4"], "the tool is `python -m ringmpi schedule 4`"),
        ("ringmpi.kernels", ["--warm"], "the tool is `python -m ringmpi kernels --warm`"),
        ("ringmpi.buckets", [], "the tool is `python -m ringmpi buckets`"),
        ("ringmpi.tools.schedule", ["4"], "the tool is `python -m ringmpi schedule 4`"),
        ("ringmpi.tools.halves", [], "the tools are `python -m ringmpi reduce_scatter` and "
         "`python -m ringmpi allgather`"),
        ("ringmpi.plans", [], "`python -m ringmpi --help` lists the tools"),
    ],
)  # fmt: skip
def test_a_module_run_as_a_program_exits_2_saying_where_the_tool_is(module, args, said):
    p = run("-m", module, *args)
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr == f"{module} is a module of ringmpi, not a program: {said}\n"


def test_importing_the_modules_runs_nothing():
    p = run("-c", "import ringmpi.schedule, ringmpi.kernels, ringmpi.buckets, ringmpi.plans")
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")


# --- every command's help: plain text, every flag explained with its default --------

_PARSERS = """
import argparse, json
from ringmpi.tools._registry import _registry

class Built(Exception):
    pass

def built(parser, args=None, namespace=None):
    raise Built(parser)

argparse.ArgumentParser.parse_args = built
found = {}
for name, command in _registry.items():
    try:
        command([])
    except Built as got:
        parser = got.args[0]
    formatter = parser._get_formatter()
    found[name] = {"description": parser.description, "flags": [
        ["/".join(a.option_strings), formatter._expand_help(a) if a.help else "",
         a.default if isinstance(a.default, (int, float, str, list)) else None,
         getattr(a.type, "__name__", "")]
        for a in parser._actions if a.option_strings and a.dest != "help"]}
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def parsers() -> dict:
    """Every command's description and, for each flag, (flags, help as printed,
    default, type's name), from the parsers the commands build."""
    p = run("-c", _PARSERS, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def test_every_flag_has_a_help_text_that_shows_its_default(parsers):
    assert set(parsers) == set(_registry)
    missing = []
    for command, parser in parsers.items():
        for flags, text, default, kind in parser["flags"]:
            if default in (None, False):
                shown = True
            else:
                values = default if isinstance(default, list) else [default]
                value = " ".join(format_size(v) if kind == "parse_size" else str(v)
                                 for v in values)  # fmt: skip
                shown = f"default {value}" in text or f"({value})" in text
            if not text or not shown:
                missing.append(f"{command} {flags}: {text!r}")
    assert missing == []


def test_the_halves_describe_themselves(parsers):
    rs, ag = parsers["reduce_scatter"]["description"], parsers["allgather"]["description"]
    assert "reduce-scatter" in rs and "all-gather" in ag


def test_plain_turns_rest_into_what_a_terminal_shows():
    text = "Run ``python -m ringmpi shm``: see :func:`~ringmpi.plans.simulate`, *stale*::"
    assert plain(text) == "Run `python -m ringmpi shm`: see `simulate`, stale:"
    assert (
        plain(":mod:`ringmpi.tuning` and ``mpich_shm_*``") == "`ringmpi.tuning` and `mpich_shm_*`"
    )


def test_no_command_lists_the_commands():
    p = ringmpi()
    assert p.returncode == 2
    assert p.stdout == ""
    listed = p.stderr.split("commands:\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[0] for line in listed] == list(_registry)
    assert p.stderr.endswith("no command given: name one of the commands above, e.g. "
                             "`python -m ringmpi schedule 4`\n")  # fmt: skip


# --- sizes and counts with suffixes; flags that would be ignored ---------------------


@pytest.mark.parametrize(("text", "count"), [("1000", 1000), ("1K", 1024), ("4M", 4 << 20),
                                             ("2 g", 2 << 30)])  # fmt: skip
def test_a_count_takes_a_suffix(text, count):
    assert parse_count(text) == count


def test_schedule_counts_and_kernels_bytes_take_suffixes():
    p = ringmpi("schedule", "4", "--count", "1K", "--no-steps")
    assert p.returncode == 0, p.stderr
    assert "cost for N=4, buffer of 1024 elements" in p.stdout
    p = ringmpi("kernels", "--bytes", "1M", "--reps", "1")
    assert p.returncode == 0, p.stderr
    assert "float32, 1 MiB, median of 1" in p.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["schedule", "4", "--count", "1KB"], "argument --count: not a count: '1KB'"),
        (["kernels", "--bytes", "2"], "--bytes 2: at least 4 (one float32)"),
        (["kernels", "--reps", "0"], "argument --reps: must be 1 or more, not 0"),
        (["scaling", "-b", "1K"], "-b/--minbytes applies to --pingpong only"),
        (["scaling", "-e", "1M"], "-e/--maxbytes applies to --pingpong only"),
        (["scaling", "--rounds", "3"], "--rounds applies to --pingpong only"),
        (["scaling", "--nodes", "8"], "--nodes applies to --simulate only"),
        (["choices", "-b", "64", "-e", "8"], "-b/--minbytes 64 is larger than -e/--maxbytes 8"),
        (["shm", "--dir", "/nonexistent"], "--dir /nonexistent: no such directory"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(args, said):
    p = ringmpi(*args)
    assert p.returncode == 2
    assert p.stdout == ""
    assert f"python -m ringmpi {args[0]}: error: {said}" in p.stderr


# --- what the tools print -------------------------------------------------------------


def _result(path: Path, library: str, rows: list[tuple[int, str, float]]) -> str:
    header = {"ranks": 2, "nodes": 1, "mpi_library": library}
    path.write_text(json.dumps({"header": header, "rows": [
        {"size": s, "algorithm": a, "time_us": t, "busbw_GBs": 0.0, "wrong": 0, "steps": None}
        for s, a, t in rows]}))  # fmt: skip
    return str(path)


def test_versus_counts_in_words(tmp_path, capsys):
    one = _result(tmp_path / "a.json", "MPICH", [(8, "auto(ring)", 2.0), (8, "mpi4py", 1.0)])
    assert report.main(["--versus", one]) == 0
    assert capsys.readouterr().out.endswith("\n1 size, 1 library; wrong elements in total: 0\n")
    two = _result(tmp_path / "b.json", "Open MPI", [(8, "auto(ring)", 2.0), (8, "mpi", 1.0),
                                                    (64, "auto(ring)", 2.0), (64, "mpi", 1.0)])  # fmt: skip
    assert report.main(["--versus", one, two]) == 0
    assert capsys.readouterr().out.endswith("\n2 sizes, 2 libraries; wrong elements in total: 0\n")


# --- under mpirun: said once ----------------------------------------------------------


def _mpirun() -> list[str]:
    from ringmpi.tools import reliability

    try:
        return reliability.mpirun()
    except FileNotFoundError:
        pytest.skip("no mpirun")


@pytest.mark.family  # it starts mpirun
@pytest.mark.parametrize(
    ("args", "status", "said"),
    [
        (["-m", "ringmpi", "--help"], 0, "usage: python -m ringmpi <command>"),
        (["-m", "ringmpi", "reduce_scatter", "--help"], 0, "usage: python -m ringmpi reduce_"),
        (["-m", "ringmpi", "schedule", "4", "--count", "x"], 2, "error: argument --count"),
        (["-m", "ringmpi.kernels"], 2, "the tool is `python -m ringmpi kernels`"),
        (["-m", "ringmpi.allreduce", "--help"], 0, "usage: python -m ringmpi.allreduce"),
    ],
)
def test_under_mpirun_help_and_errors_are_said_once(args, status, said):
    p = subprocess.run([*_mpirun(), "-n", "3", PY, *args], capture_output=True, text=True,
                       timeout=180, env=ENV)  # fmt: skip
    assert p.returncode == status, p.stderr
    assert (p.stdout + p.stderr).count(said) == 1, p.stdout + p.stderr


@pytest.mark.family  # it starts mpirun
def test_the_trace_title_says_the_size_in_words():
    p = subprocess.run([*_mpirun(), "-n", "2", PY, "-m", "ringmpi", "trace", "-b", "1M"],
                       capture_output=True, text=True, timeout=240, env=ENV)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "# ring, 1 MiB of float32, 2 ranks: wrong elements 0" in p.stdout


def test_the_package_imports_from_the_folder_that_holds_the_clone(tmp_path):
    """From the folder that holds a clone named ringmpi, Python finds that folder first
    on sys.path (the working directory); the install must still give the package, not
    the clone as an empty namespace package (the Makefile's editable installs)."""
    (tmp_path / "ringmpi").symlink_to(ROOT, target_is_directory=True)
    p = subprocess.run([PY, "-c", "import ringmpi; print(ringmpi.__version__, ringmpi.__file__)"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    version, path = p.stdout.split()
    assert version == __import__("ringmpi").__version__
    assert Path(path).resolve() == PACKAGE / "__init__.py"
