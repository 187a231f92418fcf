"""Reduce kernels: the one module that knows dtypes and ops.

Each op has two Numba-jitted kernels, built from one element function and two
loops written once: ``combine`` (``acc[i] = acc[i] (op) inp[i]``, the ring's
reduce step) and ``fold`` (one rank's contribution and every other local
rank's slot of a shared window reduced into one or two outputs, the
hierarchical algorithm's). Both are memory-bound -- one read of each input, one
write of each output -- compiled once per dtype and kept in Numba's on-disk
cache so that later runs (and the other ranks of this one) load them instead of
compiling them.

The rest of the package asks this module for a :class:`Reduction` -- the
checked (op, dtype) pair -- and never branches on dtype or op itself.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from mpi4py import MPI
from numba import types
from numba.extending import intrinsic, overload

__all__ = [
    "AVG",
    "DTYPES",
    "HALF_OPS",
    "OPS",
    "Reduction",
    "as_dtype",
    "copy",
    "count_wrong",
    "half_kind",
    "narrow",
    "op_from_name",
    "reduction",
    "verify_expected",
    "verify_inputs",
    "widen",
]

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
# An op on two elements, inlined (at Numba IR level) into every kernel that uses it.
_element = numba.njit(inline="always")


# --- the ops on two elements ---------------------------------------------------
# Integer inputs are promoted by Numba's typing and the store truncates them
# back, so integer arithmetic wraps exactly as MPI and NumPy wrap it.


@_element
def _add(x, y):
    return x + y


@_element
def _mul(x, y):
    return x * y


@_element
def _greater(x, y):
    # NaN wins, as in np.maximum; for integers the y != y test folds away.
    return y if y > x or y != y else x  # noqa: PLR0124 (a NaN test that also compiles for integers)


@_element
def _lesser(x, y):
    return y if y < x or y != y else x  # noqa: PLR0124


@_element
def _and(x, y):
    return (x != 0) and (y != 0)


@_element
def _or(x, y):
    return (x != 0) or (y != 0)


@_element
def _xor(x, y):
    return (x != 0) != (y != 0)


@_element
def _bitand(x, y):
    return x & y


@_element
def _bitor(x, y):
    return x | y


@_element
def _bitxor(x, y):
    return x ^ y


# --- the loops, written once and inlined into each op's kernels ---------------


@_element
def _apply(acc, inp, op):
    """``acc = acc (op) inp`` in place: one read of each input, one write."""
    for i in range(acc.size):
        acc[i] = op(acc[i], inp[i])


@_element
def _fold(out, copy, src, window, stride, offset, skip, ranks, op):
    """``out = copy = src (op) slot k`` over every rank k != skip, in rank order.

    The shared-memory reduce. ``window`` is a node's shared window seen as one
    flat array, rank k's segment starting at ``k * stride``; slot k is the
    ``out.size`` elements at ``offset`` in that segment. ``src`` is this rank's
    own contribution and may be ``out`` itself (in place); ``copy`` may be
    empty (no second output). One pass per other rank, the last one writing
    both outputs; no loop reads an array it does not index exactly as it
    writes, so LLVM vectorizes every one.
    """
    n = out.size
    last = ranks - 1 if skip != ranks - 1 else ranks - 2
    first = src.ctypes.data != out.ctypes.data  # the first pass reads src
    if last < 0:  # nobody else on this node
        if first:
            for i in range(n):
                out[i] = src[i]
        for i in range(copy.size):
            copy[i] = out[i]
        return
    for k in range(ranks):
        if k == skip:
            continue
        inp = window[k * stride + offset : k * stride + offset + n]
        both = k == last and copy.size > 0
        if first and both:
            for i in range(n):
                v = op(src[i], inp[i])
                out[i] = v
                copy[i] = v
        elif first:
            for i in range(n):
                out[i] = op(src[i], inp[i])
        elif both:
            for i in range(n):
                v = op(out[i], inp[i])
                out[i] = v
                copy[i] = v
        else:
            for i in range(n):
                out[i] = op(out[i], inp[i])
        first = False


@_element
def _apply_reversed(acc, inp, op):
    """``acc = inp (op) acc``: the other rank's operand first."""
    for i in range(acc.size):
        acc[i] = op(inp[i], acc[i])


@_element
def _apply_either(acc, inp, reverse, op):
    if reverse:
        _apply_reversed(acc, inp, op)
    else:
        _apply(acc, inp, op)


# --- the ops by code, for compiled step loops ---------------------------------
# A step loop (ringmpi._engine) is compiled once per dtype and takes the op as a
# number; the branch per call costs nothing against a loop over the elements.
# Each dtype's loop holds only the ops MPI defines for it: the others are pruned
# before typing (they would not compile, e.g. ``&`` on floats).

OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_LAND, OP_LOR, OP_LXOR, OP_BAND, OP_BOR, OP_BXOR = range(10)


def combine_by_code(acc, inp, code, reverse):
    """``acc = acc (op) inp`` (``inp (op) acc`` if ``reverse``) for op number ``code``;
    only in compiled code."""
    raise NotImplementedError("combine_by_code runs in Numba-compiled code only")


@overload(combine_by_code, jit_options={"error_model": "numpy"})
def _combine_by_code(acc, inp, code, reverse):
    dt = acc.dtype
    boolean = isinstance(dt, types.Boolean)
    integer = isinstance(dt, types.Integer)
    ordered = integer or isinstance(dt, types.Float)

    def impl(acc, inp, code, reverse):
        if code == OP_SUM:
            if not boolean:
                _apply_either(acc, inp, reverse, _add)
        elif code == OP_PROD:
            if not boolean:
                _apply_either(acc, inp, reverse, _mul)
        elif code == OP_MAX:
            if ordered:
                _apply_either(acc, inp, reverse, _greater)
        elif code == OP_MIN:
            if ordered:
                _apply_either(acc, inp, reverse, _lesser)
        elif code == OP_LAND:
            if integer or boolean:
                _apply_either(acc, inp, reverse, _and)
        elif code == OP_LOR:
            if integer or boolean:
                _apply_either(acc, inp, reverse, _or)
        elif code == OP_LXOR:
            if integer or boolean:
                _apply_either(acc, inp, reverse, _xor)
        elif code == OP_BAND:
            if integer:
                _apply_either(acc, inp, reverse, _bitand)
        elif code == OP_BOR:
            if integer:
                _apply_either(acc, inp, reverse, _bitor)
        elif code == OP_BXOR:  # noqa: SIM102 (a constant test, pruned)
            if integer:
                _apply_either(acc, inp, reverse, _bitxor)

    return impl


def fold_by_code(out, copy, src, window, stride, offset, skip, ranks, code):
    """The shared-memory reduce of :func:`_fold` (``out = copy = src (op) slot k`` for
    every rank k != skip, in rank order) for op number ``code``; only in compiled
    code."""
    raise NotImplementedError("fold_by_code runs in Numba-compiled code only")


@overload(fold_by_code, jit_options={"error_model": "numpy"})
def _fold_by_code(out, copy, src, window, stride, offset, skip, ranks, code):
    dt = out.dtype
    boolean = isinstance(dt, types.Boolean)
    integer = isinstance(dt, types.Integer)
    ordered = integer or isinstance(dt, types.Float)

    def impl(out, copy, src, window, stride, offset, skip, ranks, code):
        if code == OP_SUM:
            if not boolean:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _add)
        elif code == OP_PROD:
            if not boolean:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _mul)
        elif code == OP_MAX:
            if ordered:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _greater)
        elif code == OP_MIN:
            if ordered:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _lesser)
        elif code == OP_LAND:
            if integer or boolean:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _and)
        elif code == OP_LOR:
            if integer or boolean:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _or)
        elif code == OP_LXOR:
            if integer or boolean:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _xor)
        elif code == OP_BAND:
            if integer:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _bitand)
        elif code == OP_BOR:
            if integer:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _bitor)
        elif code == OP_BXOR:  # noqa: SIM102 (a constant test, pruned)
            if integer:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _bitxor)

    return impl


def divide_by(acc, divisor):
    """``acc /= divisor[0]`` for floating types (AVG's one division); only in compiled code."""
    raise NotImplementedError("divide_by runs in Numba-compiled code only")


@overload(divide_by, jit_options={"error_model": "numpy"})
def _divide_by(acc, divisor):
    floating = isinstance(acc.dtype, types.Float)

    def impl(acc, divisor):
        if floating:
            d = divisor[0]
            for i in range(acc.size):
                acc[i] = acc[i] / d

    return impl


# --- the kernels: a (combine, fold) pair per op ------------------------------
# Numba's on-disk cache keys a kernel by its module-level name, so every op has
# its own two small kernels (a kernel taking the op as an argument, or made in a
# closure, is not cached).


@_jit
def _sum(acc, inp):
    _apply(acc, inp, _add)


@_jit
def _sum_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _add)


@_jit
def _prod(acc, inp):
    _apply(acc, inp, _mul)


@_jit
def _prod_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _mul)


@_jit
def _max(acc, inp):
    _apply(acc, inp, _greater)


@_jit
def _max_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _greater)


@_jit
def _min(acc, inp):
    _apply(acc, inp, _lesser)


@_jit
def _min_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _lesser)


@_jit
def _land(acc, inp):
    _apply(acc, inp, _and)


@_jit
def _land_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _and)


@_jit
def _lor(acc, inp):
    _apply(acc, inp, _or)


@_jit
def _lor_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _or)


@_jit
def _lxor(acc, inp):
    _apply(acc, inp, _xor)


@_jit
def _lxor_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _xor)


@_jit
def _band(acc, inp):
    _apply(acc, inp, _bitand)


@_jit
def _band_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _bitand)


@_jit
def _bor(acc, inp):
    _apply(acc, inp, _bitor)


@_jit
def _bor_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _bitor)


@_jit
def _bxor(acc, inp):
    _apply(acc, inp, _bitxor)


@_jit
def _bxor_fold(out, copy, src, window, stride, offset, skip, ranks):
    _fold(out, copy, src, window, stride, offset, skip, ranks, _bitxor)


@_jit
def _copy_bytes(dst, src):
    for i in range(dst.size):
        dst[i] = src[i]


@intrinsic
def _store_streaming_32(typingctx, dst, i, src, j):
    """``dst[i : i + 32] = src[j : j + 32]`` (byte arrays) with one non-temporal store.

    The store bypasses the caches (``!nontemporal``: MOVNTDQ on x86, STNP on
    ARM); ``dst + i`` must be 32-byte aligned.
    """

    def codegen(context, builder, sig, args):
        vec = ir.VectorType(ir.IntType(8), 32)
        to = context.make_array(sig.args[0])(context, builder, args[0])
        of = context.make_array(sig.args[2])(context, builder, args[2])
        at = builder.bitcast(builder.gep(of.data, [args[3]]), vec.as_pointer())
        value = builder.load(at, align=1)  # the source may have any alignment
        where = builder.bitcast(builder.gep(to.data, [args[1]]), vec.as_pointer())
        store = builder.store(value, where, align=32)
        one = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        store.set_metadata("nontemporal", one)
        return context.get_dummy_value()

    return numba.types.void(dst, i, src, j), codegen


@intrinsic
def _fence(typingctx):
    """A store fence that orders non-temporal stores before what follows.

    On x86 that takes SFENCE (or MFENCE): the locked instruction LLVM emits for
    a sequentially consistent fence orders ordinary stores but is not documented
    to drain the write-combining buffers that non-temporal stores go through.
    Elsewhere (ARM's STNP is ordered by DMB) LLVM's full fence is enough.
    """

    def codegen(context, builder, sig, args):
        if _X86:
            sfence = builder.module.declare_intrinsic(
                "llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), [])
            )
            builder.call(sfence, [])
        else:
            builder.fence("seq_cst")
        return context.get_dummy_value()

    return numba.types.void(), codegen


@_jit
def _stream_bytes(dst, src):
    n = dst.size
    head = min(n, (-dst.ctypes.data) % 32)  # up to the first 32-byte boundary
    for i in range(head):
        dst[i] = src[i]
    i = head
    while i + 32 <= n:
        _store_streaming_32(dst, i, src, i)
        i += 32
    for k in range(i, n):
        dst[k] = src[k]
    _fence()


def copy(dst: np.ndarray, src: np.ndarray, streaming: bool = False) -> None:
    """``dst[:] = src`` for contiguous arrays of one dtype, as a compiled loop.

    Measured faster than ``np.copyto`` for the shared-memory passes (whose
    memcpy is slower on this machine, docs/performance.md); works on bytes, so
    one compiled kernel serves every dtype. ``streaming`` writes past the caches
    (non-temporal stores, then a fence): for data another core will read, where
    the cores share no cache.
    """
    (_stream_bytes if streaming else _copy_bytes)(dst.view(np.uint8), src.view(np.uint8))


@_jit
def _sum_then_divide(acc, inp, n):
    # AVG's last reduce step: the one rounding of the quotient, fused.
    for i in range(acc.size):
        acc[i] = (acc[i] + inp[i]) / n


@_jit
def _divide(acc, n):
    for i in range(acc.size):
        acc[i] = acc[i] / n


# --- half precision: float16 and bfloat16 as 16-bit patterns ---------------------
# Numba has no bfloat16 and little float16 on the CPU, so the half types travel
# and are stored as their uint16 bit patterns, and the kernels convert them
# exactly to float32, accumulate there, and round once at the end. The
# conversions are bit arithmetic, or for float16 the FPU's where x86 has F16C
# (tests/test_half.py checks both against NumPy and ml_dtypes for all 65536
# patterns and a sample of float32 values; every float32 pattern was checked
# once). LLVM turns every branch in them into a select, so the fold's loops
# vectorize:
#
# * bfloat16 -> float32: the pattern shifted up 16 bits (exact).
# * float16 -> float32: the magnitude bits moved up 13 places and scaled by
#   2^112 (exact for normals and subnormals alike), infinity and NaN selected
#   apart; a NaN keeps its payload (as NumPy's conversion does).
# * float32 -> bfloat16 and -> float16: round to nearest, ties to even, with
#   overflow to infinity and gradual underflow into the 16-bit subnormals. A
#   NaN stays a NaN of its sign: bfloat16's is the quiet 0x7fc0 (as ml_dtypes
#   gives), float16's keeps the top 10 payload bits (as NumPy gives).

HALF_F16, HALF_BF16 = 1, 2  # Reduction.half: which half type (0: none)
_HALF_NAMES = ("float16", "bfloat16")
HALF_OPS = ("sum", "avg", "max", "min")  # the ops the half types take


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
            _fold_inputs(out, own, slots, base, starts, at, divisor, _add, _bf16_widen,
                         _bf16_narrow)  # fmt: skip
        elif code == OP_MAX:
            _fold_inputs(out, own, slots, base, starts, at, divisor, _greater, _bf16_widen,
                         _bf16_narrow)  # fmt: skip
        elif code == OP_MIN:
            _fold_inputs(out, own, slots, base, starts, at, divisor, _lesser, _bf16_widen,
                         _bf16_narrow)  # fmt: skip
    elif code == OP_SUM:
        _fold_inputs(out, own, slots, base, starts, at, divisor, _add, _f16_widen, _f16_narrow)
    elif code == OP_MAX:
        _fold_inputs(out, own, slots, base, starts, at, divisor, _greater, _f16_widen,
                     _f16_narrow)  # fmt: skip
    elif code == OP_MIN:
        _fold_inputs(out, own, slots, base, starts, at, divisor, _lesser, _f16_widen,
                     _f16_narrow)  # fmt: skip


@_jit
def fold_inputs(out, data, starts, code, kind, divisor):
    """:func:`fold_parts` with every contribution in ``data``: at ``data[starts[k]:]``."""
    fold_parts(out, data, data, data.size, starts, 0, code, kind, divisor)


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


def as_dtype(dtype: object) -> np.dtype:
    """``np.dtype(dtype)``, where the name ``"bfloat16"`` imports ml_dtypes first
    (which registers it with NumPy; ringmpi imports it only when asked for)."""
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 (0.2 s: only for those who use it)

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


# --- the op and dtype tables -------------------------------------------------

_INTEGERS = tuple(
    np.dtype(t) for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
)
_FLOATS = (np.dtype("float32"), np.dtype("float64"))
_COMPLEX = (np.dtype("complex64"), np.dtype("complex128"))
_BOOL = (np.dtype("bool"),)

DTYPES: tuple[np.dtype, ...] = _INTEGERS + _FLOATS + _COMPLEX + _BOOL


class _Avg:
    """``ringmpi.AVG``: the sum divided by the number of ranks (floating types)."""

    def __repr__(self) -> str:
        return "ringmpi.AVG"

    def __reduce__(self) -> str:
        return "AVG"


AVG = _Avg()


@dataclass(frozen=True)
class _OpSpec:
    name: str
    op: object  # an MPI.Op, or AVG
    kernel: Callable  # acc = acc (op) inp
    fold: Callable  # the shared-memory reduce, see _fold
    dtypes: tuple[np.dtype, ...]  # the combinations MPI allows
    mpi_op: MPI.Op  # what MPI_Allreduce is given for this op
    ref: np.ufunc  # NumPy's version, for the independent reference result


_OPS: tuple[_OpSpec, ...] = (
    _OpSpec("sum", MPI.SUM, _sum, _sum_fold, _INTEGERS + _FLOATS + _COMPLEX, MPI.SUM, np.add),
    _OpSpec(
        "prod", MPI.PROD, _prod, _prod_fold, _INTEGERS + _FLOATS + _COMPLEX, MPI.PROD, np.multiply
    ),
    _OpSpec("max", MPI.MAX, _max, _max_fold, _INTEGERS + _FLOATS, MPI.MAX, np.maximum),
    _OpSpec("min", MPI.MIN, _min, _min_fold, _INTEGERS + _FLOATS, MPI.MIN, np.minimum),
    _OpSpec("land", MPI.LAND, _land, _land_fold, _INTEGERS + _BOOL, MPI.LAND, np.logical_and),
    _OpSpec("lor", MPI.LOR, _lor, _lor_fold, _INTEGERS + _BOOL, MPI.LOR, np.logical_or),
    _OpSpec("lxor", MPI.LXOR, _lxor, _lxor_fold, _INTEGERS + _BOOL, MPI.LXOR, np.logical_xor),
    _OpSpec("band", MPI.BAND, _band, _band_fold, _INTEGERS, MPI.BAND, np.bitwise_and),
    _OpSpec("bor", MPI.BOR, _bor, _bor_fold, _INTEGERS, MPI.BOR, np.bitwise_or),
    _OpSpec("bxor", MPI.BXOR, _bxor, _bxor_fold, _INTEGERS, MPI.BXOR, np.bitwise_xor),
    _OpSpec("avg", AVG, _sum, _sum_fold, _FLOATS + _COMPLEX, MPI.SUM, np.add),
)

OPS: tuple[str, ...] = tuple(spec.name for spec in _OPS)
_CODES = {"sum": OP_SUM, "prod": OP_PROD, "max": OP_MAX, "min": OP_MIN, "land": OP_LAND,
          "lor": OP_LOR, "lxor": OP_LXOR, "band": OP_BAND, "bor": OP_BOR,
          "bxor": OP_BXOR}  # fmt: skip


def _spec_of(op: object) -> _OpSpec:
    for spec in _OPS:
        if op is spec.op or (isinstance(op, MPI.Op) and op == spec.op):
            return spec
    known = ", ".join(f"MPI.{s.name.upper()}" for s in _OPS if s.op is not AVG)
    raise ValueError(f"op: unknown reduction operation {op!r} (known: {known}, ringmpi.AVG)")


def op_from_name(name: str) -> object:
    """The op object for a name as the CLI takes it (``sum``, ``max``, ``avg``, ...)."""
    for spec in _OPS:
        if spec.name == name.lower():
            return spec.op
    raise ValueError(f"op: unknown name {name!r} (known: {', '.join(OPS)})")


@dataclass(frozen=True)
class Reduction:
    """A checked (op, dtype) pair and the kernels that carry it out."""

    name: str  # "sum", "avg", ...
    dtype: np.dtype
    mpi_op: MPI.Op
    tag: int  # stamped on every message, so ranks that disagree on op or dtype notice
    _combine: Callable
    _fold: Callable
    _is_avg: bool
    code: int  # the op's number for compiled step loops (AVG: SUM's; they divide apart)
    # Complex SUM and AVG act on each real component alone, so their kernels run on
    # the arrays viewed as reals: AVG then divides each component exactly once, and
    # infinities keep a zero imaginary part where complex division would give NaN.
    _split: bool
    # HALF_F16 or HALF_BF16: a half type, reduced by fold_inputs alone (every
    # contribution widened to float32, folded, rounded once), never by combining
    # partial results, which would round each; 0 otherwise.
    half: int = 0

    def _lanes(self, a: np.ndarray) -> np.ndarray:
        if self.half:
            return a.view(np.uint16)
        return a.view(a.real.dtype) if self._split else a

    def lanes(self, a: np.ndarray) -> np.ndarray:
        """``a`` as the compiled step loops take it: complex SUM and AVG as reals."""
        return self._lanes(a)

    def divisor(self, nranks: int) -> np.ndarray:
        """What a step loop divides the finished elements by: ``[nranks]`` for AVG
        (in the lanes' type, so the one division is in the data's precision), else
        empty."""
        if not self._is_avg or nranks <= 1 or self.half:
            return np.zeros(0, self._lanes(np.zeros(0, self.dtype)).dtype)
        return np.full(1, nranks, self._lanes(np.zeros(0, self.dtype)).dtype)

    def combine(self, acc: np.ndarray, inp: np.ndarray) -> None:
        """``acc = acc (op) inp`` elementwise, in place."""
        self._partials()
        self._combine(self._lanes(acc), self._lanes(inp))

    def _partials(self) -> None:
        if self.half:
            raise TypeError(
                f"{self.describe()}: a partial result would be rounded to 16 bits; half types "
                "are reduced by fold_inputs, every contribution at once"
            )

    def fold_inputs(
        self, out: np.ndarray, data: np.ndarray, starts: np.ndarray, nranks: int
    ) -> None:
        """Half types: ``out`` gets the contributions ``data[s : s + out.size]`` for each
        s in ``starts`` (int64), folded in that order in float32 (AVG divided by
        ``nranks`` there) and rounded once to the half type. ``out`` and ``data`` may
        be the half type or its uint16 patterns."""
        fold_inputs(out.view(np.uint16), data.view(np.uint16), starts, self.code, self.half,
                    self.avg_divisor(nranks))  # fmt: skip

    def avg_divisor(self, nranks: int) -> int:
        """What a half-type fold divides by: ``nranks`` for AVG, else 0 (none)."""
        return nranks if self._is_avg and nranks > 1 else 0

    def fold(
        self, out: np.ndarray, copy: np.ndarray, src: np.ndarray, window: np.ndarray,
        stride: int, offset: int, skip: int, ranks: int,
    ) -> None:  # fmt: skip
        """``out = copy = src (op) window[k * stride + offset :][: out.size]`` for every
        rank k < ranks but ``skip``, in rank order.

        ``window`` is a node's shared window as one flat array (rank k's segment
        at ``k * stride``), ``src`` this rank's own contribution (it may be ``out``:
        in place); ``copy`` may be empty. Memory traffic: one read of each input
        and one write of each output.
        """
        self._partials()
        lanes, w = self._lanes, 2 if self._split else 1
        self._fold(lanes(out), lanes(copy), lanes(src), lanes(window), stride * w, offset * w,
                   skip, ranks)  # fmt: skip

    def combine_last(self, acc: np.ndarray, inp: np.ndarray, nranks: int) -> None:
        """The reduce step that completes a chunk: AVG divides here, fused."""
        self._partials()
        if self._is_avg:
            _sum_then_divide(self._lanes(acc), self._lanes(inp), self._divisor(nranks))
        else:
            self.combine(acc, inp)

    def finish(self, acc: np.ndarray, nranks: int) -> None:
        """Finish a complete sum made elsewhere (the MPI baseline): AVG divides."""
        self._partials()
        if self._is_avg and nranks > 1:
            _divide(self._lanes(acc), self._divisor(nranks))

    def _divisor(self, nranks: int) -> np.generic:
        return np.zeros(0, self.dtype).real.dtype.type(nranks)

    def describe(self) -> str:
        return f"{self.name} on {self.dtype.name}"

    def warm(self) -> float:
        """Compile (or load from the cache) every kernel this reduction uses; seconds taken."""
        t0 = time.perf_counter()
        if self.half:
            self.fold_inputs(np.zeros(4, np.uint16), np.zeros(8, np.uint16),
                             np.array([0, 4], np.int64), 2)  # fmt: skip
            return time.perf_counter() - t0
        a = np.zeros(4, self.dtype)
        self.combine(a, a.copy())
        self.fold(a, a.copy(), a.copy(), np.zeros(8, self.dtype), 4, 0, 0, 2)
        if self._is_avg:
            self.combine_last(a, a.copy(), 1)
            self.finish(a, 2)
        return time.perf_counter() - t0


_cache: dict[tuple[str, str, str], Reduction] = {}
_last: tuple = (None, None, None)


def _remember(op: object, dtype: object, red: Reduction) -> None:
    global _last
    _last = (op, dtype, red)


_quick: dict[tuple[int, np.dtype], Reduction] = {}


def reduction(op: object, dtype: np.dtype | str | type) -> Reduction:
    """The :class:`Reduction` for ``op`` on ``dtype``; TypeError if MPI does not allow it."""
    # The pair of the last call, by identity: a loop of calls on one buffer.
    last = _last
    if op is last[0] and dtype is last[1]:
        return last[2]
    # The cache is keyed by the op's MPI handle (mpi4py's Op objects are not
    # hashable) and the dtype: a call on a known pair costs two lookups.
    dt = as_dtype(dtype)
    quick = (MPI._handleof(op) if isinstance(op, MPI.Op) else id(op), dt)
    found = _quick.get(quick)
    if found is not None:
        _remember(op, dtype, found)
        return found
    spec = _spec_of(op)
    key = (spec.name, dt.str, dt.name)  # bfloat16's str is a void type's
    found = _cache.get(key)
    if found is not None:
        if isinstance(op, MPI.Op) or op is AVG:
            _quick[quick] = found
        return found
    half = half_kind(dt)
    if half:
        return _half_reduction(op, spec, dt, half, quick, key)
    if dt not in DTYPES or not dt.isnative:
        names = ", ".join([*(d.name for d in DTYPES), *_HALF_NAMES])
        raise TypeError(f"dtype {dt} is not supported by ringmpi (supported: {names})")
    if dt not in spec.dtypes:
        allowed = ", ".join(d.name for d in spec.dtypes)
        raise TypeError(
            f"op {_op_label(spec)} is not defined for dtype {dt.name} (it takes: {allowed})"
        )
    tag = 1 + _OPS.index(spec) * 64 + DTYPES.index(dt)
    split = dt.kind == "c" and spec.name in ("sum", "avg")
    code = _CODES["sum" if spec.op is AVG else spec.name]
    red = Reduction(
        spec.name, dt, spec.mpi_op, tag, spec.kernel, spec.fold, spec.op is AVG, code, split
    )
    _cache[key] = red
    if isinstance(op, MPI.Op) or op is AVG:
        _quick[quick] = red
    return red


def _half_reduction(
    op: object, spec: _OpSpec, dt: np.dtype, half: int, quick: tuple, key: tuple
) -> Reduction:
    if spec.name not in HALF_OPS:
        takes = ", ".join(_op_label(s) for s in _OPS if s.name in HALF_OPS)
        raise TypeError(f"op {_op_label(spec)} is not defined for dtype {dt.name} "
                        f"(the half types take: {takes})")  # fmt: skip
    tag = 1 + _OPS.index(spec) * 64 + len(DTYPES) + half - 1
    code = _CODES["sum" if spec.op is AVG else spec.name]
    red = Reduction(spec.name, dt, spec.mpi_op, tag, _no_partials, _no_partials, spec.op is AVG,
                    code, False, half)  # fmt: skip
    _cache[key] = red
    if isinstance(op, MPI.Op) or op is AVG:
        _quick[quick] = red
    return red


def _no_partials(*args) -> None:
    raise TypeError("half types are reduced by Reduction.fold_inputs only")


def _op_label(spec: _OpSpec) -> str:
    return "ringmpi.AVG" if spec.op is AVG else f"MPI.{spec.name.upper()}"


def decode_tag(code: int) -> tuple[str, str]:
    """The (op, dtype) names a reduction's tag code stands for (for error messages)."""
    k, d = divmod(code - 1, 64)
    if 0 <= k < len(_OPS) and 0 <= d < len(DTYPES):
        return _op_label(_OPS[k]), DTYPES[d].name
    if 0 <= k < len(_OPS) and 0 <= d - len(DTYPES) < len(_HALF_NAMES):
        return _op_label(_OPS[k]), _HALF_NAMES[d - len(DTYPES)]
    return f"unknown op (code {code})", "unknown dtype"


# --- verifiable data ---------------------------------------------------------
# Inputs are small integers (also in float and complex types) that depend on
# (rank, i mod PERIOD) only, so every reduction order gives the same exact
# result, and the expected result of N ranks is a table of PERIOD values.

PERIOD = 8


def _pattern(spec: _OpSpec, dt: np.dtype, rank: int, j: np.ndarray) -> np.ndarray:
    k = (j + rank) % PERIOD
    if spec.name == "prod":
        # One 2 per PERIOD ranks at each position, the rest 1: products stay small.
        return np.where(k == 0, 2, 1).astype(dt)
    if spec.name in ("land", "lor", "lxor"):
        return ((k % 3) != 0).astype(dt)
    signed = dt.kind in "ifc"
    vals = k - 3 if signed else k
    if dt.kind == "c":
        return (vals + 1j * (((j + 2 * rank) % PERIOD) - 2)).astype(dt)
    return vals.astype(dt)


def verify_inputs(op: object, dtype: np.dtype | str, rank: int, count: int) -> np.ndarray:
    """Rank ``rank``'s input for a verified all-reduce of ``count`` elements."""
    spec, dt = _spec_of(op), as_dtype(dtype)
    # The pattern repeats every PERIOD elements: build one period, then tile it.
    return _tile(_pattern(spec, dt, rank, np.arange(PERIOD, dtype=np.int64)), count)


def verify_expected(op: object, dtype: np.dtype | str, nranks: int, count: int) -> np.ndarray:
    """The exact result of all-reducing :func:`verify_inputs` over ``nranks`` ranks.

    Computed with NumPy's ufuncs, independently of the kernels under test.
    """
    red = reduction(op, dtype)
    dt = red.dtype
    spec = _spec_of(op)
    j = np.arange(PERIOD, dtype=np.int64)
    stack = np.stack([_pattern(spec, dt, r, j) for r in range(nranks)])
    if red.half:
        # The contract: exact in float32 (small integers), AVG's one float32 division,
        # then one rounding to the half type, by NumPy's (or ml_dtypes') conversion.
        exact = spec.ref.reduce(stack.astype(np.float64), axis=0).astype(np.float32)
        if spec.op is AVG and nranks > 1:
            exact = exact / np.float32(nranks)
        return _tile(exact.astype(dt), count)
    if spec.name in ("land", "lor", "lxor"):
        table = spec.ref.reduce(stack != 0, axis=0).astype(dt)
    else:
        table = spec.ref.reduce(stack, axis=0, dtype=dt)
    if spec.op is AVG and nranks > 1:
        # Componentwise: one correctly rounded division per real number.
        real = table.real / table.real.dtype.type(nranks)
        table = real if dt.kind == "f" else real + 1j * (table.imag / real.dtype.type(nranks))
    return _tile(table.astype(dt, copy=False), count)


def count_wrong(result: np.ndarray, op: object, nranks: int) -> int:
    """Elements of a verified all-reduce's ``result`` that differ from the exact answer.

    Compares against one period of :func:`verify_expected`, without building the
    whole expected array (at 64 ranks of 16 MiB that costs seconds of page faults).
    """
    flat = result.reshape(-1)
    table = verify_expected(op, flat.dtype, nranks, PERIOD)
    whole = flat.size - flat.size % PERIOD
    wrong = np.count_nonzero(flat[:whole].reshape(-1, PERIOD) != table)
    return int(wrong + np.count_nonzero(flat[whole:] != table[: flat.size - whole]))


def _tile(period: np.ndarray, count: int) -> np.ndarray:
    """``count`` elements repeating ``period`` (np.resize builds it from a tuple: slow)."""
    return np.tile(period, -(-count // period.size))[:count]


# --- benchmark: python -m ringmpi.kernels --------------------------------------


def _bench(nbytes: int, reps: int) -> None:
    n = nbytes // 4
    a = np.ones(n, np.float32)
    b = np.ones(n, np.float32)
    red = reduction(MPI.SUM, np.float32)
    print(f"first call (compile or cache load): {red.warm() * 1e3:.1f} ms")
    copy(b, a)
    copy(b, a, streaming=True)
    rows = {  # name: (call, bytes moved: reads + writes)
        "numba SUM kernel": (lambda: red.combine(a, b), 3 * nbytes),
        "np.add(a, b, out=a)": (lambda: np.add(a, b, out=a), 3 * nbytes),
        "np.copyto(b, a)": (lambda: np.copyto(b, a), 2 * nbytes),
        "kernels.copy(b, a)": (lambda: copy(b, a), 2 * nbytes),
        "streaming copy": (lambda: copy(b, a, streaming=True), 2 * nbytes),
    }
    times: dict[str, list[float]] = {k: [] for k in rows}
    order = list(rows)
    for rep in range(reps):  # interleaved, alternating which goes first
        for name in order if rep % 2 == 0 else order[::-1]:
            t0 = time.perf_counter()
            rows[name][0]()
            times[name].append(time.perf_counter() - t0)
    print(f"float32, {nbytes / 2**20:.0f} MiB, median of {reps}; GB/s counts reads + writes")
    medians = {name: float(np.median(ts)) for name, ts in times.items()}
    for name, med in medians.items():
        print(f"  {name:<22}{med * 1e3:9.3f} ms {rows[name][1] / med / 1e9:8.1f} GB/s")
    ratio = medians["np.add(a, b, out=a)"] / medians["numba SUM kernel"]
    print(f"  kernel speed relative to np.add: {ratio:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ringmpi.kernels",
        description="Warm Numba's cache for every (op, dtype), or benchmark the SUM and copy "
        "kernels.",
    )
    parser.add_argument("--warm", action="store_true", help="compile every allowed (op, dtype)")
    parser.add_argument("--bytes", type=int, default=16 * 2**20, help="benchmark size")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args(argv)
    if args.warm:
        t0 = time.perf_counter()
        n = 0
        for spec in _OPS:
            halves = _HALF_NAMES if spec.name in HALF_OPS else ()
            for dt in (*spec.dtypes, *halves):
                reduction(spec.op, dt).warm()
                n += 1
        for streaming in (False, True):
            copy(np.zeros(8, np.uint8), np.ones(8, np.uint8), streaming)
        from . import algorithms  # noqa: PLC0415 (the algorithms import this module)

        algorithms.warm()
        print(f"{n} (op, dtype) kernels ready in {time.perf_counter() - t0:.1f} s")
        return 0
    _bench(args.bytes, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
