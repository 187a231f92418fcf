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

A nonblocking or persistent all-reduce on the objects of a remembered call,
carried out by the completion calls, starts in C the same way (:func:`nonblocking`,
:func:`persistent`): its generalized request started, the call kept in the
request's cells until its ``Wait`` makes it in C (:func:`completion`), or until
anything else on the way hands it to its queue (:func:`take_deferred`).

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
    mpi_wait,
    peek,
    peek32,
    poke,
    py_decref,
    py_incref,
    py_vectorcall,
)
from ._progress import (
    _B_FNS,
    _B_OFFSET,
    _B_STACK,
    _B_WIDE,
    _HANDLE_OFFSET,
    REQ_COUNT,
    REQ_KEPT,
    REQ_RAISE,
    REQ_RBUF,
    REQ_RECV,
    REQ_RUN,
    REQ_SBUF,
    REQ_SELF,
    REQ_SEND,
    _grequest_end,
    _pop_begin,
)

__all__ = ["STALE", "again_from", "again_in_place", "caller", "compiled", "completion",
           "counted", "defer", "entry", "entry_point", "install", "method", "nonblocking",
           "number", "persistent", "run_cells", "slot", "slot_offset", "take_deferred",
           "warm"]  # fmt: skip

# What a direct call returns when it sent nothing (not an MPI error code: those are >= 0).
STALE = -1

# The table, an int64 array: a header, then _SLOTS entries of _WIDTH cells; the
# entry of a call on recvbuf at address a and comm at address c (None's where the
# call names none) is slot(a ^ c), by Fibonacci hashing (objects allocated in a row,
# 96 bytes apart, reach every slot): an array reduced on two communicators in turn
# keeps a call for each.
# The header ends with the nonblocking call started in C and not yet carried out (the
# address of its request's cells, ringmpi._progress's layout; 0: none) and the C
# function of a counted call (see counted).
(IN_PLACE_OBJ, SUM_OBJ, NONE_OBJ, FAILS, ERROR, SETTINGS_NOW, TRACES, PYTHON, OP_NAME,
 COMM_NAME, PENDING, DEFERRED, COUNTED) = range(13)  # fmt: skip
_HEADER = 13
# An entry: the objects, what the arrays must be, the address of the call's cells,
# the callable that raises its errors, the settings snapshot; whether a nonblocking
# call on these objects may start in C (see nonblocking), and the tuple that keeps
# what the entry's addresses name.
(RECV, SEND, OP_OBJ, COMM_OBJ, DESCR, SEND_DESCR, NDIM, SEND_NDIM, CELLS_AT, FAILED,
 SETTINGS, DEFER, KEPT_OBJ) = range(13)  # fmt: skip
_WIDTH = 13
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
    holder[[IN_PLACE_OBJ, SUM_OBJ, NONE_OBJ, FAILS, SETTINGS_NOW, TRACES, PENDING]] = [
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
    doc = _text_signature(python) + (python.__doc__ or "")
    builtin = _builtins.builtin(python.__name__, doc, python.__module__, holder, _vectorcall())
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
    vectorcall = _vectorcall()
    if table.method.meth != vectorcall:  # calls are remembered already
        vectorcall = compiled(_call_method)
    doc = _text_signature(python) + (python.__doc__ or "")
    _state["methods"].append(own)
    return _bound(_builtins.builtin(python.__name__, doc, python.__module__, own, vectorcall))


def _vectorcall() -> int:
    """PyObject_Vectorcall's address: a builtin's C function that hands every call to
    its cells' Python function (until its own C function is turned on)."""
    vectorcall = ctypes.cast(ctypes.pythonapi.PyObject_Vectorcall, ctypes.c_void_p).value
    assert vectorcall is not None  # a C API function's address (c_void_p: None for NULL)
    return vectorcall


def _bound(builtin: Any) -> Any:
    """``builtin`` as a method: its first argument the object it is looked up on."""
    bind = ctypes.pythonapi.PyInstanceMethod_New
    bind.restype, bind.argtypes = ctypes.py_object, [ctypes.py_object]
    return bind(builtin)


# A nonblocking call's cells (see nonblocking): the table, the cells of the begin
# builtin of ringmpi._progress's generalized requests, the Request class,
# ``pending.append`` and the mark it appends, the Python function; a persistent
# start's (see persistent) go on with the offset of its request's objects (an
# int64 array of the addresses of sendbuf, recvbuf, op and comm) and the handle of
# an inactive request as compiled code reads it.
I_TABLE, I_BEGIN, I_CLASS, I_APPEND, I_MARK, I_PYTHON, P_OBJECTS, P_NULL = range(8)
# A completion's cells (see completion): the table, the begin builtin's cells (as a
# start's: where a Request object's handle lies), ``pending.clear``, True, room for
# an MPI_Status, the Python method.
W_TABLE, W_BEGIN, W_CLEAR, W_TRUE, W_STATUS, W_PYTHON = range(6)
assert (W_TABLE, W_BEGIN) == (I_TABLE, I_BEGIN)  # (defer sets them alike)
_STATUS_BYTES = 256  # (MPI_Status is 20-40 bytes in the MPI families)


def nonblocking(python: Callable[..., Any], request: type, pending: list[Any]) -> Any:
    """``ringmpi.Iallreduce``: a builtin that starts a nonblocking call on objects
    whose blocking call is remembered in the table (:func:`install`) and marked
    (:func:`defer`) in C, where no call is queued (``pending`` empty) and none
    started so: a generalized request (of class ``request``) whose call its
    completion (:func:`completion`) makes, in C; ``pending`` holds a mark while it
    is started. Every other call goes to ``python``, which hands such a started
    call to its queue first (:func:`take_deferred`), as it must before it queues
    another or a blocking call runs. ``python`` itself where the builtin is not in
    use."""
    table = _state.get("holder")
    if table is None:
        return python
    own = _builtins.holder(I_PYTHON + 1, python, I_PYTHON, I_PYTHON)
    append = pending.append  # (a bound method: made anew at each lookup)
    own.kept = (table, request, append)  # their addresses are in the cells
    own[[I_TABLE, I_CLASS, I_APPEND, I_MARK]] = [table.ctypes.data, id(request), id(append),
                                                  id(_MARK)]  # fmt: skip
    doc = _text_signature(python) + (python.__doc__ or "")
    _state["nonblocking"] = own
    return _builtins.builtin(python.__name__, doc, python.__module__, own, _vectorcall())


def persistent(python: Callable[..., Any], objects: int, pending: list[Any]) -> Any:
    """``Start`` of a persistent request (a method): as :func:`nonblocking`'s start,
    in C, of the call on the objects whose addresses the request holds at offset
    ``objects`` (an int64 array: sendbuf, recvbuf, op, comm; NULL: none), into the
    request itself where it is inactive; ``python(self)`` otherwise. Call after
    :func:`nonblocking`."""
    table = _state.get("holder")
    if table is None or "nonblocking" not in _state:
        return python
    own = _builtins.holder(P_NULL + 1, python, I_PYTHON, I_PYTHON)
    append = pending.append  # (a bound method: made anew at each lookup)
    own.kept = (table, append)  # their addresses are in the cells
    null = MPI.Request()
    wide = MPI._sizeof(MPI.Request) == 8
    at = id(null) + _HANDLE_OFFSET
    idle = (ctypes.c_int64 if wide else ctypes.c_int32).from_address(at).value
    own[[I_TABLE, I_APPEND, I_MARK, P_OBJECTS, P_NULL]] = [table.ctypes.data, id(append),
                                                            id(_MARK), objects, idle]  # fmt: skip
    return _method("Start", python, own, _pstart)


def slot_offset(cls: type, name: str) -> int:
    """Where in an object of ``cls`` its ``__slots__`` member ``name`` lies (found on
    a probe: a member descriptor says so only from Python 3.12)."""
    probe, marker = cls(), object()
    setattr(probe, name, marker)
    for offset in range(16, cls.__basicsize__, 8):  # (past the object's header)
        if ctypes.c_int64.from_address(id(probe) + offset).value == id(marker):
            return offset
    raise RuntimeError(f"{cls.__name__}.{name} not found in its objects")


def completion(python: Callable[..., Any], pending: list[Any]) -> Any:
    """``Wait`` of the requests of :func:`nonblocking` and :func:`persistent`: a method
    whose C function makes the call that request started in C, completes its
    generalized request and waits on it; ``python(self, *args)`` for every other
    request and call. Call after :func:`nonblocking`."""
    if "nonblocking" not in _state:
        return python
    table = _state["holder"]
    own = _builtins.holder(W_PYTHON + 1, python, W_PYTHON, W_PYTHON)
    status = np.zeros(_STATUS_BYTES, np.uint8)
    clear = pending.clear  # (a bound method: made anew at each lookup)
    own.kept = (table, clear, status)  # their addresses are in the cells
    own[[W_TABLE, W_CLEAR, W_TRUE, W_STATUS]] = [table.ctypes.data, id(clear), id(True),
                                                  status.ctypes.data]  # fmt: skip
    return _method("Wait", python, own, _iwait)


def _method(name: str, python: Callable[..., Any], own: _builtins.Holder, fn: Any) -> Any:
    """A method whose builtin's cells are ``own``: ``python`` until :func:`defer` turns
    the C functions on (``fn``'s)."""
    own.fn = fn
    _state.setdefault("methods of requests", []).append(own)
    return _bound(_builtins.builtin(name, python.__doc__, __name__, own, _vectorcall()))


# What a nonblocking call started in C puts in ringmpi._progress.pending (which it
# found empty): a blocking repeat, from C or Python, takes the full path meanwhile.
_MARK = "a nonblocking call started in C"


def defer(sendbuf: Any, recvbuf: Any, op: Any, comm: Any) -> None:
    """Let later nonblocking calls on these very objects start in C (:func:`nonblocking`),
    where the table remembers their blocking call: a nonblocking call decided
    ringmpi's own call for them, carried out in the completion calls
    (:func:`ringmpi._progress.deferrable`). The first such call turns the
    builtins' C functions on."""
    holder, own = _state.get("holder"), _state.get("nonblocking")
    if holder is None or own is None:
        return
    if own.method.meth != compiled(_istart):  # the first such call: now the C ones
        begin = _progress._MPIX._begin_cells  # (the generalized requests' start)
        own.fn = _istart
        for cells in [own, *_state.get("methods of requests", [])]:
            cells.kept += (begin,)
            cells[I_BEGIN] = begin.ctypes.data
            cells.method.meth = compiled(cells.fn)
    base = _HEADER + _WIDTH * slot(recvbuf, comm)
    item = holder.item
    if item(base + RECV) != id(recvbuf) or item(base + SEND) != id(sendbuf):
        return  # (not remembered yet: its blocking call's install marks it)
    if item(base + OP_OBJ) == id(op) and item(base + COMM_OBJ) == id(comm):
        holder[base + DEFER] = 1


def take_deferred() -> tuple | None:
    """The nonblocking call started in C and not yet carried out, taken from C: (its
    request's cells, the request, sendbuf, recvbuf, op, comm), the references the
    cells held now the caller's, the mark gone from ``pending``; None where there
    is none."""
    holder = _state.get("holder")
    if holder is None or not holder[DEFERRED]:
        return None
    state = int(holder[DEFERRED])
    holder[DEFERRED] = 0
    held = []
    for at in (REQ_SELF, REQ_SEND, REQ_RECV, REQ_KEPT):
        address = ctypes.c_int64.from_address(state + 8 * at).value
        held.append(ctypes.cast(address, ctypes.py_object).value)  # (a reference of its own)
        ctypes.pythonapi.Py_DecRef(ctypes.c_void_p(address))  # (the cells')
    _progress.pending.clear()
    request, send, recv, (_refs, op, comm, _settings_then, _call_kept) = held
    return state, request, send, recv, op, comm


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


def install(sendbuf: Any, recvbuf: np.ndarray, op: Any, comm: Any, call: Any,
            settings: _settings.Settings) -> None:  # fmt: skip
    """Run later ``Allreduce(sendbuf, recvbuf, op, comm)`` calls with these very
    objects as the call of ``call.cells`` (a registry.Call; ``_capi``'s CELL_* layout),
    from C, while ``settings`` is the snapshot in force and no trace is open. Only
    exact NumPy arrays; nothing where the builtin is not in use."""
    cells = call.cells
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
    kept = _kept[at] = (refs, op, comm, settings, call)
    send = recvbuf if in_place else sendbuf
    holder[base + SEND : base + _WIDTH] = [
        id(sendbuf), id(op), id(comm), id(recvbuf.dtype), id(send.dtype), recvbuf.ndim,
        send.ndim, cells.ctypes.data, int(cells[CELL_RAISE]) or int(holder[FAILS]),
        id(settings), 0, id(kept)]  # fmt: skip
    holder[base + RECV] = id(recvbuf)  # last: the entry is whole


def warm() -> None:
    """Compile (or load from Numba's cache) the builtins' C functions."""
    compiled(_call)
    compiled(_call_method)
    compiled(_call_once)
    compiled(_counted_call)
    if _progress._MPIX.usable():  # (MPIX_Grequest_start: not every MPI has it)
        compiled(_istart)
        compiled(_pstart)
        compiled(_iwait)


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
    holder = _state.get("holder")
    if holder is not None:  # what a nonblocking call started in C knows it by
        holder[COUNTED] = own[CELL_FN]
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
def _match(table, pos, npos, kwnames, self_comm):
    """The remembered call on the arguments at ``pos`` (``npos`` positional:
    ``sendbuf, recvbuf[, op[, comm]]``, then the values of the keywords named in
    ``kwnames``, 0 for none); a method's ``comm`` is ``self_comm`` (0 for the
    function's): (its entry's address, what it reads, recvbuf's address), or
    (0, 0, 0) where none matches these arrays or a call is queued."""
    most = 3 if self_comm else 4
    if npos < 2 or npos > most:
        return 0, 0, 0
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
                return 0, 0, 0
    if op == none:  # None means MPI.SUM
        op = peek(table + 8 * SUM_OBJ)
    recv = peek(pos + 8)
    at = table + 8 * (_HEADER + _WIDTH * _slot_of(recv ^ comm))
    if peek(at + 8 * RECV) != recv:
        return 0, 0, 0
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
        return 0, 0, 0
    source = _source(send, peek(table + 8 * IN_PLACE_OBJ), peek(cells + 8 * CELL_IN_PLACE),
                     peek(at + 8 * SEND_DESCR), peek(at + 8 * SEND_NDIM), count)  # fmt: skip
    return (at, source, recv) if source != 0 else (0, 0, 0)


@numba.njit(cache=True)
def _lookup(table, pos, npos, kwnames, self_comm):
    """The remembered call on the arguments at ``pos`` (:func:`_match`), made: what the
    builtin returns, or _MISS."""
    at, source, recv = _match(table, pos, npos, kwnames, self_comm)
    if at == 0:
        return _MISS
    cells = peek(at + 8 * CELLS_AT)
    err = run_cells(cells, source, peek(recv + _DATA), peek(cells + 8 * CELL_COUNT))
    if err == STALE:  # a leased call with no calls left: none sent
        return _MISS
    return _answer(err, peek(table + 8 * NONE_OBJ), peek(at + 8 * FAILED), table + 8 * ERROR)


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


def _istart(holder, args, nargs, kwnames):
    """A nonblocking call's C function (see :func:`nonblocking`): ``args`` as
    ``Allreduce``'s."""
    own = peek(holder + _DATA)
    table = peek(own + 8 * I_TABLE)
    if peek(table + 8 * DEFERRED) == 0:
        at, source, recv = _match(table, args, nargs, kwnames, 0)
        if at != 0 and peek(at + 8 * DEFER) != 0:
            request = py_vectorcall(peek(own + 8 * I_CLASS), 0, 0, 0)
            if request == 0:  # (its exception set)
                return 0
            py_incref(request)  # (the started call's reference)
            err = _started(own, table, at, peek(args), source, recv, request)
            if err == 0:
                return request
            py_decref(request)
            if err == 1:
                return 0
    return py_vectorcall(peek(own + 8 * I_PYTHON), args, nargs, kwnames)


def _pstart(holder, args, nargs, kwnames):
    """A persistent start's C function (see :func:`persistent`): ``args[0]`` is the
    request."""
    own = peek(holder + _DATA)
    table = peek(own + 8 * I_TABLE)
    if nargs == 1 and kwnames == 0 and peek(table + 8 * DEFERRED) == 0:
        request, begin = peek(args), peek(own + 8 * I_BEGIN)
        objects = peek(request + peek(own + 8 * P_OBJECTS))
        handle = request + peek(begin + 8 * _B_OFFSET)
        idle = (peek(handle) if peek(begin + 8 * _B_WIDE) else peek32(handle)) == peek(
            own + 8 * P_NULL
        )
        if objects != 0 and idle:
            pos = peek(objects + _DATA)
            at, source, recv = _match(table, pos, 4, 0, 0)
            if at != 0 and peek(at + 8 * DEFER) != 0:
                py_incref(request)
                err = _started(own, table, at, peek(pos), source, recv, request)
                if err == 1:
                    return 0
                if err == 0:
                    none = peek(table + 8 * NONE_OBJ)
                    py_incref(none)
                    return none
    return py_vectorcall(peek(own + 8 * I_PYTHON), args, nargs, kwnames)


@numba.njit(cache=True)
def _started(own, table, at, send, source, recv, request):
    """Start the generalized request of ``request`` (a reference this takes over), its
    call (the entry at ``at``, from ``source`` into ``recv``'s data; a counted
    call's own, uncounted: a nonblocking call takes nothing off auto's lead) kept
    in its cells for its completion to make: 0; _MISS where no free cells were at
    hand (or MPI failed: the Python start makes them, and raises), 1 with the
    exception set."""
    cells = peek(at + 8 * CELLS_AT)
    counted = peek(table + 8 * COUNTED)  # (0 until a counted call is made: CELL_FN 0 is MPI's)
    if counted != 0 and peek(cells + 8 * CELL_FN) == counted:
        cells = peek(cells + 8 * _INNER)
    begin = peek(own + 8 * I_BEGIN)
    state = _pop_begin(peek(begin + 8 * _B_STACK), peek(begin + 8 * _B_FNS), request,
                       peek(begin + 8 * _B_OFFSET), peek(begin + 8 * _B_WIDE))  # fmt: skip
    if state <= 0:
        py_decref(request)
        return _MISS
    appended = py_vectorcall(peek(own + 8 * I_APPEND), own + 8 * I_MARK, 1, 0)
    if appended == 0:  # (no memory left: the request stays started)
        py_decref(request)
        return 1
    py_decref(appended)
    kept = peek(at + 8 * KEPT_OBJ)
    poke(state + 8 * REQ_RUN, cells)
    poke(state + 8 * REQ_SBUF, source)
    poke(state + 8 * REQ_RBUF, peek(recv + _DATA))
    poke(state + 8 * REQ_COUNT, peek(cells + 8 * CELL_COUNT))
    poke(state + 8 * REQ_RAISE, peek(at + 8 * FAILED))
    poke(state + 8 * REQ_SELF, request)
    for cell, obj in ((REQ_RECV, recv), (REQ_SEND, send), (REQ_KEPT, kept)):
        py_incref(obj)
        poke(state + 8 * cell, obj)
    poke(table + 8 * DEFERRED, state)
    return 0


def _iwait(holder, args, nargs, kwnames):
    """A completion's C function (see :func:`completion`): ``args[0]`` is the request."""
    own = peek(holder + _DATA)
    table = peek(own + 8 * W_TABLE)
    state = peek(table + 8 * DEFERRED)
    if nargs == 1 and kwnames == 0 and state != 0 and peek(state + 8 * REQ_SELF) == peek(args):
        poke(table + 8 * DEFERRED, 0)  # (taken: a completion MPI calls back finds none)
        sbuf, rbuf = peek(state + 8 * REQ_SBUF), peek(state + 8 * REQ_RBUF)
        err = run_cells(peek(state + 8 * REQ_RUN), sbuf, rbuf, peek(state + 8 * REQ_COUNT))
        if err != STALE:
            return _waited(own, table, state, err)
        poke(table + 8 * DEFERRED, state)  # none sent: the Python path carries it out
    return py_vectorcall(peek(own + 8 * W_PYTHON), args, nargs, kwnames)


@numba.njit(cache=True)
def _waited(own, table, state, err):
    """The end of a call started in C, made with MPI's ``err``: the mark out of
    ``pending``, its generalized request completed and waited on (the Request's
    handle then MPI_REQUEST_NULL), the references released; True, or NULL with
    the call's error raised."""
    cleared = py_vectorcall(peek(own + 8 * W_CLEAR), 0, 0, 0)
    if cleared != 0:
        py_decref(cleared)
    request = peek(state + 8 * REQ_SELF)
    _grequest_end(state, False)
    mpi_wait(request + peek(peek(own + 8 * W_BEGIN) + 8 * _B_OFFSET), peek(own + 8 * W_STATUS))
    answer = _answer(err, peek(own + 8 * W_TRUE), peek(state + 8 * REQ_RAISE), table + 8 * ERROR)
    for cell in (REQ_RECV, REQ_SEND, REQ_KEPT, REQ_SELF):
        py_decref(peek(state + 8 * cell))
    return answer
