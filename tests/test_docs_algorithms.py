"""The docs' lists of algorithms name exactly the registry's algorithms, no more, no fewer.

Each list is found by its anchor text (a sentence, a table's header or row) and read
strictly: a name missing from a list, a name that no algorithm has, or an anchor that
is no longer there fails. The registry is read in a child process that never
initializes MPI, so this file is MPI-free and starts no mpirun.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
CLI = REPO / "docs" / "cli.md"
CHOOSING = REPO / "docs" / "choosing.md"
API = REPO / "docs" / "api.md"

# A name as the docs write it: `ring` (BARE) or, as a Python string, `"ring"` (QUOTED).
BARE = re.compile(r"`([a-z][a-z0-9_]*)`")
QUOTED = re.compile(r'`"([a-z][a-z0-9_]*)"`')

_REGISTRY = """
import json, mpi4py
mpi4py.rc.initialize = False  # the registry, without starting MPI
from ringmpi import algorithms
from ringmpi.tools import allreduce
print(json.dumps({"names": algorithms.names(), "half": algorithms.half_algorithms(),
                  "all": allreduce._names("all"), "raw": allreduce.RAW}))
"""


@pytest.fixture(scope="module")
def registry() -> dict:
    """names(): every name ``algorithm=`` takes, auto first; half: the algorithms with
    a half-type path; all: what the benchmark's ``-a all`` runs; raw: its mpi4py row."""
    p = subprocess.run([sys.executable, "-c", _REGISTRY], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def _after(text: str, anchor: str, where: str) -> str:
    """``text`` from ``anchor`` on; fails naming the page where the anchor is gone."""
    at = text.find(anchor)
    if at < 0:
        pytest.fail(f"{where}: no {anchor!r}: the list this test reads has moved; update it")
    assert text.find(anchor, at + 1) < 0, f"{where}: {anchor!r} twice"
    return text[at:]


def _paragraph(text: str, anchor: str, where: str) -> str:
    """The paragraph (up to a blank line) that starts at ``anchor``."""
    return _after(text, anchor, where).split("\n\n", 1)[0]


def _table(text: str, header: str, where: str) -> list[list[str]]:
    """The rows under the table header line ``header``, each a list of its cells."""
    lines = _after(text, header, where).splitlines()
    assert re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[1]), f"{where}: {header!r} is no table"
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == header.count("|") - 1, f"{where}: a row of other cells: {line}"
        rows.append(cells)
    assert rows, f"{where}: the table under {header!r} has no rows"
    return rows


def _same(found: list[str], expected: list[str], where: str) -> None:
    """Each expected name once, and no other (the order is the page's own)."""
    extra = sorted(set(found) - set(expected))
    missing = [n for n in expected if n not in found]
    twice = sorted(n for n, k in Counter(found).items() if k > 1)
    assert not (extra or missing or twice), (
        f"{where}: names no algorithm: {extra}; leaves out: {missing}; twice: {twice}"
    )


def test_readme_names_every_algorithm(registry):
    text = _paragraph(README.read_text(), "`algorithm=` names an algorithm:", "README.md")
    sentence = text.split("The `RINGMPI_ALGORITHM`", 1)[0]
    _same(QUOTED.findall(sentence), registry["names"], "README.md, algorithm=")


def test_cli_algorithm_flag_names_every_algorithm(registry):
    rows = _table(CLI.read_text(), "| flag | meaning | default |", "docs/cli.md")
    found = [cells for cells in rows if cells[0] == "`-a`, `--algorithm`"]
    assert len(found) == 1, "docs/cli.md: no row (or several) for `-a`, `--algorithm`"
    meaning = found[0][1]
    # What `all` runs is listed before it: auto, ringmpi's own, mpi, mpi4py.
    listed, _, rest = meaning.partition("or `all` (all of these)")
    assert rest, "docs/cli.md, -a: no 'or `all` (all of these)' after the names it runs"
    assert set(BARE.findall(listed)) - {"all"} == set(registry["all"]), (
        f"docs/cli.md, -a: before `all`: {sorted(set(BARE.findall(listed)))}, "
        f"but -a all runs {registry['all']}"
    )
    # Every name the row gives is an algorithm (or mpi4py, or all), and every one is given.
    names = set(BARE.findall(meaning)) - {registry["raw"], "all"}
    _same(sorted(names), registry["names"], "docs/cli.md, -a")


def test_choosing_table_names_every_algorithm(registry):
    rows = _table(CHOOSING.read_text(), "| algorithm | use it for | costs |", "docs/choosing.md")
    found = [name for cells in rows for name in BARE.findall(cells[0])]
    _same(found, registry["names"], "docs/choosing.md, When to name one")


def test_api_algorithm_argument_names_every_algorithm(registry):
    bullet = _after(API.read_text(), "- `algorithm`:", "docs/api.md")
    bullet = re.split(r"\n- `", bullet[1:], maxsplit=1)[0]  # up to the next argument
    _same(sorted(set(QUOTED.findall(bullet))), registry["names"], "docs/api.md, algorithm")


def test_api_unknown_algorithm_error_is_the_registrys(registry):
    rows = _table(API.read_text(), "| mistake | error |", "docs/api.md")
    found = [cells[1] for cells in rows if cells[0] == "unknown algorithm"]
    assert len(found) == 1, "docs/api.md, Errors: no row (or several) for an unknown algorithm"
    message = re.fullmatch(r"`ValueError: algorithm: unknown name … \(known: ([a-z0-9_, ]+)\)`",
                           found[0])  # fmt: skip
    assert message, f"docs/api.md, Errors: not the lookup's message: {found[0]}"
    # The message lists registry.names() in its order: the page shows it as printed.
    assert message[1].split(", ") == registry["names"]


def test_api_half_table_names_every_algorithm(registry):
    rows = _table(API.read_text(), "| algorithm | half types | how |", "docs/api.md")
    _same([n for cells in rows for n in BARE.findall(cells[0])], registry["names"],
          "docs/api.md, Half precision")  # fmt: skip
    takes = [n for cells in rows if cells[1].startswith("yes") for n in BARE.findall(cells[0])]
    _same(takes, ["auto", *registry["half"]], "docs/api.md, Half precision, those that take them")


def test_every_quoted_lookup_error_lists_the_registry(registry):
    """Wherever a page quotes the unknown-algorithm error (reliability.md's table of
    bad input, api.md's), its list is the registry's names, in its order."""
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    quoted = [(page.name, m[1]) for page in pages for m in re.finditer(
        r"algorithm: unknown name '[a-z_]+' \(known: ([a-z0-9_, ]+)\)", page.read_text())]  # fmt: skip
    assert quoted, "no page quotes the unknown-algorithm error in full"
    for name, known in quoted:
        assert known.split(", ") == registry["names"], f"docs/{name}: {known}"
