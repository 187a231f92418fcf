"""The tools apart from the library: ``python -m ringmpi <command>`` (no MPI)."""

from __future__ import annotations

import argparse
import ast
import glob
import importlib
import subprocess
import sys
from collections import Counter
from itertools import permutations
from pathlib import Path

import pytest

from ringmpi._host import last_level_cache
from ringmpi.tools._units import buffer_sets, format_size, interleaved, parse_size

PY = sys.executable
PACKAGE = Path(__file__).resolve().parent.parent / "ringmpi"
COMMANDS = ("allreduce", "reduce_scatter", "allgather", "schedule", "tune", "scaling", "choices", "trace", "shm",
            "report", "reliability", "buckets", "kernels")  # fmt: skip
REST = ("``", ":func:", ":mod:", ":meth:", ":data:", "::\n")  # reST that argparse would print raw


def ringmpi(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "ringmpi", *args], capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_help_lists_every_command_with_its_summary():
    p = ringmpi("--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: python -m ringmpi <command> [args]")
    listed = p.stdout.split("commands:\n")[1].splitlines()
    assert [line.split()[0] for line in listed] == list(COMMANDS)
    assert all(len(line.split()) > 2 for line in listed)  # a summary after each name
    assert not [markup for markup in REST if markup in p.stdout]


def test_the_console_script_is_the_same_entry():
    script = Path(PY).parent / "ringmpi"
    p = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout == ringmpi("--help").stdout


def test_one_version():
    import importlib.metadata

    import ringmpi as package

    assert importlib.metadata.version("ringmpi") == package.__version__
    pyproject = (PACKAGE.parent / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and '\nversion = "' not in pyproject


def test_help_imports_no_tool():
    code = ("import sys\nfrom ringmpi.tools import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            f"tools = [f'ringmpi.tools.{{c}}' for c in {(*COMMANDS, 'halves', 'timeline')!r}]\n"
            "print(sorted(m for m in sys.modules if m.startswith(('numba', 'mpi4py')) "
            "or m in tools))")  # fmt: skip
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "[]"


@pytest.mark.family  # a singleton of the family's MPI
@pytest.mark.parametrize(("argv", "started"), [
    (["schedule", "4"], False),  # run as the program: MPI loaded, not started
    (["choices"], False),
    (["shm"], False),
    (["kernels", "--warm"], False),
    (["allreduce", "-b", "8", "-e", "8", "-n", "1", "-w", "0"], True),  # it communicates
])  # fmt: skip
def test_a_command_that_does_not_communicate_does_not_start_mpi(argv, started):
    code = ("import sys\nfrom ringmpi.tools import main\n"
            f"sys.argv = ['ringmpi', *{argv!r}]\nassert main() == 0\n"
            "from mpi4py import MPI\nprint(MPI.Is_initialized())")  # fmt: skip
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == str(started)


def test_called_in_process_a_command_leaves_mpi_as_it_would_be():
    # a caller's own program goes on to communicate: main(argv) changes nothing
    code = ("from ringmpi.tools import main\nassert main(['schedule', '4']) == 0\n"
            "from mpi4py import MPI\nprint(MPI.Is_initialized(), MPI.COMM_WORLD.Get_size())")  # fmt: skip
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "True 1"


def test_a_tool_is_its_module():
    from ringmpi.tools import reliability, report

    assert report.__name__ == "ringmpi.tools.report" and callable(reliability.mpirun)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_its_own_help(command):
    p = ringmpi(command, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: python -m ringmpi {command} ")
    assert not [markup for markup in REST if markup in p.stdout]


def test_an_unknown_command_is_refused():
    p = ringmpi("bogus")
    assert p.returncode == 2
    assert "invalid choice: 'bogus'" in p.stderr


def test_the_design_cards_command_still_runs():
    p = subprocess.run([PY, "-m", "ringmpi.allreduce", "--help"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("usage: python -m ringmpi.allreduce ")
    assert "--minbytes" in p.stdout


def test_the_entry_is_not_a_module_and_the_function_stays():
    with pytest.raises(ImportError, match=r"ringmpi\.tools\.allreduce"):
        importlib.import_module("ringmpi.allreduce")
    import ringmpi as package

    assert callable(package.allreduce)
    assert "ringmpi.allreduce" not in sys.modules


def _imported(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import of ``source``, a module of ``package``, relative
    ones resolved; leaving out what an ``if __name__ == "__main__":`` block imports
    (a program's entry, not the module's)."""
    tree = ast.parse(source)
    entries = {
        id(node)
        for block in tree.body
        if isinstance(block, ast.If) and "__main__" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in entries:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found += [(node.lineno, base)]
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _package(path: Path) -> str:
    """The package a module file belongs to: ringmpi/algorithms/ring.py, ringmpi.algorithms."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts if path.name == "__init__.py" else parts[:-1])


def _a_tool(name: str) -> bool:
    return name == "ringmpi.tools" or name.startswith("ringmpi.tools.")


def test_no_library_module_imports_a_tool():
    tools = PACKAGE / "tools"
    library = [p for p in sorted(PACKAGE.rglob("*.py")) if tools not in p.parents]
    library.remove(PACKAGE / "__main__.py")  # the tools' entry
    assert PACKAGE / "buckets.py" in library and PACKAGE / "schedule.py" in library
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in library
        for line, name in _imported(path.read_text(), _package(path))
        if _a_tool(name)
    ]
    assert bad == []


@pytest.mark.parametrize(
    ("source", "package"),
    [
        ("from ..tools import _units", "ringmpi.algorithms"),
        ("from ..tools._units import parse_size", "ringmpi.algorithms"),
        ("from . import tools", "ringmpi"),
        ("from .tools import allreduce", "ringmpi"),
        ("import ringmpi.tools.report", "ringmpi"),
        ("from ringmpi import tools", "ringmpi.algorithms"),
        ("def f():\n    from .tools import buckets", "ringmpi"),
    ],
)
def test_the_check_sees_every_way_to_import_a_tool(source, package):
    assert any(_a_tool(name) for _, name in _imported(source, package))


def test_the_check_lets_an_entry_run_a_tool():
    source = 'if __name__ == "__main__":\n    from ringmpi.tools.kernels import main\n'
    assert not any(_a_tool(name) for _, name in _imported(source, "ringmpi"))
    assert not any(_a_tool(n) for _, n in _imported("from . import _api, tuning", "ringmpi"))


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [("8", 8), ("64K", 64 << 10), ("16M", 16 << 20), ("1GiB", 1 << 30), ("4 kb", 4096)],
)
def test_one_size_parser(text, nbytes):
    assert parse_size(text) == nbytes


def test_a_size_that_is_not_one():
    with pytest.raises(argparse.ArgumentTypeError, match="not a size: 'lots'"):
        parse_size("lots")


@pytest.mark.parametrize(
    ("nbytes", "short", "long"),
    [(8, "8", "8 B"), (3000, "3000", "3000 B"), (64 << 10, "64K", "64 KiB"),
     (3 << 20, "3M", "3 MiB"), (1 << 30, "1G", "1 GiB"), ((1 << 20) + 1024, "1025K", "1025 KiB")],
)  # fmt: skip
def test_one_size_formatter(nbytes, short, long):
    assert format_size(nbytes) == short
    assert format_size(nbytes, long=True) == long
    assert parse_size(short) == nbytes


@pytest.mark.parametrize(
    ("nbytes", "cache", "ranks", "most", "sets"),
    [(64 << 20, 260 << 20, 2, 64, 3),  # 2 ranks x 3 x 128 MiB = 768 MiB >= 520 MiB
     (64 << 20, 260 << 20, 4, 64, 2), (1 << 30, 260 << 20, 2, 64, 1),
     (1 << 20, 8 << 20, 2, 64, 4), (8, 260 << 20, 2, 64, 64), (8, 260 << 20, 2, 5, 5),
     (0, 1 << 20, 1, 64, 64)],
)  # fmt: skip
def test_off_cache_takes_enough_sets_to_touch_twice_the_cache(nbytes, cache, ranks, most, sets):
    assert buffer_sets(nbytes, cache, ranks, most) == sets
    if sets < most:  # the fewest that do
        assert ranks * sets * 2 * nbytes >= 2 * cache > ranks * (sets - 1) * 2 * nbytes


@pytest.mark.parametrize(("cpus", "count"), [("0", 1), ("0-1", 2), ("0-63,128-191", 128),
                                             ("0,2,4-5", 4)])  # fmt: skip
def test_a_linux_cpu_list_is_counted(cpus, count):
    from ringmpi import _host

    assert _host._count(cpus + "\n") == count


def test_the_last_level_cache_is_what_linux_lists_at_least():
    listed = glob.glob("/sys/devices/system/cpu/cpu0/cache/index[0-9]*/size")
    if not listed:
        pytest.skip("this system lists no caches")
    largest = max(parse_size(Path(f).read_text().strip()) for f in listed)
    assert last_level_cache() >= largest > 0


def test_choices_are_the_models_pick_where_each_can_run(capsys):
    from conftest import auto_choice

    from ringmpi import algorithms, tuning
    from ringmpi.algorithms import hierarchical
    from ringmpi.tools import choices

    sizes = [8, 8 << 10, 1 << 20, 64 << 20]
    got = choices.choices([(1, 4), (8, 8)], sizes)
    one_node = algorithms.candidates()
    several = [a for a in one_node if not algorithms.get(a).one_node]
    assert got[1, 4] == [auto_choice(tuning.load(4), n, 4, 1, 4, one_node) for n in sizes]
    for n, pick in zip(sizes, got[8, 8], strict=True):
        want = auto_choice(tuning.load(8), n, 64, 8, 8, several)
        if want == "hierarchical":
            want += "/" + hierarchical.across_nodes(n / 8, 8, 8)
        assert pick == want
    assert "shared_memory" not in got[8, 8] and got[8, 8][-1].startswith("hierarchical/")
    assert choices.main(["--layouts", "1x2,2x2", "-b", "8", "-e", "32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["size", "1x2", "2x2"] and len(lines) == 3
    for bad in ("1x1", "8y8"):
        with pytest.raises(SystemExit):
            choices.main(["--layouts", bad])


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 11])
def test_interleaved_rows_never_follow_themselves_and_prime_counts_balance(rows):
    """Each round runs every row once; over 2(rows-1) rounds, seams included, no row
    follows itself (but a lone row), and at a prime count each ordered pair of rows
    follows equally often: twice."""
    rounds = [interleaved(rows, i) for i in range(max(1, 2 * (rows - 1)))]
    assert all(sorted(r) == list(range(rows)) for r in rounds)
    calls = [row for r in rounds for row in r]
    after = Counter(zip(calls, calls[1:] + calls[:1], strict=True))  # seams: the last to the first
    assert all(a != b for a, b in after) or rows == 1
    if rows in (2, 3, 5, 7, 11):
        assert after == dict.fromkeys(permutations(range(rows), 2), 2)
