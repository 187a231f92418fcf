"""The reduce kernels against NumPy, for every (op, dtype) MPI allows (no mpirun needed).

The compiled loops reduce with :func:`ringmpi._ops.combine_by_code` and divide
with :func:`~ringmpi._ops.divide_by`, on :meth:`Reduction.lanes` with the op's
number; the small jitted wrappers below call them exactly so.
"""

from __future__ import annotations

import subprocess
import sys

import numba
import numpy as np
import pytest
from mpi4py import MPI

from ringmpi import AVG
from ringmpi._copy import copy as copy_kernel
from ringmpi._errors import UnsupportedError
from ringmpi._ops import combine_by_code, divide_by
from ringmpi.kernels import _OPS, DTYPES, decode_tag, op_from_name, reduction
from ringmpi.verify import PERIOD, count_wrong, verify_expected, verify_inputs

# The family's op handles map to the kernels: the tests marked family check that map
# (make test-family runs them under each family); the kernels' arithmetic against
# NumPy is the family's in no way, and runs once.
family = pytest.mark.family

PAIRS = [(spec, dt) for spec in _OPS for dt in spec.dtypes]
IDS = [f"{spec.name}-{dt.name}" for spec, dt in PAIRS]


def _random(dt: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    x = (rng.standard_normal(n) * 100).astype(dt)
    if dt.kind == "c":
        x = x + 1j * (rng.standard_normal(n) * 100).astype(dt)
    # IEEE's corner cases: NaN, both infinities and both zeros.
    x[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]
    return x


def _reference(spec, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if spec.name in ("land", "lor", "lxor"):
        return spec.ref(a != 0, b != 0).astype(a.dtype)
    with np.errstate(all="ignore"):
        return spec.ref(a, b).astype(a.dtype)


@numba.njit(cache=True, error_model="numpy")
def _combine(acc, inp, code, reverse):
    combine_by_code(acc, inp, code, reverse)


@numba.njit(cache=True, error_model="numpy")
def _last_step(acc, inp, code, divisor):
    # a chunk's last reduce step, as the engine takes it: combine, then AVG's division
    combine_by_code(acc, inp, code, False)
    if divisor.size > 0:
        divide_by(acc, divisor)


@pytest.mark.parametrize("reverse", [False, True], ids=["acc-first", "inp-first"])
@pytest.mark.parametrize(("spec", "dt"), PAIRS, ids=IDS)
def test_kernel_matches_numpy(spec, dt, reverse):
    rng = np.random.default_rng(7)
    n = 1037  # not a multiple of any vector width
    a, b = _random(dt, n, rng), _random(dt, n, rng)
    b[6:12] = a[6:12][::-1]  # equal and reordered elements too
    expected = _reference(spec, b, a) if reverse else _reference(spec, a, b)
    acc = a.copy()
    red = reduction(spec.op, dt)
    with np.errstate(all="ignore"):
        _combine(red.lanes(acc), red.lanes(b), red.code, reverse)
    assert acc.dtype == dt
    if spec.name == "prod" and dt.kind == "c":
        # Complex products may round differently by an ulp (NumPy's loop and Numba's
        # differ in contraction); MPI fixes no rounding for them either.
        finite = np.isfinite(expected)
        assert np.array_equal(np.isfinite(acc), finite)
        assert np.allclose(acc[finite], expected[finite], rtol=4 * np.finfo(dt).eps, atol=0)
        return
    assert np.array_equal(acc, expected, equal_nan=dt.kind in "fc")
    if spec.name in ("sum", "prod", "avg") and dt.kind == "f":
        assert np.array_equal(np.signbit(acc), np.signbit(expected))  # -0.0 is kept
    if spec.name in ("land", "lor", "lxor"):
        assert set(np.unique(acc).tolist()) <= {0, 1}


def _fold_reference(spec, src, slots, skip, in_order=False):
    if in_order:  # x_0 (op) x_1 (op) ..., src standing for slot skip
        parts = [src if k == skip else slot for k, slot in enumerate(slots)]
        acc = parts[0].copy()
        for part in parts[1:]:
            acc = _reference(spec, acc, part)
        return acc
    acc = src.copy()
    for k, slot in enumerate(slots):
        if k != skip:
            acc = _reference(spec, acc, slot)
    return acc


@pytest.mark.parametrize(("spec", "dt"), PAIRS, ids=IDS)
@pytest.mark.parametrize(
    ("ranks", "skip", "in_order"),
    [(1, 0, False), (2, 0, False), (2, 1, False), (3, 1, False), (4, 3, False),
     (1, 0, True), (2, 0, True), (2, 1, True), (3, 1, True), (4, 2, True), (3, -1, True)],
)  # fmt: skip
def test_fold_matches_numpy(spec, dt, ranks, skip, in_order):
    # The shared-memory reduce: src (op) every other rank's slot, in rank order
    # (in_order: the left fold of the slots in rank order, src for slot skip),
    # written to both outputs. The window is flat, one segment of `stride`
    # elements per rank; the slot starts at `offset` in each.
    rng = np.random.default_rng(11)
    n, stride, offset = 1037, 1100, 41
    window = np.concatenate([_random(dt, stride, rng) for _ in range(ranks)])
    src = _random(dt, n, rng)
    slots = [window[k * stride + offset :][:n] for k in range(ranks)]
    expected = _fold_reference(spec, src, slots, skip, in_order)
    red = reduction(spec.op, dt)
    before = window.tobytes()
    out, copy = np.zeros(n, dt), np.zeros(n, dt)
    with np.errstate(all="ignore"):
        red.fold(out, copy, src, window, stride, offset, skip, ranks, in_order)
        in_place = src.copy()
        red.fold(in_place, copy[:0], in_place, window, stride, offset, skip, ranks, in_order)
        alone = np.zeros(n, dt)  # no copy
        red.fold(alone, copy[:0], src, window, stride, offset, skip, ranks, in_order)
    if spec.name == "prod" and dt.kind == "c":
        close = {"rtol": 8 * np.finfo(dt).eps, "atol": 0, "equal_nan": True}
        assert np.allclose(out, expected, **close) and np.allclose(in_place, expected, **close)
        assert np.allclose(alone, expected, **close)
    else:
        assert np.array_equal(out, expected, equal_nan=dt.kind in "fc")
        assert np.array_equal(in_place, expected, equal_nan=dt.kind in "fc")
        assert np.array_equal(alone, expected, equal_nan=dt.kind in "fc")
    assert out.tobytes() == copy.tobytes()
    assert window.tobytes() == before


def test_fold_reads_only_its_slots_and_writes_only_its_outputs():
    red = reduction(MPI.SUM, "int32")
    window = np.arange(2 * 30, dtype=np.int32)  # two segments of 30
    before = window.copy()
    src = np.full(6, 100, np.int32)
    out, copy = np.zeros(8, np.int32), np.zeros(8, np.int32)
    red.fold(out[:6], copy[:6], src, window, 30, 10, 0, 2)  # rank 1's slot: 40, 41, ...
    assert np.array_equal(window, before)
    assert out.tolist() == [100 + 40 + i for i in range(6)] + [0, 0]
    assert copy.tolist() == out.tolist()


@pytest.mark.parametrize(
    ("dt", "a", "b", "want"),
    [("int8", 127, 1, -128), ("int8", -128, -1, 127), ("uint8", 255, 1, 0),
     ("int16", 32767, 32767, -2), ("uint16", 0, 65535, 65535), ("int32", 2**31 - 1, 1, -(2**31)),
     ("uint32", 2**32 - 1, 2, 1), ("int64", 2**63 - 1, 1, -(2**63)), ("uint64", 2**64 - 1, 1, 0)],
)  # fmt: skip
def test_integer_sum_wraps(dt, a, b, want):
    acc, inp = np.array([a, a], dt), np.array([b, b], dt)
    _combine(acc, inp, reduction(MPI.SUM, dt).code, False)
    assert acc.tolist() == [want, want]


def test_integer_product_wraps():
    acc = np.array([16, -128, -1], np.int8)
    _combine(acc, np.array([16, 2, -1], np.int8), reduction(MPI.PROD, "int8").code, False)
    assert acc.tolist() == [0, 0, 1]  # 256 and -256 wrap to 0; (-1)(-1) = 1


def test_complex_sum_runs_on_the_real_lanes():
    red = reduction(MPI.SUM, "complex64")
    zero = complex(-0.0, -0.0)
    a = np.array([1 + 2j, np.inf + 0j, zero], np.complex64)
    assert red.lanes(a).dtype == np.float32 and red.lanes(a).size == 6
    assert reduction(MPI.PROD, "complex64").lanes(a).dtype == np.complex64  # not split
    b = np.array([3 - 1j, 1 + 0j, zero], np.complex64)
    _combine(red.lanes(a), red.lanes(b), red.code, False)
    assert a.tolist() == [4 + 1j, np.inf + 0j, 0j]
    assert np.signbit(a.real[2]) and np.signbit(a.imag[2])


def test_copy_is_exact_for_every_dtype():
    rng = np.random.default_rng(5)
    for dt in DTYPES:
        src = _random(dt, 1001, rng)
        dst = np.zeros(1003, dt)
        copy_kernel(dst[1:1002], src)
        assert dst[1:1002].tobytes() == src.tobytes()
        assert dst[0] == 0 and dst[-1] == 0


@pytest.mark.parametrize("dt", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("nranks", [1, 2, 3, 7])
def test_avg_divides_once_in_the_last_step(dt, nranks):
    rng = np.random.default_rng(3)
    dt = np.dtype(dt)
    a, b = _random(dt, 257, rng), _random(dt, 257, rng)
    red = reduction(AVG, dt)
    acc = a.copy()
    with np.errstate(all="ignore"):
        _last_step(red.lanes(acc), red.lanes(b), red.code, red.divisor(nranks))
        total = a + b
    real_n = total.real.dtype.type(nranks)
    # One correctly rounded division of each real component.
    expected = np.empty_like(total)
    expected.real = total.real / real_n
    if dt.kind == "c":
        expected.imag = total.imag / real_n
    assert np.array_equal(acc, expected, equal_nan=True)
    finished = total.copy()
    red.finish(finished, nranks)
    assert np.array_equal(finished, acc, equal_nan=True)


def test_complex_avg_keeps_an_infinity_finite_in_its_other_component():
    # Each component divided alone: complex division would make inf/3 + 0j a NaN.
    red = reduction(AVG, "complex128")
    acc = np.array([np.inf + 0j, 3 - 6j], np.complex128)
    _last_step(red.lanes(acc), red.lanes(np.zeros(2, np.complex128)), red.code, red.divisor(3))
    assert acc.tolist() == [np.inf + 0j, 1 - 2j]
    assert np.array_equal(red.divisor(3), [3.0]) and red.divisor(1).size == 0
    assert reduction(MPI.SUM, "float32").divisor(3).size == 0  # only AVG divides


@family
@pytest.mark.parametrize(
    ("op", "dtype"),
    [(MPI.MAX, "complex64"), (MPI.MIN, "complex128"), (MPI.BAND, "float32"),
     (MPI.BXOR, "bool"), (MPI.LAND, "float64"), (MPI.SUM, "bool"), (AVG, "int32")],
)  # fmt: skip
def test_combinations_mpi_forbids_name_both(op, dtype):
    with pytest.raises(TypeError) as info:
        reduction(op, dtype)
    name = "ringmpi.AVG" if op is AVG else f"MPI.{op_name(op).upper()}"
    assert name in str(info.value) and dtype in str(info.value)


def op_name(op):
    return next(spec.name for spec in _OPS if spec.op == op)


@family
@pytest.mark.parametrize("dtype", [">f2", "object", "U3", ">f4", "datetime64[s]"])
def test_unsupported_dtypes(dtype):
    with pytest.raises(TypeError, match="not supported"):
        reduction(MPI.SUM, dtype)


@family
@pytest.mark.parametrize("op", ["sum", 3, None])
def test_unknown_ops(op):
    with pytest.raises(ValueError, match="op: unknown"):
        reduction(op, "float32")


@family
@pytest.mark.parametrize(
    ("op", "named"), [(MPI.MAXLOC, "MPI.MAXLOC"), (MPI.REPLACE, "MPI.REPLACE")]
)
def test_mpi_ops_it_leaves_to_the_library(op, named):
    # UnsupportedError (a TypeError): auto hands such a call to the library
    with pytest.raises(UnsupportedError, match=f"op {named} is not one ringmpi reduces"):
        reduction(op, "float32")


@family
def test_op_names():
    assert op_from_name("sum") is MPI.SUM or op_from_name("sum") == MPI.SUM
    assert op_from_name("AVG") is AVG
    with pytest.raises(ValueError, match="known: sum, prod"):
        op_from_name("mean")


@family
def test_tags_are_distinct_and_name_the_pair():
    tags = {reduction(spec.op, dt).tag: (spec, dt) for spec, dt in PAIRS}
    assert len(tags) == len(PAIRS) == 99
    assert max(tags) < 32767  # the smallest MPI_TAG_UB the standard allows
    assert decode_tag(reduction(MPI.MAX, "int16").tag) == ("MPI.MAX", "int16")
    assert decode_tag(reduction(AVG, "float64").tag) == ("ringmpi.AVG", "float64")


@pytest.mark.parametrize(("spec", "dt"), PAIRS, ids=IDS)
@pytest.mark.parametrize("nranks", [1, 2, 3, 5, 9, 64])
def test_verification_data_is_exact(spec, dt, nranks):
    # The closed-form expected result equals a brute-force reduction over every rank.
    count = 3 * PERIOD + 5
    stack = np.stack([verify_inputs(spec.op, dt, r, count) for r in range(nranks)])
    if spec.name in ("land", "lor", "lxor"):
        brute = spec.ref.reduce(stack != 0, axis=0).astype(dt)
    else:
        brute = spec.ref.reduce(stack, axis=0, dtype=dt)
    if spec.op is AVG and nranks > 1:
        n = brute.real.dtype.type(nranks)
        brute = brute.real / n if dt.kind == "f" else brute.real / n + 1j * (brute.imag / n)
    assert np.array_equal(verify_expected(spec.op, dt, nranks, count), brute.astype(dt))
    if dt.kind in "fc" and spec.name in ("sum", "avg", "max", "min"):
        assert np.array_equal(stack, np.round(stack))  # small integers: exact in any order


def test_dtype_table():
    assert [d.name for d in DTYPES] == [
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float32", "float64", "complex64", "complex128", "bool",
    ]  # fmt: skip


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 1009])
def test_count_wrong_counts_each_wrong_element(count):
    nranks = 3
    result = verify_expected(MPI.SUM, "int32", nranks, count).copy()
    assert count_wrong(result, MPI.SUM, nranks) == 0
    for k, i in enumerate(sorted({0, count // 2, count - 1} if count else set()), start=1):
        result[i] += 1
        assert count_wrong(result, MPI.SUM, nranks) == k


def test_kernels_module_imports_neither_the_algorithms_nor_the_tools():
    code = (
        "import sys, ringmpi.kernels; print(sorted(m for m in sys.modules if m.startswith("
        "('ringmpi.algorithms', 'ringmpi.tools'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_kernel_benchmark_runs(capsys):
    from ringmpi.tools import kernels as tool

    assert tool.main(["--bytes", "4096", "--reps", "3"]) == 0
    out = capsys.readouterr().out
    for row in ("numba SUM kernel", "np.add(a, b, out=a)", "copy(b, a)", "streaming copy"):
        assert row in out
