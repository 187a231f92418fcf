"""The package's shape: imports without cycles, no tool imported by the library, no
process-wide side effect of importing it, and the docs' code map matching its files."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ringmpi"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path) -> set[str]:
    """The package's modules that module ``name`` imports (anywhere in it, lazily too;
    not under ``if TYPE_CHECKING:``). ``from pkg import x`` imports ``pkg.x`` where that
    is a module, else ``pkg``; a submodule's own package is not counted."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = {id(n) for t in ast.walk(tree) if _type_checking(t) for n in ast.walk(t)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "ringmpi"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                where = ".".join(base + ([node.module] if node.module else []))
            else:
                where = node.module or ""
            if where.split(".")[0] != "ringmpi":
                continue
            for alias in node.names:
                sub = f"{where}.{alias.name}"
                found.add(sub if sub in MODULES else where)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle() -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(GRAPH[m]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_walker_sees_the_imports():
    assert "ringmpi._engine" in GRAPH["ringmpi.algorithms.ring"]
    assert "ringmpi.algorithms.registry" in GRAPH["ringmpi.algorithms.ring"]
    assert {"ringmpi.algorithms.ring", "ringmpi.tuning"} <= GRAPH["ringmpi.algorithms"]


def test_no_import_cycle_inside_the_package():
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle)


def test_the_registry_imports_no_algorithm():
    algorithms = {m for m in MODULES if m.startswith("ringmpi.algorithms.")}
    assert not GRAPH["ringmpi.algorithms.registry"] & algorithms


# The command lines' entries: they only hand over to ringmpi.tools.
ENTRIES = ("ringmpi.__main__", "ringmpi.allreduce")


def test_no_library_module_imports_a_tool():
    for name, deps in GRAPH.items():
        if not name.startswith("ringmpi.tools") and name not in ENTRIES:
            tools = sorted(d for d in deps if d.startswith("ringmpi.tools"))
            assert not tools, f"{name} imports {tools}"


def test_importing_and_a_first_call_leave_os_environ_alone():
    code = (
        "import os, numpy as np; kind = type(os.environ); import ringmpi; "
        "assert ringmpi.allreduce(np.arange(3.0)).tolist() == [0.0, 1.0, 2.0]; "
        "assert type(os.environ) is kind, type(os.environ); print('same', kind.__name__)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["same", "_Environ"]


def test_the_code_map_names_every_module():
    """docs/how-it-works.md's code map lists exactly the package's files."""
    text = (ROOT / "docs" / "how-it-works.md").read_text()
    section = text.split("\n## Code map\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(ringmpi/[\w/]+\.py)`", section))
    files = {str(p.relative_to(ROOT)) for p in MODULES.values()}
    assert listed == files, (
        f"missing from the map: {sorted(files - listed)}; no such file: {sorted(listed - files)}"
    )
