"""Reduce_scatter_block, Reduce_scatter and Allgather: exact results, and the ring's bytes.

Inputs from ringmpi.verify (small integers per rank, also as floats), so every
expected value is exact in any order; every op and dtype family, sizes from 0
to large, uneven counts, in place, each call twice; the ring's traced bytes per
rank are held to the closed form: every chunk but one.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import verify
from ringmpi.algorithms import registry
from ringmpi.kernels import as_dtype

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
BLOCKS = [0, 1, 3, 1000, 1 << 16]  # elements per rank
PAIRS = [(MPI.SUM, "float64"), (MPI.SUM, "int32"), (MPI.PROD, "int64"), (MPI.MAX, "float32"),
         (MPI.MIN, "uint8"), (MPI.BXOR, "uint16"), (MPI.LOR, "bool"), (MPI.SUM, "complex64"),
         (ringmpi.AVG, "float64")]  # fmt: skip


def inputs(op, dtype: str, count: int) -> np.ndarray:
    return verify.verify_inputs(op, dtype, RANK, count)


def expected(op, dtype: str, count: int) -> np.ndarray:
    return verify.verify_expected(op, dtype, SIZE, count)


def mismatch(what: str, got: np.ndarray, want: np.ndarray) -> list[str]:
    want = want.astype(got.dtype)
    # bitwise, but for long double, whose padding bytes are not its value
    same = np.array_equal(got, want) if got.dtype == np.longdouble else (
        got.tobytes() == want.tobytes())  # fmt: skip
    if got.shape != want.shape or not same:
        return [f"{what}: got {got.ravel()[:4]}..., expected {want.ravel()[:4]}..."]
    return []


# ringmpi's own, from the registry: a new one enters every test here.
RS_NAMED = [a.name for a in registry.records("reduce_scatter") if a.own]
AG_NAMED = [a.name for a in registry.records("allgather") if a.own]


@pytest.mark.parametrize("algorithm", [*RS_NAMED, "auto", "mpi"])
@pytest.mark.parametrize(
    ("op", "dtype"),
    PAIRS,
    ids=[
        f"{n}-{d}"
        for n, (_, d) in zip(
            ["sum", "sum", "prod", "max", "min", "bxor", "lor", "sum", "avg"], PAIRS, strict=True
        )
    ],
)
def test_reduce_scatter_block(algorithm, op, dtype):
    problems = []
    for k in BLOCKS:
        want = expected(op, dtype, k * SIZE)[RANK * k : (RANK + 1) * k]
        for call in range(2):
            out = np.empty(k, dtype)
            ringmpi.Reduce_scatter_block(inputs(op, dtype, k * SIZE), out, op,
                                         algorithm=algorithm)  # fmt: skip
            problems += mismatch(f"{k} a block, call {call}", out, want)
        inplace = inputs(op, dtype, k * SIZE)
        rest = inplace[k:].copy()
        ringmpi.Reduce_scatter_block(None, inplace, op, algorithm=algorithm)
        problems += mismatch(f"{k} in place", inplace[:k], want)
        if algorithm in RS_NAMED:  # the library may use the rest as scratch
            problems += mismatch(f"{k} in place, the rest untouched", inplace[k:], rest)
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", [*RS_NAMED, "auto"])
@pytest.mark.parametrize(("op", "dtype"), [(MPI.SUM, "float32"), (MPI.MAX, "int16")])
def test_reduce_scatter_uneven_counts(algorithm, op, dtype):
    problems = []
    for counts in ([(3 * r + 1) % 7 for r in range(SIZE)], [0] * SIZE,
                   [r * 1000 for r in range(SIZE)], [5] * (SIZE - 1) + [0]):  # fmt: skip
        total, start = sum(counts), sum(counts[:RANK])
        want = expected(op, dtype, total)[start : start + counts[RANK]]
        # ringmpi takes a longer recvbuf, and leaves the rest (mpi4py refuses one)
        extra = 2 if algorithm in RS_NAMED else 0
        out = np.full(counts[RANK] + extra, 7, dtype)
        ringmpi.Reduce_scatter(inputs(op, dtype, total), out, counts, op, algorithm=algorithm)
        problems += mismatch(f"{counts}", out[: counts[RANK]], want)
        problems += mismatch(f"{counts} past the count", out[counts[RANK] :], np.full(extra, 7))
        gathered = np.empty(counts[RANK], dtype)  # recvcounts None: every recvbuf's size
        ringmpi.Comm(WORLD).Reduce_scatter(inputs(op, dtype, total), gathered, None, op)
        problems += mismatch(f"{counts} gathered", gathered, want)
        inplace = inputs(op, dtype, total)
        ringmpi.Reduce_scatter(MPI.IN_PLACE, inplace, counts, op, algorithm=algorithm)
        problems += mismatch(f"{counts} in place", inplace[: counts[RANK]], want)
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", [*AG_NAMED, "auto", "mpi"])
@pytest.mark.parametrize("dtype", ["float64", "int8", "bool", "complex128", "longdouble"])
def test_allgather(algorithm, dtype):
    problems = []
    for k in BLOCKS:
        blocks = [(np.arange(k) % 11 + r).astype(dtype) for r in range(SIZE)]
        want = np.concatenate(blocks) if k else np.empty(0, dtype)
        for call in range(2):
            out = np.empty(k * SIZE, dtype)
            ringmpi.Allgather(blocks[RANK], out, algorithm=algorithm)
            problems += mismatch(f"{k} a block, call {call}", out, want)
        inplace = np.zeros(k * SIZE, dtype)
        inplace[RANK * k : (RANK + 1) * k] = blocks[RANK]
        ringmpi.Allgather(MPI.IN_PLACE, inplace, algorithm=algorithm)
        problems += mismatch(f"{k} in place", inplace, want)
    agree(WORLD, problems)


def test_allgather_into_a_2d_buffer():
    mine = np.arange(6, dtype=np.float32).reshape(2, 3) + RANK
    out = np.empty((SIZE * 2, 3), np.float32)
    ringmpi.Allgather(mine, out, algorithm="ring")
    want = np.concatenate([np.arange(6, dtype=np.float32).reshape(2, 3) + r for r in range(SIZE)])
    agree(WORLD, mismatch("2-d", out, want))


def test_the_ring_sends_every_chunk_but_one():
    k = 256
    problems = []
    with ringmpi.trace() as t:
        ringmpi.Reduce_scatter_block(inputs(MPI.SUM, "float32", k * SIZE), np.empty(k, "f4"),
                                     algorithm="ring")  # fmt: skip
    want = (1, (SIZE - 1) * k * 4, SIZE - 1)
    got = (t.calls, t.bytes_sent, t.steps)
    problems += [] if got == want else [f"reduce-scatter (calls, bytes, steps) {got} != {want}"]
    counts = [r + 1 for r in range(SIZE)]
    with ringmpi.trace() as t:
        ringmpi.Reduce_scatter(inputs(MPI.SUM, "int64", sum(counts)), np.empty(counts[RANK], "i8"),
                               counts, algorithm="ring")  # fmt: skip
    if t.bytes_sent != (sum(counts) - counts[RANK]) * 8:
        problems.append(f"uneven reduce-scatter sent {t.bytes_sent}")
    with ringmpi.trace() as t:
        ringmpi.Allgather(np.ones(k, "f8"), np.empty(k * SIZE, "f8"), algorithm="ring")
    if (t.bytes_sent, t.steps) != ((SIZE - 1) * k * 8, SIZE - 1):
        problems.append(f"all-gather (bytes, steps) {(t.bytes_sent, t.steps)}")
    agree(WORLD, problems)


def test_recursive_halving_and_doubling_send_the_closed_form():
    """Power-of-two ranks: every block but the own one, in lg N steps. Otherwise the
    first 2(N - p) ranks fold in pairs (p the power of two below N): the even
    rank sends its whole input and receives its block, the odd one sends one
    more step (the trace counts the steps that sent)."""
    k, problems = 256, []
    p = 1 << (SIZE.bit_length() - 1)
    rem, lg = SIZE - p, p.bit_length() - 1
    folded_even = 2 * rem > RANK and RANK % 2 == 0
    with ringmpi.trace() as t:
        ringmpi.Reduce_scatter_block(inputs(MPI.SUM, "float32", k * SIZE), np.empty(k, "f4"),
                                     algorithm="recursive_halving")  # fmt: skip
    if folded_even:
        want = (SIZE * k * 4, 1)
    else:  # a folded pair's odd rank halves both blocks, then hands back its partner's
        want = ((SIZE - 1) * k * 4, lg + (1 if 2 * rem > RANK else 0))
    if (t.bytes_sent, t.steps) != want:
        problems.append(f"recursive halving (bytes, steps) {(t.bytes_sent, t.steps)} != {want}")
    with ringmpi.trace() as t:
        ringmpi.Allgather(np.ones(k, "f8"), np.empty(k * SIZE, "f8"),
                          algorithm="recursive_doubling")  # fmt: skip
    if not rem and (t.bytes_sent, t.steps) != ((SIZE - 1) * k * 8, lg):
        problems.append(f"recursive doubling (bytes, steps) {(t.bytes_sent, t.steps)}")
    if folded_even and (t.bytes_sent, t.steps) != (k * 8, 1):
        problems.append(f"recursive doubling, folded (bytes, steps) {(t.bytes_sent, t.steps)}")
    agree(WORLD, problems)


def test_shared_memory_stores_and_loads_the_closed_form():
    """Reduce-scatter: a rank stores every block but its own in its slot and loads its
    own block from the N - 1 others; all-gather: it stores its block, loads the
    others'. No message."""
    counts = [r + 1 for r in range(SIZE)]
    total, problems = sum(counts), []
    with ringmpi.trace() as t:
        ringmpi.Reduce_scatter(inputs(MPI.SUM, "int64", total), np.empty(counts[RANK], "i8"),
                               counts, algorithm="shared_memory")  # fmt: skip
    want = (0, 8 * (total - counts[RANK]), 8 * (SIZE - 1) * counts[RANK])
    if SIZE > 1 and (t.bytes_sent, t.shared_written, t.shared_read) != want:
        problems.append(f"reduce-scatter {(t.bytes_sent, t.shared_written, t.shared_read)}")
    with ringmpi.trace() as t:
        ringmpi.Allgather(np.ones(5, "f4"), np.empty(5 * SIZE, "f4"), algorithm="shared_memory")
    if (t.bytes_sent, t.shared_written, t.shared_read) != (0, 20, 20 * (SIZE - 1)):
        problems.append(f"all-gather {(t.bytes_sent, t.shared_written, t.shared_read)}")
    agree(WORLD, problems)


@pytest.mark.parametrize("k", [3, 300_000])  # a small block (auto: not the library's), pieces
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", [MPI.SUM, ringmpi.AVG, MPI.MAX])
def test_half_types_reduce_scatter_through_shared_memory(dtype, op, k):
    """Every contribution widened and folded at once, rounded once: exact on small
    integers (AVG: of their float32 mean); auto takes this way on one node."""
    dt = as_dtype(dtype)
    problems: list[str] = []
    x = ((np.arange(k * SIZE) % 13) + RANK).astype(np.float32)
    exact = [(np.arange(k * SIZE) % 13).astype(np.float32) + r for r in range(SIZE)]
    want32 = (sum(exact) / SIZE if op is ringmpi.AVG else
              np.maximum.reduce(exact) if op is MPI.MAX else sum(exact))  # fmt: skip
    want = want32.astype(dt)[RANK * k : (RANK + 1) * k]
    for algorithm in ("shared_memory", "auto"):
        out = np.empty(k, dt)
        ringmpi.Reduce_scatter_block(x.astype(dt), out, op, algorithm=algorithm)
        problems += mismatch(f"{algorithm}", out, want)
    agree(WORLD, problems)
    if SIZE > 1:
        with pytest.raises(TypeError, match="rounded to 16 bits"):
            ringmpi.Reduce_scatter_block(x.astype(dt), np.empty(k, dt), op, algorithm="ring")
    if op is ringmpi.AVG:
        with pytest.raises(TypeError, match="MPI has no average"):
            ringmpi.Reduce_scatter_block(x.astype(dt), np.empty(k, dt), op, algorithm="mpi")


@pytest.mark.parametrize("comm", [None, WORLD], ids=["default", "world"])
def test_auto_tunes_between_the_ring_and_the_library(settings, comm):
    settings(tuner="memory")
    x, out = inputs(MPI.SUM, "float64", 4096 * SIZE), np.empty(4096)
    want = expected(MPI.SUM, "float64", 4096 * SIZE)[RANK * 4096 : (RANK + 1) * 4096]
    blocks = [(np.arange(8192) % 11 + r).astype("f8") for r in range(SIZE)]
    problems = []
    for call in range(12):  # trials, then the winner (the library's: first thing)
        out[...] = 0
        ringmpi.Reduce_scatter_block(x, out, comm=comm)
        problems += mismatch(f"call {call}", out, want)
        gathered = np.zeros(8192 * SIZE)
        ringmpi.Allgather(blocks[RANK], gathered, comm)
        problems += mismatch(f"all-gather {call}", gathered, np.concatenate(blocks))
    agree(WORLD, problems)


BAD = [
    pytest.param(
        lambda: ringmpi.Reduce_scatter_block(np.ones(SIZE * 2 + 1), np.ones(2), algorithm="ring"),
        ValueError,
        "not N = ",
        id="rsb-uneven",
        marks=pytest.mark.skipif(SIZE == 1, reason="every size is whole blocks of one"),
    ),
    pytest.param(
        lambda: ringmpi.Reduce_scatter(np.ones(3), np.ones(3), [1] * (SIZE + 1), algorithm="ring"),
        ValueError,
        "recvcounts must be",
        id="rs-counts-length",
    ),
    pytest.param(
        lambda: ringmpi.Reduce_scatter(
            np.ones(SIZE), np.ones(1, "f4"), [1] * SIZE, algorithm="ring"
        ),
        TypeError,
        "dtype",
        id="rs-dtypes",
    ),
    pytest.param(
        lambda: ringmpi.Allgather(np.ones(3), np.ones(3 * SIZE + 1), algorithm="ring"),
        ValueError,
        "not N = ",
        id="ag-size",
    ),
    pytest.param(
        lambda: ringmpi.Reduce_scatter_block(
            np.ones(SIZE), np.ones(1), algorithm="recursive_doubling"
        ),
        ValueError,
        "recursive_halving, shared_memory, mpi, not 'recursive_doubling'",
        id="rsb-algorithm",
    ),
    pytest.param(
        lambda: ringmpi.Allgather(np.ones(3), np.ones(3 * SIZE), algorithm="tree"),
        ValueError,
        "algorithm must be one of",
        id="ag-algorithm",
    ),
    pytest.param(
        lambda: ringmpi.Reduce_scatter_block(
            np.ones(SIZE, np.longdouble), np.ones(1, np.longdouble), algorithm="ring"
        ),
        TypeError,
        "float128.*'ring' cannot run",
        id="rsb-ring-long-double",
    ),
]


@pytest.mark.parametrize(("call", "exc", "match"), BAD)
def test_bad_input_raises_before_communicating(call, exc, match):
    # (auto hands a small buffer to the library, which raises its own errors)
    with pytest.raises(exc, match=match):
        call()


def test_what_it_cannot_reduce_goes_to_the_library():
    x = np.arange(2 * SIZE, dtype=np.longdouble) + RANK
    out = np.empty(2, np.longdouble)
    ringmpi.Reduce_scatter_block(x, out)
    want = SIZE * np.arange(2 * SIZE, dtype=np.longdouble) + SIZE * (SIZE - 1) // 2
    agree(WORLD, [] if np.array_equal(out, want[2 * RANK : 2 * RANK + 2]) else [f"{out}"])


def test_a_trace_counts_what_auto_runs_without_changing_it():
    """Below RING_FROM_BYTES auto hands a reduce-scatter or all-gather to the library,
    inside a trace as outside it: the trace counts the library's calls (no send it
    could see), through the functions and the wrapped communicator alike."""
    from ringmpi._halves import RING_FROM_BYTES

    k = RING_FROM_BYTES // 8 // SIZE // 2  # float64 elements a block: half the threshold
    comm = ringmpi.Comm(WORLD)
    out, mine = np.empty(k * SIZE), np.empty(k)
    with ringmpi.trace() as t:
        ringmpi.Reduce_scatter_block(inputs(MPI.SUM, "float64", k * SIZE), mine)
        ringmpi.Allgather(mine, out)
        comm.Reduce_scatter_block(inputs(MPI.SUM, "float64", k * SIZE), mine)
        comm.Allgather(mine, out)
    problems = mismatch("all-gather of the reduced blocks", out,
                        expected(MPI.SUM, "float64", k * SIZE))  # fmt: skip
    if (t.ran, t.calls, t.bytes_sent, t.shared_read) != (["mpi"] * 4, 4, 0, 0):
        problems.append(f"traced: ran {t.ran}, {t.bytes_sent} B sent, {t.shared_read} B read")
    agree(WORLD, problems)
