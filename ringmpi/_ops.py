"""The reduction ops on two elements, and the loops that apply one, chosen by op number.

Compiled step loops (:mod:`ringmpi._engine`, the shared-memory and hierarchical
loops) are compiled once per dtype and take the op as a number: they call
:func:`combine_by_code`, :func:`fold_by_code`, :func:`fold_in_order_by_code` and
:func:`divide_by`, which inline the op's loop. Which (op, dtype) pairs are
allowed, and their numbers' names, are :mod:`ringmpi.kernels`' table.
"""

from __future__ import annotations

import numba
from numba import types
from numba.extending import overload

from . import _numba_cache  # noqa: F401  (its cache, safe for processes compiling at once)

__all__ = [
    "OP_BAND",
    "OP_BOR",
    "OP_BXOR",
    "OP_LAND",
    "OP_LOR",
    "OP_LXOR",
    "OP_MAX",
    "OP_MIN",
    "OP_PROD",
    "OP_SUM",
    "add",
    "combine_by_code",
    "divide",
    "divide_by",
    "fold",
    "fold_by_code",
    "fold_in_order",
    "fold_in_order_by_code",
    "greater",
    "lesser",
]

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")
# An op on two elements, inlined (at Numba IR level) into every loop that uses it.
_element = numba.njit(inline="always")

OP_SUM, OP_PROD, OP_MAX, OP_MIN, OP_LAND, OP_LOR, OP_LXOR, OP_BAND, OP_BOR, OP_BXOR = range(10)


# --- the ops on two elements ---------------------------------------------------
# Integer inputs are promoted by Numba's typing and the store truncates them
# back, so integer arithmetic wraps exactly as MPI and NumPy wrap it. add,
# greater and lesser are public: the half types' fold (ringmpi._half) uses them.


@_element
def add(x, y):
    return x + y


@_element
def _mul(x, y):
    return x * y


@_element
def greater(x, y):
    # NaN wins, as in np.maximum; for integers the y != y test folds away.
    return y if y > x or y != y else x  # noqa: PLR0124 (a NaN test that also compiles for integers)


@_element
def lesser(x, y):
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


# --- the loops, written once and inlined with each op --------------------------


@_element
def _apply(acc, inp, op):
    """``acc = acc (op) inp`` in place: one read of each input, one write."""
    for i in range(acc.size):
        acc[i] = op(acc[i], inp[i])


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
def _fold_in_order(acc, src, window, stride, offset, skip, ranks, op):
    """``acc = x_0 (op) x_1 (op) ... (op) x_{ranks-1}``, left to right in rank order,
    for ``ranks`` >= 2: x_k is slot k (as for :func:`_fold`), x_skip is ``src``
    (``skip`` < 0: every x_k is a slot). ``acc`` must be none of the inputs; no
    loop reads an array under another name than it writes it, so LLVM's overlap
    checks pass and both loops are vectorized. One pass per rank after the first.
    """
    n = acc.size
    first = src if skip == 0 else window[offset : offset + n]
    second = src if skip == 1 else window[stride + offset : stride + offset + n]
    for i in range(n):
        acc[i] = op(first[i], second[i])
    for k in range(2, ranks):
        inp = src if k == skip else window[k * stride + offset : k * stride + offset + n]
        for i in range(n):
            acc[i] = op(acc[i], inp[i])


# --- the ops by number, for compiled code -------------------------------------
# One branch per call, nothing against a loop over the elements. Each dtype's
# loop holds only the ops MPI defines for it: the others are pruned before
# typing (they would not compile, e.g. ``&`` on floats).


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
                _apply_either(acc, inp, reverse, add)
        elif code == OP_PROD:
            if not boolean:
                _apply_either(acc, inp, reverse, _mul)
        elif code == OP_MAX:
            if ordered:
                _apply_either(acc, inp, reverse, greater)
        elif code == OP_MIN:
            if ordered:
                _apply_either(acc, inp, reverse, lesser)
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
                _fold(out, copy, src, window, stride, offset, skip, ranks, add)
        elif code == OP_PROD:
            if not boolean:
                _fold(out, copy, src, window, stride, offset, skip, ranks, _mul)
        elif code == OP_MAX:
            if ordered:
                _fold(out, copy, src, window, stride, offset, skip, ranks, greater)
        elif code == OP_MIN:
            if ordered:
                _fold(out, copy, src, window, stride, offset, skip, ranks, lesser)
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


def fold_in_order_by_code(acc, src, window, stride, offset, skip, ranks, code):
    """The left fold in rank order of :func:`_fold_in_order` (``src`` in place of slot
    ``skip``, ``ranks`` >= 2) for op number ``code``; only in compiled code."""
    raise NotImplementedError("fold_in_order_by_code runs in Numba-compiled code only")


@overload(fold_in_order_by_code, jit_options={"error_model": "numpy"})
def _fold_in_order_by_code(acc, src, window, stride, offset, skip, ranks, code):
    dt = acc.dtype
    boolean = isinstance(dt, types.Boolean)
    integer = isinstance(dt, types.Integer)
    ordered = integer or isinstance(dt, types.Float)

    def impl(acc, src, window, stride, offset, skip, ranks, code):
        if code == OP_SUM:
            if not boolean:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, add)
        elif code == OP_PROD:
            if not boolean:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, _mul)
        elif code == OP_MAX:
            if ordered:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, greater)
        elif code == OP_MIN:
            if ordered:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, lesser)
        elif code == OP_LAND:
            if integer or boolean:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, _and)
        elif code == OP_LOR:
            if integer or boolean:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, _or)
        elif code == OP_LXOR:
            if integer or boolean:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, _xor)
        elif code == OP_BAND:
            if integer:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, _bitand)
        elif code == OP_BOR:
            if integer:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, _bitor)
        elif code == OP_BXOR:  # noqa: SIM102 (a constant test, pruned)
            if integer:
                _fold_in_order(acc, src, window, stride, offset, skip, ranks, _bitxor)

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


# --- the same, callable from Python -------------------------------------------
# For the reduce steps that Python drives (Reduction.fold and .finish). They
# live here because Numba's cache checks only the time stamp of the file a
# kernel is defined in: beside the ops, a change to an op recompiles them.


@_jit
def fold(out, copy, src, window, stride, offset, skip, ranks, code):
    """:func:`fold_by_code`, compiled once per dtype."""
    fold_by_code(out, copy, src, window, stride, offset, skip, ranks, code)


@_jit
def fold_in_order(acc, src, window, stride, offset, skip, ranks, code):
    """:func:`fold_in_order_by_code`, compiled once per dtype."""
    fold_in_order_by_code(acc, src, window, stride, offset, skip, ranks, code)


@_jit
def divide(acc, divisor):
    """:func:`divide_by`, compiled once per dtype."""
    divide_by(acc, divisor)
