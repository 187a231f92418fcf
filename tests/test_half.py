"""Half precision without MPI: the bit conversions against NumPy and ml_dtypes, the fold.

The kernels convert bfloat16 by bit arithmetic, float16 by the FPU (x86's F16C)
where it can and by bit arithmetic elsewhere (ringmpi._half; both are tested);
NumPy's float16 casts and ml_dtypes' bfloat16 casts are the independent
reference: every one of the 65536 patterns widened, and float32 values rounded
-- a random sample of all bit patterns, every tie between neighbouring half
values and its two float32 neighbours, the overflow boundary, the subnormals.
"""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from conftest import half_contract
from mpi4py import MPI

import ringmpi
from ringmpi import _half, kernels, verify
from ringmpi._half import HALF_BF16, HALF_F16, narrow, widen
from ringmpi.kernels import reduction

BF16 = np.dtype(ml_dtypes.bfloat16)
KINDS = [pytest.param(HALF_F16, np.dtype(np.float16), id="float16"),
         pytest.param(HALF_BF16, BF16, id="bfloat16")]  # fmt: skip
ALL = np.arange(1 << 16, dtype=np.uint16)


def _reference_narrow(values: np.ndarray, dt: np.dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        return values.astype(np.float32).astype(dt).view(np.uint16)


@pytest.mark.parametrize(("kind", "dt"), KINDS)
def test_widen_every_pattern_bitwise(kind, dt):
    got = widen(ALL, kind).view(np.uint32)
    want = ALL.view(dt).astype(np.float32).view(np.uint32)
    assert np.array_equal(got, want)  # NaN payloads and signed zeros included


@pytest.mark.parametrize(("kind", "dt"), KINDS)
def test_narrow_of_every_widened_pattern_gives_it_back(kind, dt):
    wide = ALL.view(dt).astype(np.float32)
    got = narrow(wide, kind)
    assert np.array_equal(got, _reference_narrow(wide, dt))
    finite = ~np.isnan(wide)
    assert np.array_equal(got[finite], ALL[finite])


@pytest.mark.parametrize(("kind", "dt"), KINDS)
def test_narrow_random_float32_patterns(kind, dt):
    rng = np.random.default_rng(2026)
    bits = rng.integers(0, 1 << 32, 4_000_000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    assert np.array_equal(narrow(values, kind), _reference_narrow(values, dt))


@pytest.mark.parametrize(("kind", "dt"), KINDS)
def test_narrow_ties_and_their_neighbours(kind, dt):
    # Between every pair of neighbouring finite half values of one sign: the exact
    # midpoint (a float32: one bit more than the half's significand) and the float32
    # values just below and above it. Ties go to the even pattern.
    with np.errstate(invalid="ignore"):  # ml_dtypes warns on its NaNs
        wide = ALL.view(dt).astype(np.float64)
    finite = np.isfinite(wide[:-1]) & np.isfinite(wide[1:])
    same_sign = (ALL[:-1] >> 15) == (ALL[1:] >> 15)
    lo = np.flatnonzero(finite & same_sign)
    mid = ((wide[lo] + wide[lo + 1]) / 2).astype(np.float32)
    assert np.array_equal(mid.astype(np.float64), (wide[lo] + wide[lo + 1]) / 2)  # exact
    below = np.nextafter(mid, np.float32(0))
    above = np.nextafter(mid, np.float32(np.inf) * np.sign(mid))
    for values in (mid, below, above):
        assert np.array_equal(narrow(values, kind), _reference_narrow(values, dt))
    got = narrow(mid, kind)
    assert np.all(got & 1 == 0)  # every tie went to the even neighbour
    assert np.array_equal(narrow(below, kind), ALL[lo])
    assert np.array_equal(narrow(above, kind), ALL[lo + 1])


def test_narrow_overflow_and_underflow_boundaries():
    f16 = np.array([65504, 65519.996, 65520, 65536, 1e38, 2.0**-24, 2.0**-25,
                    2.0**-25 * 1.0000001, 3 * 2.0**-26, 2.0**-14, 2.0**-14 * (1 - 2.0**-12),
                    1e-45, 0.0], np.float32)  # fmt: skip
    f16 = np.concatenate([f16, -f16])
    assert np.array_equal(narrow(f16, HALF_F16), _reference_narrow(f16, np.dtype(np.float16)))
    assert narrow(np.float32([65520]), HALF_F16)[0] == 0x7C00  # the tie goes to infinity
    assert narrow(np.float32([65519.996]), HALF_F16)[0] == 0x7BFF  # 65504
    top = np.float32(np.finfo(np.float32).max)
    bf = np.array([top, 3.3895314e38, 3.3961776e38, 1e-45, 1.1754942e-38, 2.0**-133], np.float32)
    bf = np.concatenate([bf, -bf])
    assert np.array_equal(narrow(bf, HALF_BF16), _reference_narrow(bf, BF16))
    assert narrow(np.float32([top]), HALF_BF16)[0] == 0x7F80  # rounds up to infinity


@pytest.mark.parametrize(("kind", "dt"), KINDS)
def test_narrow_every_float32_subnormal_sample(kind, dt):
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 0x00800000, 200_000, dtype=np.uint32)
    values = np.concatenate([bits, bits | np.uint32(0x80000000)]).view(np.float32)
    assert np.array_equal(narrow(values, kind), _reference_narrow(values, dt))


def fold(red, out, data, starts, nranks) -> None:
    """The half-type fold every algorithm runs (ringmpi._half.fold_parts), with every
    contribution in ``data``, at ``data[starts[k]:]``."""
    out16, data16 = out.view(np.uint16), data.view(np.uint16)
    _half.fold_parts(out16, data16, data16, data16.size, starts, 0, red.code, red.half,
                     red.avg_divisor(nranks))  # fmt: skip


@pytest.mark.parametrize("name", kernels.HALF_OPS)
@pytest.mark.parametrize(("kind", "dt"), KINDS)
@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_the_fold_is_the_contract(name, kind, dt, k):
    rng = np.random.default_rng(k)
    n = 1037
    parts = [(rng.standard_normal(n) * 100).astype(dt) for _ in range(k)]
    parts[0][:5] = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]).astype(dt)
    data = np.concatenate(parts)
    starts = np.arange(k, dtype=np.int64) * n
    out = np.empty(n, dt)
    red = reduction(kernels.op_from_name(name), dt)
    fold(red, out, data, starts, k)
    want = half_contract(parts, name, dt)
    nan = np.isnan(want.astype(np.float32))  # a NaN's sign and payload are not promised
    assert np.array_equal(np.isnan(out.astype(np.float32)), nan)
    assert np.array_equal(out.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.parametrize("name", kernels.HALF_OPS)
@pytest.mark.parametrize(("kind", "dt"), KINDS)
@pytest.mark.parametrize("k", [2, 3, 5])
def test_fold_parts_reads_the_input_and_the_slots_from_an_offset(name, kind, dt, k):
    # The ring's fold: its own contribution in its input (positions below the count),
    # the others in slots (from the count on), segment by segment (``at``); several
    # of the fold's blocks, and the two-rank one-pass fold, against the contract.
    rng = np.random.default_rng(10 + k)
    n, count, me = 5000, 7000, k // 2
    parts = [(rng.standard_normal(n) * 100).astype(dt) for _ in range(k)]
    own = np.zeros(count, dt)
    own[1500 : 1500 + n] = parts[me]
    others = [p for r, p in enumerate(parts) if r != me]
    slots = np.concatenate([np.zeros(3, dt), *others])
    starts = np.array([1500 if r == me else count + 3 + n * (r - (r > me)) for r in range(k)],
                      np.int64)  # fmt: skip
    red = reduction(kernels.op_from_name(name), dt)
    want = half_contract(parts, name, dt).view(np.uint16)
    for at, m in ((0, n), (1234, 2100), (n - 7, 7)):
        out = np.zeros(m, np.uint16)
        _half.fold_parts(out, own.view(np.uint16), slots.view(np.uint16), count, starts, at,
                         red.code, kind, red.avg_divisor(k))  # fmt: skip
        nan = np.isnan(want[at : at + m].view(dt).astype(np.float32))
        assert np.array_equal(np.isnan(out.view(dt).astype(np.float32)), nan)
        assert np.array_equal(out[~nan], want[at : at + m][~nan])


def test_float16_bit_arithmetic_fallback_is_numpys_conversion():
    # Where the FPU has no float16 conversion (no F16C) the kernels use bit arithmetic.
    wide = np.empty(ALL.size, np.float32)
    _half._widen_all_bits(wide, ALL)
    assert np.array_equal(
        wide.view(np.uint32), ALL.view(np.float16).astype(np.float32).view(np.uint32)
    )
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 1 << 32, 2_000_000, dtype=np.uint64).astype(np.uint32)
    ties = (ALL.astype(np.uint32) << 13) + np.uint32(0x38001000)  # normal ties, and past them
    for values in (bits.view(np.float32), wide, ties.view(np.float32),
                   (ties + np.uint32(1)).view(np.float32)):  # fmt: skip
        got = np.empty(values.size, np.uint16)
        _half._narrow_all_bits(got, values)
        assert np.array_equal(got, _reference_narrow(values, np.dtype(np.float16)))


def test_overflow_goes_to_infinity_once():
    # 60000 + 60000 is 120000 in float32, infinity only at the rounding.
    dt = np.dtype(np.float16)
    red = reduction(MPI.SUM, dt)
    data = np.array([60000, -60000, 60000, 60000], dt)
    out = np.empty(2, dt)
    fold(red, out, data, np.array([0, 2], np.int64), 2)
    assert out.tolist() == [np.inf, 0.0]
    # AVG divides in float32 first: finite.
    avg = reduction(ringmpi.AVG, dt)
    fold(avg, out, data, np.array([0, 2], np.int64), 2)
    assert out.tolist() == [60000.0, 0.0]


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", [MPI.PROD, MPI.LAND, MPI.BOR])
def test_other_ops_raise_type_error(op, dt):
    with pytest.raises(TypeError, match=r"half types take: MPI.SUM, MPI.MAX, MPI.MIN, ringmpi.AVG"):
        reduction(op, dt)


def test_dtype_names_and_tags():
    red = reduction(MPI.SUM, "bfloat16")
    assert red.dtype == BF16
    assert red.half == HALF_BF16
    assert reduction(MPI.SUM, np.float16).half == HALF_F16
    assert kernels.decode_tag(red.tag) == ("MPI.SUM", "bfloat16")
    assert kernels.decode_tag(reduction(MPI.MIN, np.float16).tag) == ("MPI.MIN", "float16")
    tags = {reduction(s.op, d).tag for s in kernels._OPS for d in s.dtypes}
    halves = {reduction(kernels.op_from_name(o), d).tag for o in kernels.HALF_OPS
              for d in ("float16", "bfloat16")}  # fmt: skip
    assert len(halves) == 8 and not tags & halves
    # A structured 2-byte type is not bfloat16.
    with pytest.raises(TypeError, match="not supported"):
        reduction(MPI.SUM, np.dtype([("a", "u1"), ("b", "u1")]))
    # Nor does a half type reduce partial results, each rounded to 16 bits.
    z = np.zeros(2, BF16)
    with pytest.raises(TypeError, match="partial result would be rounded"):
        red.fold(z, z[:0], z.copy(), np.zeros(4, BF16), 2, 0, 0, 2)
    with pytest.raises(TypeError, match="partial result would be rounded"):
        reduction(ringmpi.AVG, np.float16).finish(np.zeros(2, np.float16), 2)


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", kernels.HALF_OPS)
@pytest.mark.parametrize("nranks", [1, 2, 3, 64, 100])
def test_verifiable_patterns_give_the_once_rounded_answer(dt, name, nranks):
    op = kernels.op_from_name(name)
    parts = [verify.verify_inputs(op, dt, r, 16) for r in range(nranks)]
    got = verify.verify_expected(op, dt, nranks, 16)
    assert np.array_equal(
        got.view(np.uint16), half_contract(parts, name, got.dtype).view(np.uint16)
    )
    exact = np.sum([p.astype(np.float64) for p in parts], axis=0)
    if name == "sum" and nranks <= 64:  # |sum| <= 4 N: exact in 16 bits (bfloat16: to 256)
        assert np.array_equal(got.astype(np.float64), exact)


def test_import_ringmpi_does_not_import_ml_dtypes():
    code = "import sys, ringmpi; print('ml_dtypes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(("op", "dtype"), [
    pytest.param(op, dt, marks=[pytest.mark.family] if (op, dt) == ("sum", "bfloat16") else [])
    for dt in ("float16", "bfloat16") for op in ("sum", "avg", "max", "min")
])  # fmt: skip
def test_cli_verifies_half_types(tmp_path, dtype, op):
    import json

    from test_cli import ring_bytes_ratio, run

    out = tmp_path / "r.json"
    p = run(3, "-d", dtype, "-o", op, "-a", "ring,shared_memory,auto", "-b", "2", "-e", "2000",
            "-f", "10", "-n", "2", "-w", "0", "--json", str(out))  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 * 4
    assert all(r["wrong"] == 0 for r in rows)
    for r in rows:
        if r["algorithm"] == "ring":
            assert r["bytes_per_rank"] == pytest.approx(ring_bytes_ratio(3, r["count"]))


@pytest.mark.family
def test_cli_refuses_algorithms_that_round_twice():
    from test_cli import run

    p = run(2, "-d", "bfloat16", "-a", "ring,mpi", "-b", "8", "-e", "8")
    assert p.returncode == 2
    assert "algorithm: 'mpi' cannot reduce sum on bfloat16 with one rounding" in p.stderr
