"""Reproducible mode: the result is bitwise the left fold in communicator rank order.

Every rank allgathers the inputs and folds them itself, in a plain NumPy loop
(``acc = x0; acc = op(acc, xk)`` for k = 1 .. N-1), and the all-reduce must
give those very bits, whatever algorithm auto picks, the communicator's rank
order, the (emulated) node layout, in place or not. The inputs make the order
matter: magnitudes from 1e-8 to 1e8 of both signs, signed zeros and NaN for
MAX and MIN, products of numbers near 1.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import algorithms
from ringmpi._comm import context
from ringmpi.algorithms import chain
from ringmpi.schedule import chunk_bounds

pytestmark = pytest.mark.mpi

_FLOATS, _COMPLEX = ("float32", "float64"), ("complex64", "complex128")
_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN, "avg": ringmpi.AVG}
PAIRS = [
    pytest.param(op, dt, id=f"{op}-{dt}")
    for dt in _FLOATS + _COMPLEX
    for op in (("sum", "prod", "max", "min", "avg") if dt in _FLOATS else ("sum", "prod", "avg"))
]
COUNTS = (0, 1, 7, 1009)


@pytest.fixture(scope="module")
def comms():
    """COMM_WORLD, its two halves (low ranks, high ranks) and WORLD in reversed order."""
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    half = world.Split(2 * rank // size, rank)
    reversed_ = world.Split(0, -rank)
    yield {"world": world, "half": half, "reversed": reversed_}
    half.Free()
    reversed_.Free()


def _inputs(op: str, dtype: str, rank: int, count: int) -> np.ndarray:
    """This rank's contribution: an order-sensitive mix, the same on every run."""
    rng = np.random.default_rng(1000 + rank)
    dt = np.dtype(dtype)
    real = np.dtype(dt.char.lower() if dt.kind == "f" else ("f" if dt.itemsize == 8 else "d"))

    def part() -> np.ndarray:
        if op == "prod":  # near 1: the product's rounding depends on the order
            return (1 + rng.standard_normal(count) * 1e-3).astype(real)
        x = rng.standard_normal(count) * 10.0 ** rng.integers(-8, 9, count)
        fixed = np.array([1e8, 1.0, -1e8, 1e-8])[(np.arange(count) + rank) % 4]
        x = np.where(np.arange(count) % 3 == 0, fixed, x)
        if op in ("max", "min"):  # ties of +0.0 and -0.0, and NaN: the order shows
            x = np.where(np.arange(count) % 5 == 1, (-1.0) ** rank * 0.0, x)
            x = np.where((np.arange(count) + rank) % 11 == 0, np.nan, x)
        return x.astype(real)

    return part() if dt.kind == "f" else (part() + 1j * part()).astype(dt)


def _max(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # ringmpi's MAX (_ops.greater): y where it is greater or NaN, else x -- the
    # left operand on ties, so max(+0.0, -0.0) is +0.0. np.maximum's ties follow the
    # machine's instruction (x86's MAXPS returns the right operand): not a reference.
    return np.where((y > x) | np.isnan(y), y, x)


def _min(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where((y < x) | np.isnan(y), y, x)


def _prod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind != "c":
        return x * y
    # ringmpi's complex product (Numba's): (ac - bd) + (ad + bc)i, each operation
    # rounded on its own. NumPy's complex multiply may fuse a product into the
    # subtraction (an FMA) and differ in the last bit: not a reference.
    a, b, c, d = x.real, x.imag, y.real, y.imag
    out = np.empty_like(x)
    out.real, out.imag = a * c - b * d, a * d + b * c
    return out


def _left_fold(op: str, xs: list[np.ndarray]) -> np.ndarray:
    """((x0 op x1) op x2) ... in rank order; AVG: the sum, then one division."""
    ufunc = {"sum": np.add, "avg": np.add, "prod": _prod, "max": _max,
             "min": _min}[op]  # fmt: skip
    acc = xs[0].copy()
    for x in xs[1:]:
        acc = ufunc(acc, x)
    if op == "avg" and len(xs) > 1:
        n = acc.real.dtype.type(len(xs))
        if acc.dtype.kind == "c":
            out = np.empty_like(acc)
            out.real, out.imag = acc.real / n, acc.imag / n
            return out
        return acc / n
    return acc


def _check(comm, op: str, dtype: str, count: int, algorithm: str, *, in_place: bool,
           seed_rank: int | None = None, **kw) -> list[str]:  # fmt: skip
    """Problems of one call (twice): its bits against the left fold of the allgathered inputs."""
    rank = comm.Get_rank() if seed_rank is None else seed_rank
    mine = _inputs(op, dtype, rank, count)
    want = _left_fold(op, comm.allgather(mine))
    problems = []
    for _ in range(2):
        if in_place:
            got = mine.copy()
            ringmpi.Allreduce(MPI.IN_PLACE, got, _OPS[op], comm, algorithm=algorithm, **kw)
        else:
            got = np.full_like(mine, 7)
            ringmpi.Allreduce(mine, got, _OPS[op], comm, algorithm=algorithm, **kw)
        if got.tobytes() != want.tobytes():
            bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
            problems.append(f"{algorithm} {op} {dtype} count {count}: bytes {bad[:4]} differ")
    return problems


def _algorithms(comm) -> list[str]:
    usable = algorithms.usable(context(comm))
    return ["auto", "chain"] + (["shared_memory"] if "shared_memory" in usable else [])


@pytest.mark.parametrize("name", ["world", "half", "reversed"])
@pytest.mark.parametrize(("op", "dtype"), PAIRS)
def test_bitwise_the_left_fold_in_rank_order(comms, name, op, dtype):
    comm = comms[name]
    problems = []
    for algorithm in _algorithms(comm):
        for i, count in enumerate(COUNTS):
            problems += _check(comm, op, dtype, count, algorithm, in_place=i % 2 == 1,
                               reproducible=True)  # fmt: skip
    agree(MPI.COMM_WORLD, problems)


@pytest.mark.parametrize("algorithm", ["chain", "auto"])
def test_many_pieces_and_segments(monkeypatch, environ, algorithm):
    """Small pieces and segments: many of each, uneven, every algorithm's many-piece path."""
    monkeypatch.setattr(chain, "CHAIN_MAX_PIECE", 1000)  # bytes: 3001 float64 -> 25 pieces
    environ.set("RINGMPI_SEGMENT_BYTES", "256")
    world = MPI.COMM_WORLD
    problems = []
    for op, dtype in (("sum", "float64"), ("avg", "complex128"), ("max", "float32")):
        count = {"float64": 3001, "complex128": 1501, "float32": 6007}[dtype]
        problems += _check(world, op, dtype, count, algorithm, in_place=False, reproducible=True)
    agree(world, problems)


@pytest.mark.parametrize("placement", ["block", "cyclic"])
@pytest.mark.parametrize("per_node", [1, 2, 3])
def test_emulated_node_layouts_change_no_bit(environ, per_node, placement):
    environ.set("RINGMPI_RANKS_PER_NODE", str(per_node))
    environ.set("RINGMPI_NODE_PLACEMENT", placement)
    world = MPI.COMM_WORLD
    problems = []
    for count in (7, 1009, 70_001):
        for op, dtype in (("sum", "float32"), ("avg", "float64"), ("sum", "complex64")):
            problems += _check(world, op, dtype, count, "auto", in_place=count == 7,
                               reproducible=True)  # fmt: skip
    agree(world, problems)


def test_repeated_calls_stay_reproducible():
    """The same arrays again and again take the API's repeat path (a prepared chain)."""
    world = MPI.COMM_WORLD
    x = _inputs("sum", "float64", world.Get_rank(), 5003)
    want = _left_fold("sum", world.allgather(x))
    out = np.empty_like(x)
    problems = []
    for algorithm in ("chain", "auto"):
        for i in range(4):
            out[:] = 0
            ringmpi.Allreduce(x, out, MPI.SUM, world, algorithm=algorithm, reproducible=True)
            if out.tobytes() != want.tobytes():
                problems.append(f"{algorithm}, call {i}: differs")
    agree(world, problems)


def test_from_the_environment(environ):
    environ.set("RINGMPI_REPRODUCIBLE", "1")
    world = MPI.COMM_WORLD
    problems = _check(world, "sum", "float32", 1009, "auto", in_place=False)
    problems += _check(world, "sum", "complex128", 77, "auto", in_place=True)
    try:
        ringmpi.allreduce(np.ones(4), comm=world, algorithm="ring")
        problems.append("ring ran under RINGMPI_REPRODUCIBLE=1")
    except ValueError as exc:
        if "chain" not in str(exc):
            problems.append(f"the error names no algorithm that keeps the order: {exc}")
    # reproducible=False overrides the environment
    ringmpi.allreduce(np.ones(4), comm=world, algorithm="ring", reproducible=False)
    agree(world, problems)


@pytest.mark.parametrize(
    "algorithm", ["ring", "recursive_doubling", "rabenseifner", "hierarchical", "mpi"]
)
def test_an_algorithm_that_cannot_keep_the_order_raises(algorithm):
    world = MPI.COMM_WORLD
    problems = []
    for dtype in ("float32", "complex128"):
        buf = np.ones(5, dtype)
        try:
            ringmpi.Allreduce(MPI.IN_PLACE, buf, MPI.SUM, world, algorithm=algorithm,
                              reproducible=True)  # fmt: skip
            problems.append(f"{algorithm} on {dtype} ran")
        except ValueError as exc:
            said = str(exc)
            if algorithm not in said or "chain" not in said or "shared_memory" not in said:
                problems.append(f"message: {said}")
        if not (buf == 1).all():
            problems.append(f"{algorithm} wrote into the buffer")
    agree(world, problems)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "hierarchical", "auto"])
def test_integers_keep_the_normal_choice(environ, algorithm):
    """Integer and bool results have the same bits in any order: any algorithm runs."""
    environ.set("RINGMPI_ALGORITHM", "auto")
    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    got = ringmpi.allreduce(np.arange(9, dtype=np.int64) + rank, comm=world,
                            algorithm=algorithm, reproducible=True)  # fmt: skip
    flags = ringmpi.allreduce(np.array([rank % 2 == 0] * 3), MPI.LAND, world,
                              algorithm=algorithm, reproducible=True)  # fmt: skip
    want = n * np.arange(9) + n * (n - 1) // 2
    agree(world, [] if (got == want).all() and (flags == (n == 1)).all() else [f"{got} {flags}"])


def test_auto_keeps_to_the_algorithms_that_keep_the_order(environ):
    world = MPI.COMM_WORLD
    ctx = context(world)
    red = ringmpi.kernels.reduction(MPI.SUM, np.float32)
    problems = []
    for nbytes in (8, 1 << 16, 1 << 20, 64 << 20):
        chosen = algorithms.choose("auto", nbytes, ctx, red, reproducible=True)
        if not chosen.keeps_order or chosen.name not in ("chain", "shared_memory"):
            problems.append(f"{nbytes} B: auto chose {chosen.name}")
        if algorithms.choose("auto", nbytes, ctx, red).name == "chain":
            problems.append(f"{nbytes} B: chain among the normal choices")
    environ.set("RINGMPI_ALGORITHM", "ring")
    try:
        algorithms.choose("auto", 8, ctx, red, reproducible=True)
        problems.append("RINGMPI_ALGORITHM=ring ran in reproducible mode")
    except ValueError as exc:
        if "RINGMPI_ALGORITHM" not in str(exc):
            problems.append(str(exc))
    agree(world, problems)


def _closed_form(n: int, rank: int, count: int, itemsize: int, seg: int) -> tuple[int, int, int]:
    """(bytes sent, messages, steps) of one chain call on ``rank``, in closed form:
    ranks 0 .. N-3 send every piece twice (a partial and finished), N-2 and N-1 once."""
    if n == 1:
        return 0, 0, 0
    pieces = chain.chain_pieces(n, count, itemsize)
    times = 2 if rank <= n - 3 else 1
    bounds = chunk_bounds(count, pieces)
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    segments = sum(max(1, -(-length * itemsize // seg)) for length in lengths)
    return times * count * itemsize, times * segments, times * pieces


@pytest.mark.parametrize("count", [0, 1, 1009, 300_007])
def test_trace_counts_equal_the_closed_form(environ, count):
    environ.set("RINGMPI_SEGMENT_BYTES", "65536")
    world = MPI.COMM_WORLD
    n, rank = world.Get_size(), world.Get_rank()
    x = np.ones(count, np.float32)
    with ringmpi.trace() as t:
        ringmpi.allreduce(x, comm=world, algorithm="chain", reproducible=True)
    want = _closed_form(n, rank, count, 4, 65536)
    got = (t.bytes_sent, t.messages, t.steps)
    agree(world, [] if got == want else [f"count {count}: traced {got}, closed form {want}"])
