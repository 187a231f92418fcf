"""float16 and bfloat16 as 16-bit patterns: widened exactly to float32, folded there, rounded once.

Numba has no bfloat16 and little float16 on the CPU, so the half types travel
and are stored as their uint16 bit patterns. :func:`fold_parts` is their one
reduce: every contribution widened to float32, folded in the order given,
divided there for AVG, rounded once to the half type (the contract of
docs/api.md). :func:`widen` and :func:`narrow` are the conversions from Python.
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from ._ops import OP_MAX, OP_MIN, OP_SUM, add, greater, lesser

__all__ = [
    "HALF_BF16",
    "HALF_F16",
    "HALF_NAMES",
    "fold_half_parts",
    "fold_parts",
    "half_kind",
    "narrow",
    "widen",
]

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
_element = numba.njit(inline="always")

# The conversions are bit arithmetic, or for float16 the FPU's where x86 has
# F16C; tests/test_half.py checks both against NumPy and ml_dtypes on all 65536
# patterns and a sample of float32 values. LLVM turns every branch in them into
# a select, so the fold's loops vectorize:
#
# * bfloat16 -> float32: the pattern shifted up 16 bits (exact).
# * float16 -> float32: the magnitude bits moved up 13 places and scaled by
#   2^112 (exact for normals and subnormals alike), infinity and NaN selected
#   apart; a NaN keeps its payload (as NumPy's conversion does).
# * float32 -> bfloat16 and -> float16: round to nearest, ties to even, with
#   overflow to infinity and gradual underflow into the 16-bit subnormals. A
#   NaN stays a NaN of its sign: bfloat16's is the quiet 0x7fc0 (as ml_dtypes
#   gives), float16's keeps the top 10 payload bits (as NumPy gives).
#
# The fold inlines ringmpi._ops' add, greater and lesser, and Numba's cache
# checks only this file's time stamp: a change to those needs this file
# touched, or its cache cleared, to reach the compiled fold.

HALF_F16, HALF_BF16 = 1, 2  # Reduction.half: which half type (0: none)
HALF_NAMES = ("float16", "bfloat16")  # by HALF_F16 - 1, HALF_BF16 - 1


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose IEEE pattern is the low 32 bits of the integer ``bits``."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        word = context.cast(builder, args[0], sig.args[0], types.uint32)
        return builder.bitcast(word, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _bits_of_f32(typingctx, value):
    """The IEEE pattern of the float32 ``value``, as an int64 in [0, 2**32)."""
    if not isinstance(value, types.Float):
        return None

    def codegen(context, builder, sig, args):
        single = context.cast(builder, args[0], sig.args[0], types.float32)
        word = builder.bitcast(single, ir.IntType(32))
        return builder.zext(word, ir.IntType(64))

    return types.int64(value), codegen


@_element
def _bf16_widen(h):
    return _f32_from_bits(np.int64(h) << 16)


@_element
def _f16_widen_bits(h):
    # Branch-free, so that LLVM vectorizes the loops around it: the 15 magnitude bits
    # moved to float32's places are a float32 2^112 too small (normal or subnormal
    # alike, so the product is exact); exponent 31 (infinity, NaN: payload kept)
    # becomes 255 instead. Both are computed, one is selected.
    x = np.int64(h)
    mag = (x & 0x7FFF) << 13
    scaled = _bits_of_f32(_f32_from_bits(mag) * _TWO_112)
    bits = (mag | 0x7F800000) if mag >= 0x0F800000 else scaled
    return _f32_from_bits(((x & 0x8000) << 16) | bits)


@_element
def _bf16_narrow(f):
    x = _bits_of_f32(f)
    if (x & 0x7FFFFFFF) > 0x7F800000:  # NaN: the quiet one, of its sign
        return np.uint16(((x >> 16) & 0x8000) | 0x7FC0)
    # Ties to even: add just under half an ulp, plus one if the kept part is odd.
    return np.uint16((x + 0x7FFF + ((x >> 16) & 1)) >> 16)


@_element
def _f16_narrow_bits(f):
    # Branch-free (every case computed, one selected), so that loops vectorize.
    x = _bits_of_f32(f)
    sign = (x >> 16) & 0x8000
    a = x & 0x7FFFFFFF
    # A normal half: rebase the exponent, round the 13 bits dropped to nearest, ties
    # to even (a carry into the exponent is still the right pattern, up to infinity).
    normal = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
    # Below 2^-14: adding 0.5 puts the half's subnormal unit, 2^-24, at float32's last
    # place, so the FPU's own rounding (ties to even) makes the subnormal's bits.
    sub = _bits_of_f32(_f32_from_bits(a) + np.float32(0.5)) - 0x3F000000
    # 2^16 and up: infinity; a NaN keeps its top payload bits, never infinity's 0.
    payload = (a >> 13) & 0x3FF
    nan = 0x7C00 | payload | np.int64(payload == 0)
    big = nan if a > 0x7F800000 else 0x7C00
    h = big if a >= 0x47800000 else (normal if a >= 0x38800000 else sub)
    return np.uint16(sign | h)


_TWO_112 = np.float32(2.0**112)


@intrinsic
def _f16_widen_hw(typingctx, h):
    """float16 pattern ``h`` (uint16) to float32 by the FPU (F16C's VCVTPH2PS), exact;
    a NaN keeps its payload bits as they are (the FPU would set the quiet bit of a
    signalling one; NumPy does not). 16- and 32-bit lanes throughout, so that a
    loop of it vectorizes 16 wide."""

    def codegen(context, builder, sig, args):
        i16, i32 = ir.IntType(16), ir.IntType(32)
        x = builder.trunc(args[0], i16) if args[0].type.width > 16 else args[0]
        bits = builder.bitcast(
            builder.fpext(builder.bitcast(x, ir.HalfType()), ir.FloatType()), i32
        )
        nan = builder.icmp_unsigned(
            ">", builder.and_(x, ir.Constant(i16, 0x7FFF)), ir.Constant(i16, 0x7C00)
        )
        # the quiet bit as the input has it: clear it where the input's is clear
        clear = builder.shl(
            builder.zext(builder.and_(builder.not_(x), ir.Constant(i16, 0x200)), i32),
            ir.Constant(i32, 13),
        )
        fixed = builder.and_(bits, builder.not_(clear))
        return builder.bitcast(builder.select(nan, fixed, bits), ir.FloatType())

    return types.float32(h), codegen


@intrinsic
def _f16_narrow_hw(typingctx, f):
    """float32 ``f`` rounded to a float16 pattern by the FPU (F16C's VCVTPS2PH: to
    nearest, ties to even, overflow to infinity, subnormals); a NaN as NumPy gives
    it: its top 10 payload bits, 1 if those are 0, never the quiet bit forced."""

    def codegen(context, builder, sig, args):
        i16, i32 = ir.IntType(16), ir.IntType(32)
        single = context.cast(builder, args[0], sig.args[0], types.float32)
        h = builder.bitcast(builder.fptrunc(single, ir.HalfType()), i16)
        x = builder.bitcast(single, i32)
        a = builder.and_(x, ir.Constant(i32, 0x7FFFFFFF))
        nan = builder.icmp_unsigned(">", a, ir.Constant(i32, 0x7F800000))
        payload = builder.and_(builder.lshr(a, ir.Constant(i32, 13)), ir.Constant(i32, 0x3FF))
        empty = builder.zext(builder.icmp_unsigned("==", payload, ir.Constant(i32, 0)), i32)
        sign = builder.and_(builder.lshr(x, ir.Constant(i32, 16)), ir.Constant(i32, 0x8000))
        quiet = builder.or_(
            builder.or_(sign, ir.Constant(i32, 0x7C00)), builder.or_(payload, empty)
        )
        return builder.select(nan, builder.trunc(quiet, i16), h)

    return types.uint16(f), codegen


@_element
def _f16_widen_fpu(h):
    return _f16_widen_hw(h)


@_element
def _f16_narrow_fpu(f):
    return _f16_narrow_hw(f)


# float16 <-> float32 by the FPU where x86's F16C has it (both bitwise as the bit
# arithmetic, checked on every pattern: tests/test_half.py), else by the bits.
# Elsewhere LLVM may lower half conversions to library calls the JIT cannot link.
_F16C = _X86 and bool(llvm.get_host_cpu_features().get("f16c", False))
_f16_widen = _f16_widen_fpu if _F16C else _f16_widen_bits
_f16_narrow = _f16_narrow_fpu if _F16C else _f16_narrow_bits
_BLOCK = 2048  # elements a fold widens at a time: its float32 sums stay in L1


@_element
def _contribution(own, slots, base, p, m):
    """The ``m`` 16-bit elements at position ``p`` of the buffer ``own`` then ``slots``
    (``own`` holding positions below ``base``)."""
    if p < base:
        return own[p : p + m]
    return slots[p - base : p - base + m]


@_element
def _fold_inputs(out, own, slots, base, starts, at, divisor, op, widen, narrow):
    """``out[i] = narrow((x_0 (op) x_1 (op) ... x_(K-1)) / divisor)``, where x_k is
    ``widen`` of the element at position ``starts[k] + at + i`` of ``own`` then
    ``slots`` (see :func:`_contribution`): K 16-bit contributions folded in float32 in
    the order of ``starts``, divided (AVG; 0 for none) and rounded once.

    Block by block, one pass per contribution over a float32 block in L1: each pass
    reads one array in order, so LLVM vectorizes it (a loop over contributions
    inside the loop over elements does not). The last pass divides, rounds and
    stores as it goes (no pass of its own for either)."""
    k, n = starts.size, out.size
    d = np.float32(divisor)
    if k == 2:  # two ranks: one pass, no float32 block
        a = _contribution(own, slots, base, starts[0] + at, n)
        b = _contribution(own, slots, base, starts[1] + at, n)
        if divisor > 0:
            for i in range(n):
                out[i] = narrow(op(widen(a[i]), widen(b[i])) / d)
        else:
            for i in range(n):
                out[i] = narrow(op(widen(a[i]), widen(b[i])))
        return
    acc = np.empty(min(n, _BLOCK), np.float32)
    for lo in range(0, n, _BLOCK):
        m = min(_BLOCK, n - lo)
        src = _contribution(own, slots, base, starts[0] + at + lo, m)
        for i in range(m):
            acc[i] = widen(src[i])
        for r in range(1, k - 1):
            src = _contribution(own, slots, base, starts[r] + at + lo, m)
            for i in range(m):
                acc[i] = op(acc[i], widen(src[i]))
        dst = out[lo : lo + m]
        if k > 1:  # the last contribution, fused with the division and the rounding
            src = _contribution(own, slots, base, starts[k - 1] + at + lo, m)
            if divisor > 0:
                for i in range(m):
                    dst[i] = narrow(op(acc[i], widen(src[i])) / d)
            else:
                for i in range(m):
                    dst[i] = narrow(op(acc[i], widen(src[i])))
        elif divisor > 0:
            for i in range(m):
                dst[i] = narrow(acc[i] / d)
        else:
            for i in range(m):
                dst[i] = narrow(acc[i])


@_jit
def fold_parts(out, own, slots, base, starts, at, code, kind, divisor):
    """The half-precision reduce: ``out`` (16-bit patterns) gets the contributions that
    start at positions ``starts[k] + at`` of the buffer ``own`` then ``slots`` (``own``
    holds the positions below ``base``, ``slots`` the rest from ``base`` on), k in the
    order given, folded in float32 with op number ``code`` (SUM, MAX or MIN),
    divided by ``divisor`` when it is positive (AVG), rounded once to half type
    ``kind`` (HALF_F16 or HALF_BF16). The ring passes its input and its received
    slots, so its own contribution is read where it lies (no copy)."""
    if out.size == 0 or starts.size == 0:
        return
    if kind == HALF_BF16:
        if code == OP_SUM:
            _fold_inputs(out, own, slots, base, starts, at, divisor, add, _bf16_widen,
                         _bf16_narrow)  # fmt: skip
        elif code == OP_MAX:
            _fold_inputs(out, own, slots, base, starts, at, divisor, greater, _bf16_widen,
                         _bf16_narrow)  # fmt: skip
        elif code == OP_MIN:
            _fold_inputs(out, own, slots, base, starts, at, divisor, lesser, _bf16_widen,
                         _bf16_narrow)  # fmt: skip
    elif code == OP_SUM:
        _fold_inputs(out, own, slots, base, starts, at, divisor, add, _f16_widen, _f16_narrow)
    elif code == OP_MAX:
        _fold_inputs(out, own, slots, base, starts, at, divisor, greater, _f16_widen,
                     _f16_narrow)  # fmt: skip
    elif code == OP_MIN:
        _fold_inputs(out, own, slots, base, starts, at, divisor, lesser, _f16_widen,
                     _f16_narrow)  # fmt: skip


def fold_half_parts(out, own, slots, base, starts, at, code, kind, divisor):
    """:func:`fold_parts` where ``out`` holds 16-bit patterns, nothing for any other
    lanes type (a loop compiled for every dtype calls it: shared_memory's and the
    hierarchical one-node loop); only in compiled code."""
    raise NotImplementedError("fold_half_parts runs in Numba-compiled code only")


@overload(fold_half_parts, jit_options={"error_model": "numpy"})
def _fold_half_parts(out, own, slots, base, starts, at, code, kind, divisor):
    patterns = out.dtype == types.uint16

    def impl(out, own, slots, base, starts, at, code, kind, divisor):
        if patterns:
            fold_parts(out, own, slots, base, starts, at, code, kind, divisor)

    return impl


@_jit
def _widen_all(out, src, kind):
    for i in range(out.size):
        out[i] = _bf16_widen(src[i]) if kind == HALF_BF16 else _f16_widen(src[i])


@_jit
def _narrow_all(out, src, kind):
    for i in range(out.size):
        out[i] = _bf16_narrow(src[i]) if kind == HALF_BF16 else _f16_narrow(src[i])


@_jit
def _widen_all_bits(out, src):
    for i in range(out.size):
        out[i] = _f16_widen_bits(src[i])


@_jit
def _narrow_all_bits(out, src):
    for i in range(out.size):
        out[i] = _f16_narrow_bits(src[i])


def widen(patterns: np.ndarray, kind: int) -> np.ndarray:
    """float32 values of the 16-bit ``patterns`` (uint16) of half type ``kind``."""
    out = np.empty(patterns.size, np.float32)
    _widen_all(out, np.ascontiguousarray(patterns).reshape(-1), kind)
    return out.reshape(patterns.shape)


def narrow(values: np.ndarray, kind: int) -> np.ndarray:
    """The 16-bit patterns (uint16) of float32 ``values`` rounded to half type ``kind``."""
    out = np.empty(values.size, np.uint16)
    _narrow_all(out, np.ascontiguousarray(values, np.float32).reshape(-1), kind)
    return out.reshape(values.shape)


def half_kind(dt: np.dtype) -> int:
    """HALF_F16 or HALF_BF16 for the half types, else 0. bfloat16 is recognised by
    its name and its module (ml_dtypes), without importing ml_dtypes here."""
    if dt.itemsize != 2:
        return 0
    if dt == np.float16:
        return HALF_F16
    if dt.name == "bfloat16" and getattr(dt.type, "__module__", "") == "ml_dtypes":
        return HALF_BF16
    return 0
