"""A NumPy view of a DLPack producer's CPU memory, borrowed as mpi4py borrows it.

The view holds the producer's capsule, unconsumed, for as long as it lives; the
capsule's own destructor then releases the tensor. NumPy's ``from_dlpack``
consumes the capsule instead and keeps the tensor past it, which some
producers (mpi4py's own test arrays) do not survive.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

__all__ = ["view"]


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]  # fmt: skip


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _Versioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _Tensor)]  # fmt: skip


_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_KINDS = {0: "i", 1: "u", 2: "f", 5: "c"}  # kDLInt, kDLUInt, kDLFloat, kDLComplex
_BFLOAT, _BOOL = 4, 6

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def view(buf: Any) -> np.ndarray:
    """The memory of DLPack producer ``buf`` (CPU) as a NumPy array (zero copy);
    TypeError or ValueError for a dtype or layout NumPy cannot view."""
    try:
        capsule = buf.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer of the first protocol
        capsule = buf.__dlpack__()
    versioned = _name(capsule) == b"dltensor_versioned"
    at = _get_pointer(capsule, b"dltensor_versioned" if versioned else b"dltensor")
    managed: _Versioned | _Managed
    if versioned:
        managed = _Versioned.from_address(at)
        read_only = bool(managed.flags & _READ_ONLY)
    else:
        managed, read_only = _Managed.from_address(at), False
    t = managed.dl_tensor
    dtype = _dtype(t.dtype)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    item = dtype.itemsize
    strides = tuple(t.strides[i] * item for i in range(t.ndim)) if t.strides else None
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0 or not t.data:
        arr = np.empty(shape, dtype)
    else:
        steps = strides if strides is not None else np.empty(shape, dtype).strides
        if any(s < 0 for s in steps):
            raise ValueError("negative strides")
        extent = sum((n - 1) * s for n, s in zip(shape, steps, strict=True)) + dtype.itemsize
        memory = (ctypes.c_char * extent).from_address(t.data + t.byte_offset)
        memory._capsule = capsule  # the tensor lives as long as the view  # type: ignore[attr-defined]
        arr = np.ndarray(shape, dtype, buffer=memory, strides=strides)
    if read_only:
        arr.flags.writeable = False
    return arr


def _name(capsule: object) -> bytes:
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return get_name(capsule)


def _dtype(dt: _DataType) -> np.dtype:
    if dt.lanes != 1:
        raise TypeError(f"a vector dtype ({dt.lanes} lanes)")
    if dt.code in _KINDS:
        return np.dtype(f"{_KINDS[dt.code]}{dt.bits // 8}")
    if dt.code == _BOOL and dt.bits == 8:
        return np.dtype(bool)
    if dt.code == _BFLOAT and dt.bits == 16:
        import ml_dtypes  # noqa: PLC0415 (only for those who use it)

        return np.dtype(ml_dtypes.bfloat16)
    raise TypeError(f"DLPack dtype code {dt.code} of {dt.bits} bits")
