"""MPI's C functions, called from Numba-compiled code: a step costs what it costs in C.

(Also the few CPython calls and memory reads of the API's C repeat path,
ringmpi._direct, at the end.)

The MPI library is the one mpi4py loaded (MPICH's ABI or Open MPI's). Its
symbols are made visible to Numba's JIT linker once, at import
(``load_library_permanently``), and each binding below is an intrinsic that
emits a plain call to the C symbol by name. Compiled code thus holds no
address, only the name, so Numba's on-disk cache keeps it across runs and the
same cached code links against either family.

The two families' handles differ in type: MPICH's ``MPI_Comm``,
``MPI_Datatype`` and ``MPI_Request`` are C ``int``; Open MPI's are pointers.
Every handle is passed in a 64-bit integer register (x86-64 and AArch64 pass
an ``int`` in the low half of one, so an ``int`` handle sign-extended to 64
bits is the same argument), and requests and statuses live in byte arrays
whose element sizes come from mpi4py (:class:`Abi`). Where the tag sits in an
``MPI_Status`` is measured once with a message to self, not assumed.

numba-mpi binds MPI the same way in spirit (ctypes there), but only for
COMM_WORLD and without float32; ringmpi takes each call's communicator handle
from mpi4py instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import binding, ir
from mpi4py import MPI
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _numba_cache  # noqa: F401  (its cache, safe for processes compiling at once)

__all__ = ["Abi", "abi", "handle"]

_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _library_path() -> str:
    """The file of the MPI library this process has loaded (through mpi4py)."""
    if sys.platform.startswith("linux"):
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                name = os.path.basename(path)
                if name.startswith("libmpi.") or name.startswith("libmpi_"):
                    return path
    found = ctypes.util.find_library("mpi")
    if found is None:
        raise ImportError("ringmpi cannot find the MPI library that mpi4py loaded")
    return found


binding.load_library_permanently(_library_path())


def _declare(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    found = builder.module.globals.get(name)
    return (
        found
        if found is not None
        else ir.Function(builder.module, ir.FunctionType(ret, args), name)
    )


def _emit(context, builder, sig, args, name: str, kinds: str):
    """Call C function ``name``: ``kinds`` says per argument ``i`` (C int) or ``p``
    (a handle or an address: 64 bits); it returns an int (an MPI error code)."""
    ntypes = [types.int64 if k == "p" else types.int32 for k in kinds]
    fn = _declare(builder, name, _I32, [_I64 if k == "p" else _I32 for k in kinds])
    cast = [
        context.cast(builder, v, t, nt) for v, t, nt in zip(args, sig.args, ntypes, strict=True)
    ]
    return builder.call(fn, cast)


# One intrinsic per C function, each a straight call: (addresses and handles are int64).


@intrinsic
def mpi_isend(typingctx, buf, count, datatype, dest, tag, comm, request):
    """MPI_Isend(buf, count, datatype, dest, tag, comm, request)."""
    sig = types.int32(buf, count, datatype, dest, tag, comm, request)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Isend", "pipiipp")


@intrinsic
def mpi_irecv(typingctx, buf, count, datatype, source, tag, comm, request):
    """MPI_Irecv(buf, count, datatype, source, tag, comm, request)."""
    sig = types.int32(buf, count, datatype, source, tag, comm, request)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Irecv", "pipiipp")


@intrinsic
def mpi_wait(typingctx, request, status):
    """MPI_Wait(request, status)."""
    sig = types.int32(request, status)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Wait", "pp")


@intrinsic
def mpi_test(typingctx, request, flag, status):
    """MPI_Test(request, flag, status)."""
    sig = types.int32(request, flag, status)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Test", "ppp")


@intrinsic
def mpi_sendrecv(typingctx, sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, source, rtag,
                 comm, status):  # fmt: skip
    """MPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, source, rtag, comm,
    status)."""
    sig = types.int32(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, source, rtag, comm,
                      status)  # fmt: skip
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Sendrecv", "pipiipipiipp")


@intrinsic
def mpi_cancel(typingctx, request):
    """MPI_Cancel(request)."""
    sig = types.int32(request)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Cancel", "p")


@intrinsic
def mpi_request_free(typingctx, request):
    """MPI_Request_free(request)."""
    sig = types.int32(request)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Request_free", "p")


@intrinsic
def mpi_get_count(typingctx, status, datatype, count):
    """MPI_Get_count(status, datatype, count)."""
    sig = types.int32(status, datatype, count)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Get_count", "ppp")


# A call prepared for the direct repeat (ringmpi._direct) as an int64 array, its
# cells: MPI_IN_PLACE's address (what ``sbuf`` is for a call in place), the
# datatype, op and communicator handles, the count, the NumPy number of the dtype it
# is for, then CELL_FN: 0 for MPI_Allreduce with those handles, else the address of
# a C function ``int64 fn(cells, sbuf, rbuf, count)`` (the cells' address) that
# runs one of ringmpi's own algorithms, returning 0 or, with its report filled, not
# 0; and CELL_RAISE: the address of a Python callable (kept by whoever made the
# cells) that raises that report's error, 0 for MPI_Allreduce. An own algorithm's
# cells go on from CELL_OWN with what its C function needs.
(CELL_IN_PLACE, CELL_DATATYPE, CELL_OP, CELL_COMM, CELL_COUNT, CELL_DTYPE, CELL_FN, CELL_RAISE,
 CELL_OWN) = range(9)  # fmt: skip


@intrinsic
def mpi_allreduce(typingctx, sbuf, rbuf, count, datatype, op, comm):
    """MPI_Allreduce(sbuf, rbuf, count, datatype, op, comm)."""
    sig = types.int32(sbuf, rbuf, count, datatype, op, comm)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Allreduce", "ppippp")


@intrinsic
def mpi_status_set_cancelled(typingctx, status, flag):
    """MPI_Status_set_cancelled(status, flag)."""
    sig = types.int32(status, flag)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Status_set_cancelled", "pi")


@intrinsic
def mpi_status_set_elements(typingctx, status, datatype, count):
    """MPI_Status_set_elements(status, datatype, count)."""
    sig = types.int32(status, datatype, count)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Status_set_elements", "ppi")


@intrinsic
def mpix_grequest_start(typingctx, query, free, cancel, poll, wait, state, request):
    """MPIX_Grequest_start(query, free, cancel, poll, wait, state, request): MPICH's
    (and Intel MPI's) only; compiled only where the library has it."""
    sig = types.int32(query, free, cancel, poll, wait, state, request)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPIX_Grequest_start", "ppppppp")


@intrinsic
def mpi_grequest_complete(typingctx, request):
    """MPI_Grequest_complete(request): the handle itself, not its address."""
    sig = types.int32(request)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Grequest_complete", "p")


@intrinsic
def mpi_win_sync(typingctx, win):
    """MPI_Win_sync(win)."""
    sig = types.int32(win)
    return sig, lambda c, b, s, a: _emit(c, b, s, a, "MPI_Win_sync", "p")


def _cell(context, builder, sig, args):
    """The address of ``array[index]`` (an int64 cell; no bounds check)."""
    ary = context.make_array(sig.args[0])(context, builder, args[0])
    index = context.cast(builder, args[1], sig.args[1], types.intp)
    return cgutils.get_item_pointer(context, builder, sig.args[0], ary, [index])


@intrinsic
def load_acquire(typingctx, array, index):
    """``array[index]`` (int64) read atomically with acquire ordering: no later load
    of this rank is served before it, and the compiler re-reads it every time (a
    flag another process sets)."""
    if array.dtype != types.int64:
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_cell(context, builder, sig, args), "acquire", 8)

    return types.int64(array, index), codegen


@intrinsic
def store_release(typingctx, array, index, value):
    """``array[index] = value`` (int64) written atomically with release ordering:
    every earlier store of this rank is visible before it."""
    if array.dtype != types.int64:
        return None

    def codegen(context, builder, sig, args):
        value = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(value, _cell(context, builder, sig, args[:2]), "release", 8)
        return context.get_dummy_value()

    return types.none(array, index, value), codegen


@intrinsic
def sched_yield(typingctx):
    """The C library's sched_yield(): give the core to another runnable process."""

    def codegen(context, builder, sig, args):
        return builder.call(_declare(builder, "sched_yield", _I32, []), [])

    return types.int32(), codegen


# CPython's and memory's side, for the API's direct repeat (ringmpi._direct): an
# object is the int64 of its address there.


@intrinsic
def peek(typingctx, address):
    """The int64 at ``address``."""

    def codegen(context, builder, sig, args):
        return builder.load(builder.inttoptr(args[0], _I64.as_pointer()))

    return types.int64(types.int64), codegen


@intrinsic
def peek32(typingctx, address):
    """The C int at ``address``, widened to int64."""

    def codegen(context, builder, sig, args):
        return builder.sext(builder.load(builder.inttoptr(args[0], _I32.as_pointer())), _I64)

    return types.int64(types.int64), codegen


@intrinsic
def poke(typingctx, address, value):
    """Write the int64 ``value`` at ``address``."""

    def codegen(context, builder, sig, args):
        builder.store(args[1], builder.inttoptr(args[0], _I64.as_pointer()))
        return context.get_dummy_value()

    return types.none(types.int64, types.int64), codegen


@intrinsic
def as_voidptr(typingctx, address):
    """The int64 ``address`` as a ``void *`` (for ``numba.carray``)."""

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return types.voidptr(types.int64), codegen


@intrinsic
def call_fn(typingctx, fn, a, b, c, d):
    """``fn(a, b, c, d)``: the C function at address ``fn``, of four int64s to one."""

    def codegen(context, builder, sig, args):
        fty = ir.FunctionType(_I64, [_I64] * 4)
        return builder.call(builder.inttoptr(args[0], fty.as_pointer()), list(args[1:]))

    return types.int64(types.int64, types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def py_vectorcall(typingctx, callable, args, nargsf, kwnames):
    """PyObject_Vectorcall(callable, args, nargsf, kwnames): a new reference, or 0
    with the exception set."""

    def codegen(context, builder, sig, args_):
        fn = _declare(builder, "PyObject_Vectorcall", _I64, [_I64] * 4)
        return builder.call(fn, list(args_))

    return types.int64(types.int64, types.int64, types.int64, types.int64), codegen


@intrinsic
def py_incref(typingctx, obj):
    """Py_IncRef(obj)."""

    def codegen(context, builder, sig, args):
        builder.call(_declare(builder, "Py_IncRef", ir.VoidType(), [_I64]), [args[0]])
        return context.get_dummy_value()

    return types.none(types.int64), codegen


@intrinsic
def py_decref(typingctx, obj):
    """Py_DecRef(obj)."""

    def codegen(context, builder, sig, args):
        builder.call(_declare(builder, "Py_DecRef", ir.VoidType(), [_I64]), [args[0]])
        return context.get_dummy_value()

    return types.none(types.int64), codegen


@intrinsic
def py_long(typingctx, value):
    """PyLong_FromLongLong(value): a new reference (an int), or 0 with the exception set."""

    def codegen(context, builder, sig, args):
        return builder.call(_declare(builder, "PyLong_FromLongLong", _I64, [_I64]), [args[0]])

    return types.int64(types.int64), codegen


_CLOCK_MONOTONIC = 1  # Linux's clockid_t for CLOCK_MONOTONIC


@intrinsic
def monotonic_ns(typingctx):
    """The C library's clock_gettime(CLOCK_MONOTONIC) in nanoseconds (for timeouts;
    a vDSO call, tens of nanoseconds)."""

    def codegen(context, builder, sig, args):
        timespec = ir.LiteralStructType([_I64, _I64])
        cell = cgutils.alloca_once(builder, timespec)
        fn = _declare(builder, "clock_gettime", _I32, [_I32, timespec.as_pointer()])
        builder.call(fn, [ir.Constant(_I32, _CLOCK_MONOTONIC), cell])
        sec = builder.load(cgutils.gep_inbounds(builder, cell, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, cell, 0, 1))
        return builder.add(builder.mul(sec, ir.Constant(_I64, 1_000_000_000)), nsec)

    return types.int64(), codegen


@dataclass(frozen=True)
class Abi:
    """What compiled code needs to know of the loaded MPI's ABI."""

    byte: int  # the MPI_BYTE handle
    request_size: int  # bytes of an MPI_Request
    status_size: int  # bytes of an MPI_Status
    tag_offset: int  # byte offset of MPI_TAG in an MPI_Status
    any_tag: int
    proc_null: int


def handle(obj: object) -> int:
    """The C handle of an mpi4py object as a signed 64-bit integer.

    mpi4py returns an ``int`` handle as an unsigned number; sign-extending it
    gives the value C would pass (and a type Numba compiles once).
    """
    h = MPI._handleof(obj)
    return h - (1 << 64) if h >= 1 << 63 else h


@numba.njit(cache=True)
def _probe_tag(byte, comm, tag, request, status):
    # One message to self; returns the MPI error code of the first failing call.
    out = np.zeros(1, np.uint8)
    got = np.zeros(1, np.uint8)
    err = mpi_irecv(got.ctypes.data, 1, byte, 0, tag, comm, request.ctypes.data)
    if err != 0:
        return err
    err = mpi_isend(out.ctypes.data, 1, byte, 0, tag, comm, request.ctypes.data + request.size // 2)
    if err != 0:
        return err
    err = mpi_wait(request.ctypes.data + request.size // 2, status.ctypes.data)
    if err != 0:
        return err
    return mpi_wait(request.ctypes.data, status.ctypes.data)


_abi: Abi | None = None


def abi() -> Abi:
    """The loaded MPI's :class:`Abi` (measured on first use)."""
    global _abi
    if _abi is None:
        request_size = MPI._sizeof(MPI.Request)
        status_size = MPI._sizeof(MPI.Status)
        tag = 0x2A5C  # within every MPI's tag range (at least 32767)
        request = np.zeros(2 * request_size, np.uint8)
        status = np.zeros(status_size, np.uint8)
        err = _probe_tag(handle(MPI.BYTE), handle(MPI.COMM_SELF), tag, request, status)
        if err != 0:
            raise RuntimeError(
                f"a message to self through MPI's C ABI failed: {MPI.Get_error_string(err)}"
            )
        ints = status[: status_size - status_size % 4].view(np.int32)
        where = np.flatnonzero(ints == tag)
        if where.size != 1:
            raise RuntimeError("cannot find MPI_TAG in this MPI library's MPI_Status")
        _abi = Abi(
            byte=handle(MPI.BYTE),
            request_size=request_size,
            status_size=status_size,
            tag_offset=int(where[0]) * 4,
            any_tag=MPI.ANY_TAG,
            proc_null=MPI.PROC_NULL,
        )
    return _abi
