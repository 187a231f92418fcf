"""Verifiable all-reduce data: inputs whose exact result is known, and the check.

Inputs are small integers (also in float and complex types) that depend on
(rank, i mod PERIOD) only, so every reduction order gives the same exact
result, and the expected result of N ranks is a table of PERIOD values,
computed with NumPy's ufuncs, apart from the kernels under test.
"""

from __future__ import annotations

import numpy as np

from .kernels import AVG, _OpSpec, _spec_of, as_dtype, reduction

__all__ = ["PERIOD", "count_wrong", "verify_expected", "verify_inputs"]

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
    """The exact result of all-reducing :func:`verify_inputs` over ``nranks`` ranks."""
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
    whole expected array (at many ranks of large buffers that costs seconds of
    page faults).
    """
    flat = result.reshape(-1)
    table = verify_expected(op, flat.dtype, nranks, PERIOD)
    whole = flat.size - flat.size % PERIOD
    wrong = np.count_nonzero(flat[:whole].reshape(-1, PERIOD) != table)
    return int(wrong + np.count_nonzero(flat[whole:] != table[: flat.size - whole]))


def _tile(period: np.ndarray, count: int) -> np.ndarray:
    """``count`` elements repeating ``period`` (np.resize builds it from a tuple: slow)."""
    return np.tile(period, -(-count // period.size))[:count]


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
