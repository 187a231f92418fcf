"""The op x dtype table: which reductions MPI allows, and the checked pair as a Reduction.

The rest of the package asks this module for a :class:`Reduction` -- the
checked (op, dtype) pair, with the op's number for compiled loops
(:mod:`ringmpi._ops`), its message tag and its lanes -- and never branches on
dtype or op itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from mpi4py import MPI

from . import _ops
from ._errors import UnsupportedError
from ._half import HALF_NAMES, half_kind
from ._ops import (
    OP_BAND,
    OP_BOR,
    OP_BXOR,
    OP_LAND,
    OP_LOR,
    OP_LXOR,
    OP_MAX,
    OP_MIN,
    OP_PROD,
    OP_SUM,
)

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

__all__ = [
    "AVG",
    "DTYPES",
    "HALF_OPS",
    "OPS",
    "Reduction",
    "as_dtype",
    "decode_tag",
    "op_from_name",
    "reduction",
]

HALF_OPS = ("sum", "avg", "max", "min")  # the ops the half types take


def as_dtype(dtype: DTypeLike) -> np.dtype:
    """``np.dtype(dtype)``, where the name ``"bfloat16"`` imports ml_dtypes first
    (which registers it with NumPy; ringmpi imports it only when asked for)."""
    if isinstance(dtype, np.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() == "bfloat16":
        import ml_dtypes  # noqa: PLC0415 (0.2 s: only for those who use it)

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


# --- the op and dtype tables -------------------------------------------------

_INTEGERS: tuple[np.dtype, ...] = tuple(
    np.dtype(t) for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
)
_FLOATS: tuple[np.dtype, ...] = (np.dtype("float32"), np.dtype("float64"))
_COMPLEX: tuple[np.dtype, ...] = (np.dtype("complex64"), np.dtype("complex128"))
_BOOL: tuple[np.dtype, ...] = (np.dtype("bool"),)

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
    code: int  # its number for compiled loops (ringmpi._ops; AVG: SUM's, it divides apart)
    dtypes: tuple[np.dtype, ...]  # the combinations MPI allows
    mpi_op: MPI.Op  # what MPI_Allreduce is given for this op
    ref: np.ufunc  # NumPy's version, for the independent reference result


# A reduction's message tag is 1 + its op's index here * 64 + its dtype's index in
# DTYPES (then the half types): the order is part of the wire format.
_OPS: tuple[_OpSpec, ...] = (
    _OpSpec("sum", MPI.SUM, OP_SUM, _INTEGERS + _FLOATS + _COMPLEX, MPI.SUM, np.add),
    _OpSpec("prod", MPI.PROD, OP_PROD, _INTEGERS + _FLOATS + _COMPLEX, MPI.PROD, np.multiply),
    _OpSpec("max", MPI.MAX, OP_MAX, _INTEGERS + _FLOATS, MPI.MAX, np.maximum),
    _OpSpec("min", MPI.MIN, OP_MIN, _INTEGERS + _FLOATS, MPI.MIN, np.minimum),
    _OpSpec("land", MPI.LAND, OP_LAND, _INTEGERS + _BOOL, MPI.LAND, np.logical_and),
    _OpSpec("lor", MPI.LOR, OP_LOR, _INTEGERS + _BOOL, MPI.LOR, np.logical_or),
    _OpSpec("lxor", MPI.LXOR, OP_LXOR, _INTEGERS + _BOOL, MPI.LXOR, np.logical_xor),
    _OpSpec("band", MPI.BAND, OP_BAND, _INTEGERS, MPI.BAND, np.bitwise_and),
    _OpSpec("bor", MPI.BOR, OP_BOR, _INTEGERS, MPI.BOR, np.bitwise_or),
    _OpSpec("bxor", MPI.BXOR, OP_BXOR, _INTEGERS, MPI.BXOR, np.bitwise_xor),
    _OpSpec("avg", AVG, OP_SUM, _FLOATS + _COMPLEX, MPI.SUM, np.add),
)

OPS: tuple[str, ...] = tuple(spec.name for spec in _OPS)


# MPI's predefined ops that ringmpi leaves to the library (named in its message).
_LIBRARY_OPS = ("MINLOC", "MAXLOC", "REPLACE", "NO_OP")


def _spec_of(op: object) -> _OpSpec:
    for spec in _OPS:
        if op is spec.op or (isinstance(op, MPI.Op) and op == spec.op):
            return spec
    known = ", ".join(f"MPI.{s.name.upper()}" for s in _OPS if s.op is not AVG)
    if isinstance(op, MPI.Op):  # MINLOC, a user's MPI.Op.Create, ...: the library's
        named = [f"MPI.{n}" for n in _LIBRARY_OPS if op == getattr(MPI, n)]
        what = named[0] if named else "a user-defined MPI.Op"
        raise UnsupportedError(
            f"op {what} is not one ringmpi reduces (it does: {known}, ringmpi.AVG)"
        )
    raise ValueError(f"op: unknown reduction operation {op!r} (known: {known}, ringmpi.AVG)")


def op_from_name(name: str) -> object:
    """The op object for a name as the CLI takes it (``sum``, ``max``, ``avg``, ...)."""
    for spec in _OPS:
        if spec.name == name.lower():
            return spec.op
    raise ValueError(f"op: unknown name {name!r} (known: {', '.join(OPS)})")


@dataclass(frozen=True)
class Reduction:
    """A checked (op, dtype) pair: what compiled loops need to carry it out, and the two
    reduce steps that Python drives (:meth:`fold`, :meth:`finish`)."""

    name: str  # "sum", "avg", ...
    dtype: np.dtype
    mpi_op: MPI.Op
    tag: int  # stamped on every message, so ranks that disagree on op or dtype notice
    _is_avg: bool
    code: int  # the op's number for compiled step loops (AVG: SUM's; they divide apart)
    # Complex SUM and AVG act on each real component alone, so their kernels run on
    # the arrays viewed as reals: AVG then divides each component exactly once, and
    # infinities keep a zero imaginary part where complex division would give NaN.
    _split: bool
    # HALF_F16 or HALF_BF16: a half type, reduced by ringmpi._half's fold alone (every
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

    def _partials(self) -> None:
        if self.half:
            raise TypeError(
                f"{self.describe()}: a partial result would be rounded to 16 bits; half types "
                "fold every contribution at once"
            )

    def avg_divisor(self, nranks: int) -> int:
        """What a half-type fold divides by: ``nranks`` for AVG, else 0 (none)."""
        return nranks if self._is_avg and nranks > 1 else 0

    def fold(
        self, out: np.ndarray, copy: np.ndarray, src: np.ndarray, window: np.ndarray,
        stride: int, offset: int, skip: int, ranks: int, in_order: bool = False,
    ) -> None:  # fmt: skip
        """``out = copy = src (op) window[k * stride + offset :][: out.size]`` for every
        rank k < ranks but ``skip``, in rank order.

        ``window`` is a node's shared window as one flat array (rank k's segment
        at ``k * stride``), ``src`` this rank's own contribution (it may be ``out``:
        in place); ``copy`` may be empty. Memory traffic: one read of each input
        and one write of each output. ``in_order``: the left fold in rank order
        instead (the shared_memory algorithm's), ``src`` standing for slot
        ``skip`` (``skip`` < 0: none).
        """
        self._partials()
        lanes, w = self._lanes, 2 if self._split else 1
        if not in_order:
            _ops.fold(lanes(out), lanes(copy), lanes(src), lanes(window), stride * w,
                      offset * w, skip, ranks, self.code)  # fmt: skip
            return
        if ranks == 1:
            acc = src.copy() if skip == 0 else window[offset:][: out.size].copy()
        else:
            acc = np.empty_like(out)
            _ops.fold_in_order(lanes(acc), lanes(src), lanes(window), stride * w, offset * w,
                               skip, ranks, self.code)  # fmt: skip
        out[...] = acc
        copy[...] = acc[: copy.size]

    def finish(self, acc: np.ndarray, nranks: int) -> None:
        """Finish a complete sum made elsewhere (the MPI baseline): AVG divides."""
        self._partials()
        if self._is_avg and nranks > 1:
            _ops.divide(self._lanes(acc), self.divisor(nranks))

    def partials(self) -> Reduction:
        """The reduction that combines partial results made elsewhere (the
        hierarchical rails): AVG's is SUM, divided once by :meth:`finish`; every
        other op's is itself."""
        return reduction(MPI.SUM, self.dtype) if self._is_avg else self

    def describe(self) -> str:
        return f"{self.name} on {self.dtype.name}"

    def warm(self) -> float:
        """Compile (or load from the cache) the kernels of :meth:`fold` and :meth:`finish`
        for this reduction; seconds taken. The compiled loops warm apart
        (``ringmpi.algorithms.warm``); a half type has no kernel of its own."""
        t0 = time.perf_counter()
        if not self.half:
            a = np.zeros(4, self.dtype)
            self.fold(a, a[:0], a.copy(), np.zeros(8, self.dtype), 4, 0, 0, 2)
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
        names = ", ".join([*(d.name for d in DTYPES), *HALF_NAMES])
        raise UnsupportedError(f"dtype {dt} is not supported by ringmpi (supported: {names})")
    if dt not in spec.dtypes:
        halves = HALF_NAMES if spec.name in HALF_OPS else ()
        allowed = ", ".join([*(d.name for d in spec.dtypes), *halves])
        raise TypeError(
            f"op {_op_label(spec)} is not defined for dtype {dt.name} (it takes: {allowed})"
        )
    tag = 1 + _OPS.index(spec) * 64 + DTYPES.index(dt)
    split = dt.kind == "c" and spec.name in ("sum", "avg")
    red = Reduction(spec.name, dt, spec.mpi_op, tag, spec.op is AVG, spec.code, split)
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
    red = Reduction(spec.name, dt, spec.mpi_op, tag, spec.op is AVG, spec.code, False, half)
    _cache[key] = red
    if isinstance(op, MPI.Op) or op is AVG:
        _quick[quick] = red
    return red


def _op_label(spec: _OpSpec) -> str:
    return "ringmpi.AVG" if spec.op is AVG else f"MPI.{spec.name.upper()}"


def decode_tag(code: int) -> tuple[str, str]:
    """The (op, dtype) names a reduction's tag code stands for (for error messages)."""
    k, d = divmod(code - 1, 64)
    if 0 <= k < len(_OPS) and 0 <= d < len(DTYPES):
        return _op_label(_OPS[k]), DTYPES[d].name
    if 0 <= k < len(_OPS) and 0 <= d - len(DTYPES) < len(HALF_NAMES):
        return _op_label(_OPS[k]), HALF_NAMES[d - len(DTYPES)]
    return f"unknown op (code {code})", "unknown dtype"


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("kernels")
