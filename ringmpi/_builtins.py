"""Builtin functions whose C function Numba compiles: called from Python with no
interpreter frame between (``METH_FASTCALL | METH_KEYWORDS``).

A builtin's ``self`` is its cells (an int64 array, :func:`holder`), which its C
function ``fn(self, args, nargs, kwnames)`` reads by address; among them the
Python function that the calls it does not take go to. The API's repeat path
(:mod:`ringmpi._direct`) and the start of a generalized request
(:mod:`ringmpi._progress`) are made so. This needs CPython with the GIL, and the
object layouts below (checked on real objects first: :func:`layout_ok`).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from mpi4py import MPI
from numba import types

from . import _numba_cache  # noqa: F401  (its cache, safe for processes compiling at once)

__all__ = ["Holder", "builtin", "compiled", "holder", "layout_ok", "made"]

# A PyObject's header (reference count, type), then NumPy's PyArrayObject fields.
_DATA, _NDIM, _SHAPE, _DESCR, _FLAGS = 16, 24, 32, 56, 64
_C_CONTIGUOUS, _ALIGNED, _WRITEABLE = 0x1, 0x100, 0x400  # NPY_ARRAY_* flags
_READ, _WRITE = _C_CONTIGUOUS | _ALIGNED, _C_CONTIGUOUS | _ALIGNED | _WRITEABLE
_METH_FASTCALL_KEYWORDS = 0x80 | 0x2

# A list's length and the address of its items (PyListObject); a tuple's items lie
# in the object itself, from _ITEMS on (PyTupleObject: the keywords' names).
_LEN, _ITEMS = 16, 24


class Holder(np.ndarray):
    """A builtin's ``self``: its cells (the array's data), among them the address
    of the Python function that the C function hands every other call to; called,
    that function (what the builtin runs before its C function is compiled: its
    first C function is PyObject_Vectorcall, on ``self``)."""

    failed: Callable[[], None]  # raises MPI.Exception for the error code in the cells
    method: Any  # the builtin's PyMethodDef, kept as long as the builtin
    cells: np.ndarray  # a caller's call, kept as long as the builtin
    table: np.ndarray  # a method's table, kept as long as the builtin
    kept: tuple  # what else its cells name by address, kept as long as the builtin
    fn: Any  # its C function, where it is turned on later (ringmpi._direct)
    _python: Callable[..., Any]
    _cell: int

    @property
    def python(self) -> Callable[..., Any]:
        return self._python

    @python.setter
    def python(self, fn: Callable[..., Any]) -> None:
        self._python = fn  # kept: its address is in the cells
        self[self._cell] = id(fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._python(*args, **kwargs)


def holder(cells: int, python: Callable[..., Any], error: int, cell: int) -> Holder:
    """A builtin's ``self``: ``cells`` cells, ``python``'s address at cell ``cell``, and
    ``failed()``, which raises the MPI error code at cell ``error``."""
    holder = np.zeros(cells, np.int64).view(Holder)
    holder._cell = cell
    holder.python = python

    def failed() -> None:
        raise MPI.Exception(int(holder[error]))

    holder.failed = failed
    return holder


def builtin(name: str, doc: str | None, module: str, holder: Holder, meth: int) -> Any:
    """A builtin function (METH_FASTCALL | METH_KEYWORDS) of C function ``meth``,
    whose ``self`` is ``holder``."""
    holder.method = _MethodDef(name.encode(), meth, _METH_FASTCALL_KEYWORDS,
                               (doc or "").encode())  # fmt: skip
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object,
                                                   ctypes.py_object]  # fmt: skip
    return new(ctypes.addressof(holder.method), holder, module)


class _MethodDef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("meth", ctypes.c_void_p),
                ("flags", ctypes.c_int), ("doc", ctypes.c_char_p)]  # fmt: skip


@functools.cache
def layout_ok() -> bool:
    """Whether this interpreter and NumPy lay an array out as the offsets above say
    (found once: they stay as they are for the process)."""
    if sys.implementation.name != "cpython" or not getattr(sys, "_is_gil_enabled", lambda: True)():
        return False
    if np.dtype(np.intp).itemsize != 8 or not hasattr(ctypes.pythonapi, "PyObject_Vectorcall"):
        return False
    a = np.zeros((3, 5), np.float32)[::2]  # not contiguous: flags tell
    peek = lambda off, t=ctypes.c_int64: t.from_address(id(a) + off).value  # noqa: E731
    shape = ctypes.cast(peek(_SHAPE), ctypes.POINTER(ctypes.c_int64))
    items = [a]
    peek_list = lambda off: ctypes.c_int64.from_address(id(items) + off).value  # noqa: E731
    return (
        peek_list(_LEN) == 1
        and ctypes.c_int64.from_address(peek_list(_ITEMS)).value == id(a)
        and peek(_DATA) == a.ctypes.data
        and peek(_NDIM, ctypes.c_int32) == 2
        and (shape[0], shape[1]) == a.shape
        and peek(_DESCR) == id(a.dtype)
        and peek(_FLAGS, ctypes.c_int32) & _READ == _ALIGNED
        and ctypes.c_int32.from_address(id(np.zeros(2)) + _FLAGS).value & _WRITE == _WRITE
    )


_SIGNATURE = types.int64(types.int64, types.int64, types.int64, types.int64)
_made: dict[Callable[..., Any], int] = {}


def compiled(fn: Callable[..., Any]) -> int:
    """The address of C function ``fn``, ``int64 fn(int64, int64, int64, int64)`` (the
    builtins' and an own algorithm's CELL_FN; its first use compiles it, or loads it
    from Numba's cache)."""
    found = _made.get(fn)
    if found is None:
        address = numba.cfunc(_SIGNATURE, cache=True)(fn).address
        assert address is not None  # numba.cfunc compiles at once: the address is set
        found = _made[fn] = address
    return found


def made(name: str, fn: Callable[..., Any], cells: Holder) -> Callable[..., Any]:
    """A builtin whose C function is ``fn(self, args, nargs, kwnames)`` compiled, ``self``
    being ``cells`` (:func:`holder`); ``cells.python`` where builtins cannot be made
    (:func:`layout_ok`)."""
    if not layout_ok():
        return cells.python
    return builtin(name, fn.__doc__, __name__, cells, compiled(fn))
