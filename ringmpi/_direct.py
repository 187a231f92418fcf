"""The API's repeat of a prepared call, as one C function that Python calls.

``ringmpi.Allreduce`` is a builtin function (``METH_FASTCALL | METH_KEYWORDS``)
whose C function is compiled by Numba. A call with positional arguments only
(``sendbuf, recvbuf[, op[, comm]]``) that repeats an earlier call the API
remembered with a record's direct cells (``_capi``'s CELL_* layout: the library's
MPI_Allreduce, or an own algorithm's C function) is recognised in compiled
code, by the objects' addresses and the arrays' NumPy fields, and goes straight
to that call: no interpreter frame, no argument parsing, no buffer protocol.
Every other call, and any repeat whose arrays changed, goes to the Python
function (:func:`ringmpi._api.Allreduce`) with its arguments as given, through
``PyObject_Vectorcall``.

What makes an address a safe test of identity: an entry holds the weak
references of its arrays, whose callbacks empty it as either array is freed,
and strong references to its op and communicator, so no other object can take
any of their addresses while the entry stands. An entry names the dtype, the
number of dimensions and the element count, and the arrays' flags are read at
each call (C-contiguous, aligned, and for ``recvbuf`` writeable), as the Python
path checks them. An entry also names the settings snapshot it was made under,
and serves no call while another is in force, a trace is open or a nonblocking
call is queued (which a repeat would overtake). Entries are
forgotten with the API's remembered calls when a communicator is freed or
broken off (``_cache.changed``).

This needs CPython with the GIL (the GIL guards the table; the field offsets,
in :mod:`ringmpi._builtins`, are checked on a real array first). Elsewhere ``ringmpi.Allreduce`` is
the Python function itself, and only this shortcut is missing.
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from mpi4py import MPI
from numba.extending import overload
from numba.np.numpy_support import as_dtype

from . import _builtins, _cache, _progress, _settings, _trace
from ._builtins import _DATA, _DESCR, _FLAGS, _ITEMS, _LEN, _NDIM, _READ, _SHAPE, _WRITE, compiled
from ._capi import (
    CELL_COMM,
    CELL_COUNT,
    CELL_DATATYPE,
    CELL_DTYPE,
    CELL_FN,
    CELL_IN_PLACE,
    CELL_OP,
    CELL_OWN,
    CELL_RAISE,
    call_fn,
    mpi_allreduce,
    peek,
    peek32,
    poke,
    py_incref,
    py_vectorcall,
)

__all__ = ["STALE", "again_from", "again_in_place", "caller", "compiled", "counted", "entry",
           "entry_point", "install", "method", "number", "run_cells", "slot", "warm"]  # fmt: skip

# What a direct call returns when it sent nothing (not an MPI error code: those are >= 0).
STALE = -1

# The table, an int64 array: a header, then _SLOTS entries of _WIDTH cells; the
# entry of a call on recvbuf at address a and comm at address c (None's where the
# call names none) is slot(a ^ c), by Fibonacci hashing (objects allocated in a row,
# 96 bytes apart, reach every slot): an array reduced on two communicators in turn
# keeps a call for each.
(IN_PLACE_OBJ, SUM_OBJ, NONE_OBJ, RAISE, ERROR, SETTINGS_NOW, TRACES, PYTHON, OP_NAME,
 COMM_NAME, PENDING) = range(11)  # fmt: skip
_HEADER = 11
# An entry: the objects, what the arrays must be, the address of the call's cells,
# the callable that raises its errors, the settings snapshot.
(RECV, SEND, OP_OBJ, COMM_OBJ, DESCR, SEND_DESCR, NDIM, SEND_NDIM, CELLS_AT, FAILED,
 SETTINGS) = range(11)  # fmt: skip
_WIDTH = 11
# What the lookup returns when no remembered call matches (not an object's address).
_MISS = -1
# A method's cells (see method): the table, and the method's Python function.
M_TABLE, M_PYTHON = range(2)
_SLOTS = 256
# Fibonacci hashing: the address (its 16-byte units) times 2**64 over the golden
# ratio, whose top bits are the slot.
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SLOT_SHIFT = np.uint64(64 - (_SLOTS - 1).bit_length())
_BITS64 = (1 << 64) - 1
# A caller's cells (see caller): one prepared call.
C_CELLS, C_DESCR, C_NONE, C_RAISE, C_ERROR, C_PYTHON = range(6)


_state: dict[str, Any] = {}
_kept: dict[int, tuple] = {}  # slot -> what keeps its addresses unique


def entry(python: Callable[..., Any]) -> Callable[..., Any]:
    """``ringmpi.Allreduce``: a builtin that runs remembered calls of ``python`` in C
    and every other call through ``python``; ``python`` itself where it cannot."""
    if not _builtins.layout_ok():
        _state["entry"] = python
        return python
    holder = _builtins.holder(_HEADER + _WIDTH * _SLOTS, python, ERROR, PYTHON)
    holder[[IN_PLACE_OBJ, SUM_OBJ, NONE_OBJ, RAISE, SETTINGS_NOW, TRACES, PENDING]] = [
        id(MPI.IN_PLACE),
        id(MPI.SUM),
        id(None),
        id(holder.failed),
        id(_settings._now),
        id(_trace._active),
        id(_progress.pending),
    ]
    # The keywords a call may name (a call site's names are interned, as these are).
    holder[[OP_NAME, COMM_NAME]] = [id(sys.intern("op")), id(sys.intern("comm"))]
    vectorcall = ctypes.cast(ctypes.pythonapi.PyObject_Vectorcall, ctypes.c_void_p).value
    assert vectorcall is not None  # a C API function's address (c_void_p: None for NULL)
    doc = _text_signature(python) + (python.__doc__ or "")
    builtin = _builtins.builtin(python.__name__, doc, python.__module__, holder, vectorcall)
    _state.update(holder=holder, builtin=builtin, methods=[], entry=builtin)
    _cache.derived(_Entries())
    return builtin


def entry_point() -> Callable[..., Any]:
    """What :func:`entry` made: ``ringmpi.Allreduce`` (once the API is loaded)."""
    return _state["entry"]


def method(python: Callable[..., Any]) -> Any:
    """A method of ``ringmpi.Comm`` that runs, as :func:`entry`'s builtin does, the
    remembered calls of ``python(self, sendbuf, recvbuf, op)`` in C, ``self`` being
    the communicator; ``python`` itself where the builtin is not in use. Call
    after :func:`entry`."""
    table = _state.get("holder")
    if table is None:
        return python
    # (its error goes to the table's cells)
    own = _builtins.holder(M_PYTHON + 1, python, M_PYTHON, M_PYTHON)
    own[M_TABLE] = table.ctypes.data
    own.table = table  # kept: its address is in the cells
    vectorcall = ctypes.cast(ctypes.pythonapi.PyObject_Vectorcall, ctypes.c_void_p).value
    assert vectorcall is not None  # a C API function's address
    if table.method.meth != vectorcall:  # calls are remembered already
        vectorcall = compiled(_call_method)
    doc = _text_signature(python) + (python.__doc__ or "")
    builtin = _builtins.builtin(python.__name__, doc, python.__module__, own, vectorcall)
    _state["methods"].append(own)
    bind = ctypes.pythonapi.PyInstanceMethod_New
    bind.restype, bind.argtypes = ctypes.py_object, [ctypes.py_object]
    return bind(builtin)


def _text_signature(python: Callable[..., Any]) -> str:
    """``python``'s signature as a builtin's docstring opens with it, which gives the
    builtin its ``__text_signature__`` (for ``help``, ``inspect.signature``, IDEs).
    Such a signature holds literals only: a default that is none (``MPI.SUM``) shows
    as None, which ``python`` takes for it."""
    params, keyword_only = ["$self"], False
    for p in inspect.signature(python).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not keyword_only:
            params.append("*")
            keyword_only = True
        if p.default is p.empty:
            params.append(p.name)
        elif isinstance(p.default, (str, int, float, bool, type(None))):
            params.append(f"{p.name}={p.default!r}")
        else:
            params.append(f"{p.name}=None")
    return f"{python.__name__}({', '.join(params)})\n--\n\n"


def caller(cells: np.ndarray, dtype: np.dtype, python: Callable[..., Any]) -> Callable[..., Any]:
    """``call(work, source)``: the call of ``cells`` (``_capi``'s CELL_* layout) on
    1-D arrays of ``dtype`` (``source is work``: in place), as a builtin whose C
    function makes it, so that it costs what the C repeat path costs (auto's tuner
    times it); other arrays go to ``python(work, source)``, which is all there is
    where the builtin cannot be made."""
    if not _builtins.layout_ok():
        return python
    holder = _builtins.holder(C_PYTHON + 1, python, C_ERROR, C_PYTHON)
    holder.cells = cells  # kept: its address is in the cells
    holder[:C_ERROR] = [cells.ctypes.data, id(np.dtype(dtype)), id(None),
                        int(cells[CELL_RAISE]) or id(holder.failed)]  # fmt: skip
    return _builtins.builtin("again", caller.__doc__, __name__, holder, compiled(_call_once))


class _Entries:
    """The table's entries, as one of the caches ``_cache.changed`` empties."""

    def clear(self) -> None:
        holder = _state["holder"]
        holder[_HEADER:] = 0
        _kept.clear()


def slot(recvbuf: Any, comm: Any = None) -> int:
    """The slot of the table a call on ``recvbuf`` and ``comm`` (as the call names it;
    None where it names none) is remembered in, by their addresses: one call per
    slot, so calls that share a slot evict each other's. (:func:`_slot_of`'s
    arithmetic in Python: a compiled function's first call from Python in a
    process sets up its dispatcher, which a program's first remembered call would
    pay.)"""
    return ((((id(recvbuf) ^ id(comm)) >> 4) * int(_MIX)) & _BITS64) >> int(_SLOT_SHIFT)


@numba.njit(cache=True)
def _slot_of(x):
    """What :func:`slot` gives for the addresses that XOR to ``x``, in compiled code."""
    return np.int64((np.uint64(x >> 4) * _MIX) >> _SLOT_SHIFT)


def install(sendbuf: Any, recvbuf: np.ndarray, op: Any, comm: Any, cells: np.ndarray,
            settings: _settings.Settings) -> None:  # fmt: skip
    """Run later ``Allreduce(sendbuf, recvbuf, op, comm)`` calls with these very
    objects as the call of ``cells`` (``_capi``'s CELL_* layout), from C, while
    ``settings`` is the snapshot in force and no trace is open. Only exact NumPy
    arrays; nothing where the builtin is not in use."""
    holder = _state.get("holder")
    if holder is None or type(recvbuf) is not np.ndarray:
        return
    in_place = sendbuf is MPI.IN_PLACE
    if not in_place and type(sendbuf) is not np.ndarray:
        return
    if holder.method.meth != compiled(_call):  # the first remembered call: now the C ones
        holder.method.meth = compiled(_call)
        for own in _state["methods"]:
            own.method.meth = compiled(_call_method)
    at = slot(recvbuf, comm)
    base = _HEADER + _WIDTH * at

    def gone(_ref: Any, slot: int = at, recv: int = id(recvbuf)) -> None:
        if holder[_HEADER + _WIDTH * slot + RECV] == recv:  # not taken by another since
            holder[_HEADER + _WIDTH * slot : _HEADER + _WIDTH * (slot + 1)] = 0
            _kept.pop(slot, None)

    refs = (weakref.ref(recvbuf, gone), None if in_place else weakref.ref(sendbuf, gone))
    holder[base : base + _WIDTH] = 0
    _kept[at] = (refs, op, comm, settings, cells)
    send = recvbuf if in_place else sendbuf
    holder[base + SEND : base + _WIDTH] = [
        id(sendbuf), id(op), id(comm), id(recvbuf.dtype), id(send.dtype), recvbuf.ndim,
        send.ndim, cells.ctypes.data, int(cells[CELL_RAISE]) or int(holder[RAISE]),
        id(settings)]  # fmt: skip
    holder[base + RECV] = id(recvbuf)  # last: the entry is whole


def warm() -> None:
    """Compile (or load from Numba's cache) the builtins' C functions."""
    compiled(_call)
    compiled(_call_method)
    compiled(_call_once)
    compiled(_counted_call)


# A counted call's cells: the counted call's own (CELL_IN_PLACE to CELL_RAISE), then
# the address of the cells it runs and that of its int64 cell of calls left.
_INNER, _LEFT = CELL_OWN, CELL_OWN + 1


def counted(cells: np.ndarray, left: np.ndarray) -> np.ndarray:
    """Cells (``_capi``'s CELL_* layout) that make the call of ``cells`` while ``left``
    (an int64 cell) holds calls left, each call counting it down, and otherwise
    send nothing and return STALE. The caller keeps ``cells`` and ``left``, whose
    addresses these hold."""
    own = np.array([*cells[:CELL_OWN], cells.ctypes.data, left.ctypes.data], np.int64)
    own[CELL_FN] = compiled(_counted_call)
    return own


def _counted_call(cells, sbuf, rbuf, count):
    """A counted call's C function (CELL_FN): STALE once no calls are left, else one
    fewer left and the call it counts."""
    left = peek(cells + 8 * _LEFT)
    calls = peek(left)
    if calls <= 0:
        return STALE
    poke(left, calls - 1)
    return run_cells(peek(cells + 8 * _INNER), sbuf, rbuf, count)


def _usable(array, written):
    """Whether compiled code may hand ``array`` to the call as is: C-contiguous,
    aligned and, if the call writes it, writeable (known from its type, when it
    compiles)."""


@overload(_usable)
def _usable_typed(array, written):
    ok = array.layout == "C" and array.aligned
    ok_written = ok and array.mutable
    return lambda array, written: ok_written if written else ok


def number(dtype: np.dtype) -> int:
    """``dtype``'s number as compiled code sees it (CELL_DTYPE; int64's, for a
    ``longlong``)."""
    found = _numbers.get(dtype)
    if found is None:
        found = _numbers[dtype] = as_dtype(numba.from_dtype(np.dtype(dtype))).num
    return found


_numbers: dict[Any, int] = {}


def _dtype_number(work):
    """The NumPy number of ``work``'s dtype (known when it compiles)."""


@overload(_dtype_number)
def _dtype_number_typed(work):
    num = as_dtype(work.dtype).num
    return lambda work: num


@numba.njit(cache=True)
def run_cells(cells, sbuf, rbuf, count):
    """The call of the cells at address ``cells`` on ``count`` elements at ``sbuf``
    (or the cells' MPI_IN_PLACE) into ``rbuf``: 0, an error code, or STALE (a leased
    call with no calls left sent nothing)."""
    fn = peek(cells + 8 * CELL_FN)
    if fn == 0:
        datatype, op = peek(cells + 8 * CELL_DATATYPE), peek(cells + 8 * CELL_OP)
        return np.int64(mpi_allreduce(sbuf, rbuf, count, datatype, op, peek(cells + 8 * CELL_COMM)))
    return call_fn(fn, cells, sbuf, rbuf, count)


@numba.njit(cache=True)
def again_in_place(work, cells):
    """The call of ``cells`` in place on ``work``: 0, an error code, or STALE (nothing
    sent) unless ``work`` is still what ``cells`` were made for."""
    if (
        not _usable(work, True)
        or work.size != cells[CELL_COUNT]
        or _dtype_number(work) != cells[CELL_DTYPE]
    ):
        return STALE
    return run_cells(cells.ctypes.data, cells[CELL_IN_PLACE], work.ctypes.data, work.size)


@numba.njit(cache=True)
def again_from(work, source, cells):
    """The call of ``cells`` from ``source`` into ``work``, as :func:`again_in_place`
    (``source`` may be read-only)."""
    if (
        not _usable(work, True)
        or not _usable(source, False)
        or work.size != cells[CELL_COUNT]
        or source.size != work.size
        or _dtype_number(work) != cells[CELL_DTYPE]
        or _dtype_number(source) != cells[CELL_DTYPE]
    ):
        return STALE
    return run_cells(cells.ctypes.data, source.ctypes.data, work.ctypes.data, work.size)


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


@numba.njit(cache=True)
def _source(send, in_place, in_place_c, descr, ndim, count):
    """What the call reads: MPI_IN_PLACE (``in_place_c``) where ``send`` is
    ``in_place``, else the data of the array at ``send`` if it has dtype ``descr``,
    ``ndim`` dimensions and ``count`` elements, C-contiguous and aligned; 0 if not
    (neither MPI_IN_PLACE nor an array's data is 0)."""
    if send == in_place:
        return in_place_c
    if not _fits(send, descr, ndim, count, _READ):
        return 0
    return peek(send + _DATA)


@numba.njit(cache=True)
def _answer(err, none, failed, error_cell):
    """What a builtin returns once the call returned ``err``: None (a new
    reference), or, with ``err`` written at ``error_cell``, what ``failed()``
    returns (NULL: it raises the call's error)."""
    if err == 0:
        py_incref(none)
        return none
    poke(error_cell, err)
    return py_vectorcall(failed, 0, 0, 0)


@numba.njit(cache=True)
def _lookup(table, pos, npos, kwnames, self_comm):
    """The remembered call on the arguments at ``pos`` (``npos`` positional:
    ``sendbuf, recvbuf[, op[, comm]]``, then the values of the keywords named in
    ``kwnames``, 0 for none), made; a method's ``comm`` is ``self_comm`` (0 for
    the function's). Returns what the builtin returns, or _MISS."""
    most = 3 if self_comm else 4
    if npos < 2 or npos > most:
        return _MISS
    none = peek(table + 8 * NONE_OBJ)
    op = peek(pos + 16) if npos >= 3 else none
    comm = self_comm if self_comm else (peek(pos + 24) if npos == 4 else none)
    if kwnames != 0:
        for i in range(peek(kwnames + _LEN)):
            name, value = peek(kwnames + _ITEMS + 8 * i), peek(pos + 8 * (npos + i))
            if name == peek(table + 8 * OP_NAME) and npos < 3:
                op = value
            elif name == peek(table + 8 * COMM_NAME) and npos < 4 and not self_comm:
                comm = value
            else:
                return _MISS
    if op == none:  # None means MPI.SUM
        op = peek(table + 8 * SUM_OBJ)
    recv = peek(pos + 8)
    at = table + 8 * (_HEADER + _WIDTH * _slot_of(recv ^ comm))
    if peek(at + 8 * RECV) != recv:
        return _MISS
    send, cells = peek(pos), peek(at + 8 * CELLS_AT)
    count = peek(cells + 8 * CELL_COUNT)
    if not (
        peek(peek(peek(table + 8 * SETTINGS_NOW) + _ITEMS)) == peek(at + 8 * SETTINGS)
        and peek(peek(table + 8 * TRACES) + _LEN) == 0
        and peek(peek(table + 8 * PENDING) + _LEN) == 0
        and send == peek(at + 8 * SEND)
        and op == peek(at + 8 * OP_OBJ)
        and comm == peek(at + 8 * COMM_OBJ)
        and _fits(recv, peek(at + 8 * DESCR), peek(at + 8 * NDIM), count, _WRITE)
    ):
        return _MISS
    source = _source(send, peek(table + 8 * IN_PLACE_OBJ), peek(cells + 8 * CELL_IN_PLACE),
                     peek(at + 8 * SEND_DESCR), peek(at + 8 * SEND_NDIM), count)  # fmt: skip
    err = run_cells(cells, source, peek(recv + _DATA), count) if source != 0 else STALE
    if err == STALE:  # not arrays it takes, or a leased call with no calls left: none sent
        return _MISS
    return _answer(err, none, peek(at + 8 * FAILED), table + 8 * ERROR)


def _call(holder, args, nargs, kwnames):
    """The builtin's C function: ``holder`` is its table, ``args[:nargs]`` the
    positional arguments, ``kwnames`` the keywords' names (0: none)."""
    table = peek(holder + _DATA)
    made = _lookup(table, args, nargs, kwnames, 0)
    if made != _MISS:
        return made
    return py_vectorcall(peek(table + 8 * PYTHON), args, nargs, kwnames)


def _call_method(holder, args, nargs, kwnames):
    """A method's C function: ``args[0]`` is the communicator, then ``sendbuf,
    recvbuf[, op]``."""
    own = peek(holder + _DATA)
    if nargs >= 1:
        made = _lookup(peek(own + 8 * M_TABLE), args + 8, nargs - 1, kwnames, peek(args))
        if made != _MISS:
            return made
    return py_vectorcall(peek(own + 8 * M_PYTHON), args, nargs, kwnames)


def _call_once(holder, args, nargs, kwnames):
    """A caller's C function: ``args`` are (work, source)."""
    own = peek(holder + _DATA)
    if kwnames == 0 and nargs == 2:
        work, source = peek(args), peek(args + 8)
        cells, descr = peek(own + 8 * C_CELLS), peek(own + 8 * C_DESCR)
        count = peek(cells + 8 * CELL_COUNT)
        sbuf = _source(source, work, peek(cells + 8 * CELL_IN_PLACE), descr, 1, count)
        if _fits(work, descr, 1, count, _WRITE) and sbuf != 0:
            err = run_cells(cells, sbuf, peek(work + _DATA), count)
            if err == STALE:
                return py_vectorcall(peek(own + 8 * C_PYTHON), args, nargs, kwnames)
            return _answer(err, peek(own + 8 * C_NONE), peek(own + 8 * C_RAISE),
                           own + 8 * C_ERROR)  # fmt: skip
    return py_vectorcall(peek(own + 8 * C_PYTHON), args, nargs, kwnames)
