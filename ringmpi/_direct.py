"""The API's repeat of the library's call, as one C function that Python calls.

``ringmpi.Allreduce`` is a builtin function (``METH_FASTCALL | METH_KEYWORDS``)
whose C function is compiled by Numba. A call with positional arguments only
(``sendbuf, recvbuf[, op[, comm]]``) that repeats an earlier call the API
remembered for the library's own MPI_Allreduce (see ``_api``) is recognised in
compiled code, by the objects' addresses and the arrays' NumPy fields, and goes
straight to MPI_Allreduce: no interpreter frame, no argument parsing, no
buffer protocol. Every other call, and any repeat whose arrays changed, goes to
the Python function (:func:`ringmpi._api.Allreduce`) with its arguments as
given, through ``PyObject_Vectorcall``.

What makes an address a safe test of identity: an entry holds the weak
references of its arrays, whose callbacks empty it as either array is freed,
and strong references to its op and communicator, so no other object can take
any of their addresses while the entry stands. An entry names the dtype, the
number of dimensions and the element count, and the arrays' flags are read at
each call (C-contiguous, aligned, and for ``recvbuf`` writeable), as the Python
path checks them. Entries are forgotten with the API's remembered calls
(``_cache.changed``: the settings, a trace, a freed communicator).

This needs CPython with the GIL (the GIL guards the table; the field offsets
below are checked on a real array first). Elsewhere ``ringmpi.Allreduce`` is
the Python function itself, and only this shortcut is missing.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from mpi4py import MPI
from numba import types

from . import _cache
from ._capi import (
    CELL_COMM,
    CELL_COUNT,
    CELL_DATATYPE,
    CELL_OP,
    mpi_allreduce,
    peek,
    peek32,
    poke,
    py_incref,
    py_vectorcall,
)

__all__ = ["entry", "install", "warm"]

# A PyObject's header (reference count, type), then NumPy's PyArrayObject fields.
_DATA, _NDIM, _SHAPE, _DESCR, _FLAGS = 16, 24, 32, 56, 64
_C_CONTIGUOUS, _ALIGNED, _WRITEABLE = 0x1, 0x100, 0x400  # NPY_ARRAY_* flags
_READ, _WRITE = _C_CONTIGUOUS | _ALIGNED, _C_CONTIGUOUS | _ALIGNED | _WRITEABLE
_METH_FASTCALL_KEYWORDS = 0x80 | 0x2

# The table, an int64 array: a header, then _SLOTS entries of _WIDTH cells; the
# entry of recvbuf at address a is slot (a >> 4) & (_SLOTS - 1).
(IN_PLACE_OBJ, IN_PLACE_C, SUM_OBJ, NONE_OBJ, RAISE, ERROR, MASK) = range(7)
_HEADER = 8
(RECV, SEND, OP_OBJ, COMM_OBJ, DESCR, SEND_DESCR, NDIM, SEND_NDIM, COUNT, DATATYPE, OP,
 COMM) = range(12)  # fmt: skip
_WIDTH = 12
_SLOTS = 256


class _Holder(np.ndarray):
    """The builtin's ``self``: the table (its data), and, when called, the Python
    function (how the C function's first version, PyObject_Vectorcall, reaches it)."""

    python: Callable[..., Any]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.python(*args, **kwargs)


class _MethodDef(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("meth", ctypes.c_void_p),
                ("flags", ctypes.c_int), ("doc", ctypes.c_char_p)]  # fmt: skip


_state: dict[str, Any] = {}
_kept: dict[int, tuple] = {}  # slot -> what keeps its addresses unique


def _layout_ok() -> bool:
    """Whether this interpreter and NumPy lay an array out as the offsets above say."""
    if sys.implementation.name != "cpython" or not getattr(sys, "_is_gil_enabled", lambda: True)():
        return False
    if np.dtype(np.intp).itemsize != 8 or not hasattr(ctypes.pythonapi, "PyObject_Vectorcall"):
        return False
    a = np.zeros((3, 5), np.float32)[::2]  # not contiguous: flags tell
    peek = lambda off, t=ctypes.c_int64: t.from_address(id(a) + off).value  # noqa: E731
    shape = ctypes.cast(peek(_SHAPE), ctypes.POINTER(ctypes.c_int64))
    return (
        peek(_DATA) == a.ctypes.data
        and peek(_NDIM, ctypes.c_int32) == 2
        and (shape[0], shape[1]) == a.shape
        and peek(_DESCR) == id(a.dtype)
        and peek(_FLAGS, ctypes.c_int32) & _READ == _ALIGNED
        and ctypes.c_int32.from_address(id(np.zeros(2)) + _FLAGS).value & _WRITE == _WRITE
    )


def entry(python: Callable[..., Any]) -> Callable[..., Any]:
    """``ringmpi.Allreduce``: a builtin that runs remembered calls of ``python`` in C
    and every other call through ``python``; ``python`` itself where it cannot."""
    if not _layout_ok():
        return python
    holder = np.zeros(_HEADER + _WIDTH * _SLOTS, np.int64).view(_Holder)
    holder.python = python
    holder[[IN_PLACE_OBJ, IN_PLACE_C, SUM_OBJ, NONE_OBJ, RAISE, MASK]] = [
        id(MPI.IN_PLACE),
        int(MPI.IN_PLACE),
        id(MPI.SUM),
        id(None),
        id(_raise),
        _SLOTS - 1,
    ]
    doc = (python.__doc__ or "").encode()
    method = _MethodDef(python.__name__.encode(), _address(ctypes.pythonapi.PyObject_Vectorcall),
                        _METH_FASTCALL_KEYWORDS, doc)  # fmt: skip
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object,
                                                   ctypes.py_object]  # fmt: skip
    builtin = new(ctypes.addressof(method), holder, python.__module__)
    _state.update(holder=holder, method=method, builtin=builtin)
    _cache.derived(_Entries())
    return builtin


def _address(fn: Any) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def _raise() -> None:
    """What the C function calls when MPI_Allreduce returned an error code."""
    raise MPI.Exception(int(_state["holder"][ERROR]))


class _Entries:
    """The table's entries, as one of the caches ``_cache.changed`` empties."""

    def clear(self) -> None:
        holder = _state["holder"]
        holder[_HEADER:] = 0
        _kept.clear()


def install(sendbuf: Any, recvbuf: np.ndarray, op: Any, comm: Any, cells: np.ndarray) -> None:
    """Run later ``Allreduce(sendbuf, recvbuf, op, comm)`` calls with these very
    objects as MPI_Allreduce with ``cells`` (MPI_IN_PLACE, datatype, op, comm
    handles, count), from C. Only exact NumPy arrays; nothing where the builtin
    is not in use."""
    holder = _state.get("holder")
    if holder is None or type(recvbuf) is not np.ndarray:
        return
    in_place = sendbuf is MPI.IN_PLACE
    if not in_place and type(sendbuf) is not np.ndarray:
        return
    if _state["method"].meth != _state.setdefault("compiled", _compiled()):
        _state["method"].meth = _state["compiled"]
    slot = (id(recvbuf) >> 4) & (_SLOTS - 1)
    base = _HEADER + _WIDTH * slot

    def gone(_ref: Any, slot: int = slot, recv: int = id(recvbuf)) -> None:
        if holder[_HEADER + _WIDTH * slot + RECV] == recv:  # not taken by another since
            holder[_HEADER + _WIDTH * slot : _HEADER + _WIDTH * (slot + 1)] = 0
            _kept.pop(slot, None)

    refs = (weakref.ref(recvbuf, gone), None if in_place else weakref.ref(sendbuf, gone))
    holder[base : base + _WIDTH] = 0
    _kept[slot] = (refs, op, comm)
    send = recvbuf if in_place else sendbuf
    holder[base + SEND : base + _WIDTH] = [
        id(sendbuf), id(op), id(comm), id(recvbuf.dtype), id(send.dtype), recvbuf.ndim,
        send.ndim, int(cells[CELL_COUNT]), int(cells[CELL_DATATYPE]), int(cells[CELL_OP]),
        int(cells[CELL_COMM])]  # fmt: skip
    holder[base + RECV] = id(recvbuf)  # last: the entry is whole


def warm() -> None:
    """Compile (or load from Numba's cache) the C function."""
    if "holder" in _state:
        _state.setdefault("compiled", _compiled())


def _compiled() -> int:
    """The C function's address (the first use compiles it, or loads it from the cache)."""
    return numba.cfunc(types.int64(types.int64, types.int64, types.int64, types.int64),
                       cache=True)(_call).address  # fmt: skip


@numba.njit(cache=True)
def _fits(array, descr, ndim, count, flags):
    """Whether the array at ``array`` has dtype ``descr``, ``ndim`` dimensions,
    ``count`` elements and all of ``flags``."""
    if peek(array + _DESCR) != descr or peek32(array + _NDIM) != ndim:
        return False
    if peek32(array + _FLAGS) & flags != flags:
        return False
    shape, n = peek(array + _SHAPE), 1
    for i in range(ndim):
        n *= peek(shape + 8 * i)
    return n == count


def _call(holder, args, nargs, kwnames):
    """The builtin's C function: ``holder`` is its table, ``args[:nargs]`` the
    positional arguments, ``kwnames`` the keywords' names (0: none)."""
    table = peek(holder + _DATA)
    if kwnames == 0 and 2 <= nargs <= 4:
        recv = peek(args + 8)
        at = table + 8 * (_HEADER + _WIDTH * ((recv >> 4) & peek(table + 8 * MASK)))
        if peek(at + 8 * RECV) == recv:
            send = peek(args)
            op = peek(args + 16) if nargs >= 3 else peek(table + 8 * SUM_OBJ)
            comm = peek(args + 24) if nargs == 4 else peek(table + 8 * NONE_OBJ)
            count = peek(at + 8 * COUNT)
            if (
                send == peek(at + 8 * SEND)
                and op == peek(at + 8 * OP_OBJ)
                and comm == peek(at + 8 * COMM_OBJ)
                and _fits(recv, peek(at + 8 * DESCR), peek(at + 8 * NDIM), count, _WRITE)
            ):
                source = peek(table + 8 * IN_PLACE_C)
                if send != peek(table + 8 * IN_PLACE_OBJ):
                    if not _fits(send, peek(at + 8 * SEND_DESCR), peek(at + 8 * SEND_NDIM),
                                 count, _READ):  # fmt: skip
                        return py_vectorcall(holder, args, nargs, kwnames)
                    source = peek(send + _DATA)
                err = mpi_allreduce(source, peek(recv + _DATA), count, peek(at + 8 * DATATYPE),
                                    peek(at + 8 * OP), peek(at + 8 * COMM))  # fmt: skip
                if err == 0:
                    none = peek(table + 8 * NONE_OBJ)
                    py_incref(none)
                    return none
                poke(table + 8 * ERROR, err)
                return py_vectorcall(peek(table + 8 * RAISE), 0, 0, 0)
    return py_vectorcall(holder, args, nargs, kwnames)
