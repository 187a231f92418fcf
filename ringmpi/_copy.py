"""Byte copies as compiled loops: through the caches, or streaming past them.

One compiled loop serves every dtype (it copies bytes). ``streaming`` writes
with non-temporal stores and ends with a store fence: for data another core
will read, where the cores share no cache. Why compiled loops rather than
``np.copyto``, with the figures: docs/performance.md.
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import ir
from numba.extending import intrinsic

from . import _numba_cache  # noqa: F401  (its cache, safe for processes compiling at once)

__all__ = ["copy", "copy_bytes", "stream_bytes"]

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@_jit
def copy_bytes(dst, src):
    """``dst[:] = src`` (byte arrays of one size), through the caches."""
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
def stream_bytes(dst, src):
    """``dst[:] = src`` (byte arrays of one size) past the caches, then a store fence."""
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
    """``dst[:] = src`` for contiguous arrays of one dtype, as a compiled byte loop;
    ``streaming`` writes past the caches."""
    (stream_bytes if streaming else copy_bytes)(dst.view(np.uint8), src.view(np.uint8))
