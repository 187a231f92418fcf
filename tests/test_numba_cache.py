"""Numba's on-disk cache with several writers (ringmpi._numba_cache): each index update
waits for the lock on the cache's folder, so a second process reads the first one's
index before it picks a data file."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

from numba.core import caching

import ringmpi._ops  # a module that compiles: it installs the lock


def test_an_index_update_waits_for_the_folder_lock(tmp_path):
    first = caching.IndexDataCacheFile(str(tmp_path), "f-1.py311", ("stamp", 1))
    second = caching.IndexDataCacheFile(str(tmp_path), "f-1.py311", ("stamp", 1))
    first.save(("sig-a",), b"A")
    held = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    writer = threading.Thread(target=second.save, args=(("sig-b",), b"B"))
    writer.start()
    writer.join(0.5)
    waited = writer.is_alive()
    before = sorted(p.name for p in tmp_path.iterdir())
    os.close(held)
    writer.join(10)
    assert waited and not writer.is_alive()
    assert before == ["f-1.py311.1.nbc", "f-1.py311.nbi"]  # nothing written while it waited
    # the second writer read the first one's index: a data file of its own
    assert first.load(("sig-a",)) == b"A" and second.load(("sig-b",)) == b"B"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "f-1.py311.1.nbc", "f-1.py311.2.nbc", "f-1.py311.nbi"
    ]  # fmt: skip


def test_every_module_that_compiles_installs_the_lock_first():
    """Each ringmpi module that imports Numba imports ringmpi._numba_cache, directly or
    through the package modules it imports (read from the sources: no import here)."""
    import ast
    from pathlib import Path

    root = Path(ringmpi._ops.__file__).parent
    imports: dict[str, set[str]] = {}
    compiles = set()
    for path in root.rglob("*.py"):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        found = imports.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                mods = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            found.update(m for m in mods if m.startswith("ringmpi"))
            compiles |= {name} if any(m.split(".")[0] == "numba" for m in mods) else set()

    def reaches(name: str, seen: set[str]) -> bool:
        if name == "ringmpi._numba_cache":
            return True
        seen.add(name)
        return any(reaches(m, seen) for m in imports.get(name, ()) if m not in seen)

    assert compiles and not [m for m in sorted(compiles) if not reaches(m, set())]


_FIRST_USE = """
import warnings
from ringmpi import _numba_cache, kernels
_numba_cache.SLOW = 0.0  # any run of compiles is slow enough
with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    kernels.reduction(kernels.op_from_name("max"), "int8").warm()
said = [w for w in got if issubclass(w.category, _numba_cache.CompileWarning)]
print(len(said), said[0].filename if said else "-")
"""


def test_a_first_compile_says_so_once_and_a_load_does_not(tmp_path):
    """ringmpi.CompileWarning: once a run of compiles of ringmpi's functions has gone
    on for SLOW seconds, once per process, pointing at the program's own line; loading
    the same functions from the cache says nothing."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    run = [sys.executable, "-c", _FIRST_USE]
    first = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert first.stdout.split() == ["1", "<string>"], first.stdout + first.stderr
    again = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert again.stdout.split() == ["0", "-"], again.stdout + again.stderr
