"""A new engine algorithm is one file: tests/pairwise.py, registered from here, as an
all-reduce and as a reduce-scatter.

It must appear in ``names()`` and in the CLI's ``-a all``, run correctly at every
rank count, be traced, and be what auto chooses when a tuning file makes it the
cheapest; nothing in the package names it.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pairwise
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import algorithms, tuning, verify
from ringmpi._comm import context

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD


@pytest.fixture(autouse=True)
def registered():
    with pairwise.registered():
        yield


def test_it_is_a_name_like_the_others():
    assert "pairwise" in algorithms.names()
    assert "pairwise" in algorithms.candidates()
    assert algorithms.get("pairwise").summary.startswith("Pairwise exchange")


@pytest.mark.parametrize("count", [0, 1, 2, 5, 1009, 100_003])
@pytest.mark.parametrize(("op", "dtype"), [(MPI.SUM, "float32"), (ringmpi.AVG, "float64"),
                                           (MPI.MAX, "int16"), (MPI.PROD, "complex64"),
                                           (MPI.LXOR, "bool")])  # fmt: skip
def test_it_gives_the_exact_result_bitwise_on_every_rank(op, dtype, count):
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    x = verify.verify_inputs(op, dtype, rank, count)
    problems = []
    for in_place in (False, True):
        for _ in range(3):  # the first call, then the repeat path
            if in_place:
                got = x.copy()
                ringmpi.Allreduce(MPI.IN_PLACE, got, op, algorithm="pairwise")
            else:
                got = ringmpi.allreduce(x, op, algorithm="pairwise")
            if verify.count_wrong(got, op, n):
                problems.append(f"in place {in_place}: {verify.count_wrong(got, op, n)} wrong")
            everyone = WORLD.allgather(got.tobytes())
            if len(set(everyone)) != 1:
                problems.append(f"in place {in_place}: the ranks' results differ")
    agree(WORLD, problems)


def test_its_trace_is_the_plans_closed_form():
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    count = 4 * 9 * 5 * 7
    with ringmpi.trace() as t:
        ringmpi.allreduce(np.ones(count, np.float32), algorithm="pairwise")
    want_bytes = 2 * (n - 1) * (count // n) * 4
    peers = {(rank + s) % n for s in range(1, n)}
    got = (t.bytes_sent, t.steps, {e.peer for e in t.events}, {e.algorithm for e in t.events})
    want = (want_bytes, 2 * (n - 1), peers, {"pairwise"} if n > 1 else set())
    agree(WORLD, [] if got == want else [f"traced {got}, closed form {want}"])


def test_it_refuses_the_half_types_with_its_own_reason():
    with pytest.raises(ValueError, match="each step rounds the partial chunk to 16 bits"):
        ringmpi.allreduce(np.ones(4, np.float16), algorithm="pairwise")


def _pairwise_cheapest(tmp_path):
    """A tuning file (one a rank) whose constants make pairwise the cheapest: its step
    free, shared memory dear."""
    costs = tuning.as_dict(tuning.defaults(WORLD.Get_size()))
    costs.update(pairwise_step=0.0, node_call=1.0, shm_wait=1.0, shm_byte=1.0)
    path = tmp_path / f"tuning-{WORLD.Get_rank()}.json"
    path.write_text(json.dumps({"costs": costs, "measured": []}))
    return path


def test_auto_chooses_it_where_a_tuning_file_makes_it_cheapest(tmp_path, settings):
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    path = _pairwise_cheapest(tmp_path)
    comm = WORLD.Dup()
    ctx = context(comm)
    red = ringmpi.kernels.reduction(MPI.SUM, np.float32)
    problems = []
    # untuned, its second a step keeps it out of auto's choice
    for nbytes in (8, 1 << 16, 1 << 22):
        if algorithms.choose("auto", nbytes, ctx, red).name == "pairwise":
            problems.append(f"{nbytes} B untuned: auto chose pairwise")
    settings(tuning=str(path))
    for nbytes in (8, 1 << 16, 1 << 22):
        chosen = algorithms.choose("auto", nbytes, ctx, red).name
        # one rank: every algorithm costs one call, the first registered wins
        want = "pairwise" if n > 1 else "ring"
        if chosen != want:
            problems.append(f"{nbytes} B tuned: auto chose {chosen}, not {want}")
    x = verify.verify_inputs(MPI.SUM, "float32", rank, 1009)
    with ringmpi.trace() as t:
        got = ringmpi.allreduce(x, comm=comm)
    if verify.count_wrong(got, MPI.SUM, n):
        problems.append("auto's pairwise call: wrong result")
    if n > 1 and {e.algorithm for e in t.events} != {"pairwise"}:
        problems.append(f"auto's call traced { ({e.algorithm for e in t.events}) }")
    comm.Free()
    agree(WORLD, problems)


def test_the_command_line_runs_it_in_all(tmp_path, monkeypatch):
    from ringmpi.tools import allreduce as cli

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # the CLI installs its own
    out = tmp_path / "rows.json"
    code = cli.main(["-a", "all", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1",
                     "--budget", "0", "--json", str(out)])  # fmt: skip
    problems = [] if code == 0 else [f"exit code {code}"]
    if WORLD.Get_rank() == 0:
        rows = json.loads(out.read_text())["rows"]
        mine = [(r["size"], r["wrong"], r["steps"]) for r in rows if r["algorithm"] == "pairwise"]
        steps = 2 * (WORLD.Get_size() - 1)
        if mine != [(size, 0, steps) for size in (8, 64, 512, 4096)]:
            problems.append(f"pairwise rows (size, wrong, steps): {mine}")
    agree(WORLD, problems)


# --- the same algorithm as a reduce-scatter: one more record of the same file ---------


def _counts(n: int) -> list[list[int]]:
    """Empty, even, uneven with empty blocks, and uneven large blocks."""
    return [[0] * n, [3] * n, [(r * 7) % 5 for r in range(n)], [1009 + 13 * r for r in range(n)]]


def test_its_reduce_scatter_is_a_name_like_the_others():
    from ringmpi.algorithms import registry

    assert "pairwise" in registry.names("reduce_scatter")
    assert "pairwise" not in registry.names("allgather")
    assert registry.get("pairwise", "reduce_scatter").summary.startswith("Pairwise exchange")


@pytest.mark.parametrize(("op", "dtype"), [(MPI.SUM, "float32"), (ringmpi.AVG, "float64"),
                                           (MPI.MAX, "int16"), (MPI.PROD, "complex64"),
                                           (MPI.LXOR, "bool")])  # fmt: skip
def test_its_reduce_scatter_gives_the_exact_result_bitwise(op, dtype):
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    problems = []
    for counts in _counts(n):
        total, start = sum(counts), sum(counts[:rank])
        x = verify.verify_inputs(op, dtype, rank, total)
        want = verify.verify_expected(op, dtype, n, total)[start : start + counts[rank]]
        want = want.astype(x.dtype).tobytes()
        for in_place in (False, True):
            for call in range(2):
                if in_place:
                    buf = x.copy()
                    ringmpi.Reduce_scatter(MPI.IN_PLACE, buf, counts, op, algorithm="pairwise")
                    got = buf[: counts[rank]]
                else:
                    got = np.empty(counts[rank], x.dtype)
                    ringmpi.Reduce_scatter(x, got, counts, op, algorithm="pairwise")
                if got.tobytes() != want:
                    problems.append(f"counts {counts} in place {in_place} call {call}: wrong")
        if len(set(counts)) == 1:  # the block form
            got = np.empty(counts[0], x.dtype)
            ringmpi.Reduce_scatter_block(x, got, op, algorithm="pairwise")
            if got.tobytes() != want:
                problems.append(f"Reduce_scatter_block, counts {counts}: wrong")
    agree(WORLD, problems)


def test_its_reduce_scatter_trace_is_the_closed_form():
    """Rank r sends every block but its own once, to its owner: N - 1 steps."""
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    counts = [1000 + 7 * r for r in range(n)]
    with ringmpi.trace() as t:
        ringmpi.Reduce_scatter(np.ones(sum(counts), np.float64), np.empty(counts[rank]), counts,
                               algorithm="pairwise")  # fmt: skip
    peers = {(rank + s) % n for s in range(1, n)}
    got = (t.bytes_sent, t.steps, {e.peer for e in t.events}, t.ran)
    want = (8 * (sum(counts) - counts[rank]), n - 1, peers, ["pairwise"])
    agree(WORLD, [] if got == want else [f"traced {got}, closed form {want}"])


def test_its_reduce_scatter_refuses_the_half_types_with_its_own_reason():
    n = WORLD.Get_size()
    with pytest.raises(TypeError, match="each step rounds the partial block to 16 bits"):
        ringmpi.Reduce_scatter_block(np.ones(4 * n, np.float16), np.empty(4, np.float16),
                                     algorithm="pairwise")  # fmt: skip


def test_auto_chooses_its_reduce_scatter_where_a_tuning_file_makes_it_cheapest(tmp_path,
                                                                                settings):  # fmt: skip
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    path = _pairwise_cheapest(tmp_path)
    comm = WORLD.Dup()
    ctx = context(comm)
    red = ringmpi.kernels.reduction(MPI.SUM, np.float32)
    sizes = (1 << 16, 1 << 20, 1 << 24)
    problems = [f"{nbytes} B untuned: auto chose pairwise" for nbytes in sizes
                if algorithms.choose("auto", nbytes, ctx, red, collective="reduce_scatter").name
                == "pairwise"]  # fmt: skip
    settings(tuning=str(path))
    want = "pairwise" if n > 1 else "ring"  # one rank: every algorithm costs one call
    for nbytes in sizes:
        chosen = algorithms.choose("auto", nbytes, ctx, red, collective="reduce_scatter").name
        if chosen != want:
            problems.append(f"{nbytes} B tuned: auto chose {chosen}, not {want}")
    k = 1 << 14  # float32 a block: 64 KiB and more in all, past the library's small calls
    x = verify.verify_inputs(MPI.SUM, "float32", rank, k * n)
    out = np.empty(k, np.float32)
    with ringmpi.trace() as t:
        ringmpi.Reduce_scatter_block(x, out, comm=comm)
    if (
        out.tobytes()
        != verify.verify_expected(MPI.SUM, "float32", n, k * n)[rank * k : (rank + 1) * k]
        .astype(np.float32)
        .tobytes()
    ):
        problems.append("auto's pairwise call: wrong result")
    if t.ran != [want]:
        problems.append(f"auto's call ran {t.ran}")
    comm.Free()
    agree(WORLD, problems)


def test_the_halves_benchmark_lists_and_runs_it_in_all(capsys):
    from ringmpi.tools import halves

    code = halves.main(["-a", "all", "-b", "64K", "-e", "64K", "-n", "1", "-w", "1"],
                       "reduce_scatter")  # fmt: skip
    problems = [] if code == 0 else [f"exit code {code}"]
    if WORLD.Get_rank() == 0:
        rows = [line.split() for line in capsys.readouterr().out.splitlines()
                if not line.startswith("#")]  # fmt: skip
        mine = [(r[2], r[6], r[8]) for r in rows if r[2] == "pairwise"]
        if mine != [("pairwise", "0", str(WORLD.Get_size() - 1))]:
            problems.append(f"pairwise rows (algorithm, wrong, steps): {mine}")
    agree(WORLD, problems)
