"""allreduce_many under MPI: exact results of fused buckets, and ranks that disagree.

Array k of a call holds elements k.. of :func:`ringmpi.verify.verify_inputs`, so
every array has its own exact expected result and one written to the wrong place
shows. Every check goes through :func:`agree`.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import buckets, verify

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
needs_two_ranks = pytest.mark.skipif(SIZE < 2, reason="needs at least 2 ranks to disagree")

# (shape, dtype, layout): C order, a strided view, Fortran order, a transposed view.
SHAPES = [
    ((7,), "C"),
    ((), "C"),
    ((3, 5), "F"),
    ((0,), "C"),
    ((11,), "strided"),
    ((4, 6), "T"),
    ((1,), "C"),
    ((2, 3, 4), "C"),
    ((64,), "C"),
    ((13,), "C"),
]

OP_DTYPES = [
    (MPI.SUM, ["float32", "float64", "int32", "complex64", "uint8", "int64"]),
    (MPI.MAX, ["float32", "int16", "float64"]),
    (ringmpi.AVG, ["float32", "float64", "complex128"]),
    (MPI.BOR, ["int32", "uint16"]),
]


def _make(shape, layout, dtype, values):
    """An array of ``shape`` in ``layout`` holding ``values`` (C order)."""
    values = values.reshape(shape)
    if layout == "F":
        return np.asfortranarray(values)
    if layout == "strided":
        parent = np.zeros(2 * values.size, dtype)
        parent[::2] = values
        return parent[::2]
    if layout == "T":
        return np.ascontiguousarray(values.T).T
    return values.copy()


def arrays_for(op, dtypes, rank=RANK, nranks=None):
    """This rank's arrays (dtypes taken in turn) and, with ``nranks``, the expected results."""
    made, want = [], []
    for k, (shape, layout) in enumerate(SHAPES):
        dt = dtypes[k % len(dtypes)]
        n = int(np.prod(shape, dtype=np.int64))
        made.append(_make(shape, layout, dt, verify.verify_inputs(op, dt, rank, n + k)[k:]))
        if nranks is not None:
            want.append(verify.verify_expected(op, dt, nranks, n + k)[k:].reshape(shape))
    return made, want


def check(arrays, want, what) -> list[str]:
    problems = []
    for k, (got, exp) in enumerate(zip(arrays, want, strict=True)):
        if got.shape != exp.shape or got.dtype != exp.dtype:
            problems.append(f"{what}: arrays[{k}] is {got.dtype}{got.shape}")
        elif not np.array_equal(got, exp):
            problems.append(f"{what}: arrays[{k}] got {got.ravel()[:4]}, want {exp.ravel()[:4]}")
    return problems


@pytest.mark.parametrize("algorithm", ["auto", "ring", "mpi"])
@pytest.mark.parametrize("bucket_bytes", [1, 24, 100, buckets.BUCKET_BYTES])
@pytest.mark.parametrize(("op", "dtypes"), OP_DTYPES, ids=["sum", "max", "avg", "bor"])
def test_results_are_exact_whatever_the_buckets(op, dtypes, bucket_bytes, algorithm):
    problems = []
    for call in range(2):  # the second call reuses the plan and its pack buffers
        arrays, want = arrays_for(op, dtypes, nranks=SIZE)
        ringmpi.allreduce_many(arrays, op, WORLD, bucket_bytes=bucket_bytes, algorithm=algorithm)
        problems += check(arrays, want, f"call {call}")
    agree(WORLD, problems)


def test_strided_array_leaves_the_gaps_alone():
    parent = np.full(20, -7.0)
    parent[::2] = RANK + 1
    ringmpi.allreduce_many([parent[::2]], comm=WORLD)
    want = np.full(20, -7.0)
    want[::2] = SIZE * (SIZE + 1) // 2
    agree(WORLD, [] if np.array_equal(parent, want) else [f"got {parent}"])


def test_reproducible_results_are_bitwise_the_rank_order_fold():
    # Values whose sum depends on the order: the left fold in rank order, whatever the
    # packing (each element is reduced where it sits in its bucket).
    rng = np.random.default_rng(1234)
    table = rng.standard_normal((SIZE, 300)) * 10.0 ** rng.integers(-8, 8, (SIZE, 300))
    want = table[0].copy()
    for r in range(1, SIZE):
        want = want + table[r]
    arrays = [table[RANK, :100].copy(), table[RANK, 100:].reshape(20, 10).copy()]
    ringmpi.allreduce_many(arrays, comm=WORLD, bucket_bytes=1000, reproducible=True)
    got = np.concatenate([a.ravel() for a in arrays])
    agree(WORLD, [] if np.array_equal(got, want) else ["not the rank-order fold"])


def test_one_collective_per_bucket():
    arrays = [np.full(n, RANK + 1, np.float64) for n in (10, 10, 10, 50, 3)]  # bytes 80 ...
    with ringmpi.trace() as t:
        # float64 bucket_bytes 200: [50 elements alone (400 B)], [10, 10] (160 B), [10, 3],
        # after the signature check (a ringmpi all-reduce too, so traced)
        ringmpi.allreduce_many(arrays, comm=WORLD, bucket_bytes=200, algorithm="ring")
    problems = [] if t.calls == 1 + 3 else [f"{t.calls} collectives, expected 1 + 3"]
    total = SIZE * (SIZE + 1) // 2
    problems += [f"arrays[{k}]" for k, a in enumerate(arrays) if not (a == total).all()]
    agree(WORLD, problems)


def test_pack_buffers_are_reused_across_calls():
    arrays = [np.ones(5, np.float32), np.ones(7, np.float32)]
    ringmpi.allreduce_many(arrays, comm=WORLD)
    plans = dict(buckets._plans)
    works = [b.work for p in plans.values() for b in p.buckets]
    ringmpi.allreduce_many([np.ones(5, np.float32), np.ones(7, np.float32)], comm=WORLD)
    again = [b.work for p in buckets._plans.values() for b in p.buckets]
    same = len(works) == len(again) and all(a is b for a, b in zip(works, again, strict=True))
    agree(WORLD, [] if same else ["a new plan for the same signature"])


def test_buffers_other_than_ndarrays():
    import array

    doubles = array.array("d", [RANK + 1.0] * 5)
    raw = bytearray([RANK + 1] * 3)
    mine = np.full(4, RANK + 1, np.int32)
    ringmpi.allreduce_many([doubles, raw, memoryview(mine)], comm=WORLD)
    total = SIZE * (SIZE + 1) // 2
    problems = []
    if list(doubles) != [float(total)] * 5:
        problems.append(f"array.array: {doubles}")
    if list(raw) != [total % 256] * 3:
        problems.append(f"bytearray: {raw}")
    if not (mine == total).all():
        problems.append(f"memoryview: {mine}")
    agree(WORLD, problems)


# --- ranks that disagree: every rank raises, nothing is sent -------------------------


def _disagree(field):
    """(arrays, keyword arguments) of this rank, where rank 1 differs in ``field``."""
    odd = RANK == 1
    arrays = [np.ones(4), np.ones((2, 3), np.float32)]
    kwargs = {"comm": WORLD}
    if field == "shape":
        arrays[1] = np.ones((3, 2) if odd else (2, 3), np.float32)
    elif field == "dtype":
        arrays[0] = np.ones(4, np.float32 if odd else np.float64)
    elif field == "number":
        arrays = arrays[:1] if odd else arrays
    elif field == "op":
        kwargs["op"] = MPI.MAX if odd else MPI.SUM
    elif field == "bucket_bytes":
        kwargs["bucket_bytes"] = 64 if odd else 128
    elif field == "algorithm":
        kwargs["algorithm"] = "mpi" if odd else "ring"
    elif field == "reproducible":
        kwargs["reproducible"] = odd
    return arrays, kwargs


SAYS = {
    "shape": "ranks disagree on arrays[1] (shape, dtype): rank",
    "dtype": "ranks disagree on arrays[0] (shape, dtype)",
    "number": "ranks disagree on the number of arrays",
    "op": "ranks disagree on op",
    "bucket_bytes": "ranks disagree on bucket_bytes",
    "algorithm": "ranks disagree on algorithm",
    "reproducible": "ranks disagree on reproducible",
}


@needs_two_ranks
@pytest.mark.parametrize("field", SAYS.keys())
def test_disagreement_raises_the_same_error_on_every_rank(field):
    arrays, kwargs = _disagree(field)
    before = [a.copy() for a in arrays]
    try:
        ringmpi.allreduce_many(arrays, **kwargs)
        message = None
    except ringmpi.RingMPIError as exc:
        message = str(exc)
    everyone = WORLD.allgather(message)
    problems = [] if message and SAYS[field] in message else [f"raised {message!r}"]
    problems += [] if len(set(everyone)) == 1 else [f"messages differ: {everyone}"]
    changed = [k for k, (a, b) in enumerate(zip(arrays, before, strict=True)) if (a != b).any()]
    problems += [f"arrays {changed} changed"] if changed else []
    # Nothing was sent: the communicator is fine for the next call.
    x = [np.full(3, RANK + 1.0)]
    ringmpi.allreduce_many(x, comm=WORLD)
    problems += [] if (x[0] == SIZE * (SIZE + 1) // 2).all() else ["the next call failed"]
    agree(WORLD, problems)


@needs_two_ranks
def test_a_mistake_on_one_rank_raises_on_every_rank():
    frozen = np.ones(4)
    frozen.flags.writeable = RANK != 1
    try:
        ringmpi.allreduce_many([np.ones(2), frozen], comm=WORLD)
        got = None
    except (ValueError, ringmpi.RingMPIError) as exc:
        got = (type(exc).__name__, str(exc))
    if RANK == 1:
        want = ("ValueError", "arrays[1] is read-only (ndarray)")
    else:
        want = (
            "RingMPIError",
            "allreduce_many: rank 1 raised ValueError('arrays[1] is read-only (ndarray)') "
            "(no rank sent anything)",
        )
    agree(WORLD, [] if got == want else [f"raised {got}"])


@pytest.mark.parametrize(
    ("arrays", "kwargs", "exc", "says"),
    [
        ([np.ones(3, np.complex64)], {"op": MPI.MAX}, TypeError, "op MPI.MAX is not defined"),
        ([np.ones(3)], {"bucket_bytes": 0}, ValueError, "bucket_bytes must be a positive int"),
        ([np.ones(3)], {"algorithm": "tree"}, ValueError, "algorithm: unknown name"),
        ([np.ones(3), "abc"], {}, TypeError, "arrays[1] must be"),
        (np.ones(3), {}, TypeError, "arrays must be a list or tuple"),
        ([np.ones(3)], {"op": "sum"}, ValueError, "op: unknown reduction operation"),
    ],
    ids=["op-for-dtype", "bucket-bytes", "algorithm", "not-a-buffer", "one-array", "op"],
)
def test_mistakes_every_rank_makes(arrays, kwargs, exc, says):
    with pytest.raises(exc, match=None) as info:
        ringmpi.allreduce_many(arrays, comm=WORLD, **kwargs)
    agree(WORLD, [] if says in str(info.value) else [f"{info.value!r}"])


def test_an_empty_list_is_a_check_and_nothing_else():
    with ringmpi.trace() as t:
        ringmpi.allreduce_many([], comm=WORLD)
        ringmpi.allreduce_many([np.ones(0)], comm=WORLD)
    agree(WORLD, [] if t.calls == 2 else [f"{t.calls} collectives, expected the 2 checks"])


@pytest.mark.parametrize("algorithm", ["auto", "ring"])
@pytest.mark.parametrize("op", [MPI.SUM, ringmpi.AVG, MPI.MAX], ids=["sum", "avg", "max"])
def test_half_types_in_buckets(op, algorithm):
    # float16 and bfloat16 (ml_dtypes) share buckets with float32: each dtype its own.
    dtypes = ["float16", "bfloat16", "float32"]
    problems = []
    for call in range(2):
        arrays, want = arrays_for(op, dtypes, nranks=SIZE)
        ringmpi.allreduce_many(arrays, op, WORLD, bucket_bytes=64, algorithm=algorithm)
        problems += check(arrays, want, f"call {call}")
    agree(WORLD, problems)


def _overlapping():
    """(name, the arrays, the words of the error): memory shared two ways, and
    strided views that interleave without sharing (which pass)."""
    a = np.zeros(10)
    flat = np.zeros(24)
    return [
        ("same-array", [np.ones(2), a, a], "arrays[1] and arrays[2] are the same array"),
        ("overlapping-slices", [a[:6], a[4:]], "arrays[0] and arrays[1] overlap in memory"),
        ("view-of-a-view", [flat[:8], flat.reshape(4, 6)[1:, ::2]],
         "arrays[0] and arrays[1] overlap in memory"),
        ("interleaved", [flat[::2], flat[1::2]], None),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(4), ids=[c[0] for c in _overlapping()])
@pytest.mark.parametrize("bucket_bytes", [8, buckets.BUCKET_BYTES])
def test_arrays_that_share_memory_raise_on_every_rank(case, bucket_bytes):
    """Raised before any message, whatever the packing; strided views that only
    interleave are apart, and are summed once each."""
    _, arrays, says = _overlapping()[case]
    for x in arrays:
        x[...] = RANK + 1
    try:
        with ringmpi.trace() as t:
            ringmpi.allreduce_many(arrays, comm=WORLD, bucket_bytes=bucket_bytes)
        got = None
    except ValueError as exc:
        got = str(exc)
    right = got is None if says is None else got is not None and got.startswith(says)
    problems = [] if right else [f"raised {got!r}, not {says!r}"]
    if says is None:
        total = SIZE * (SIZE + 1) // 2
        problems += [] if all((x == total).all() for x in arrays) else ["wrong sums"]
    elif t.calls != 1:  # the signature check, which finds the mistake: no bucket reduced
        problems.append(f"{t.calls} collectives before raising")
    agree(WORLD, problems)
