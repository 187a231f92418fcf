"""Buffer arguments as mpi4py reads them, seen as NumPy arrays of the caller's memory."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI
from mpi4py.util import dtlib

from . import _dlpack
from ._errors import UnsupportedError

__all__ = ["_as_array", "_kind"]


def _as_array(buf: Any, name: str) -> np.ndarray:
    """A NumPy view of a buffer argument (zero copy): an array, an mpi4py buffer spec,
    an object with the buffer protocol or a DLPack producer in CPU memory."""
    if isinstance(buf, np.ndarray):
        return buf
    if isinstance(buf, (list, tuple)):
        return _from_spec(buf, name)
    return _view(buf, name)


def _from_spec(spec: list | tuple, name: str) -> np.ndarray:
    """The items an mpi4py buffer spec names, as mpi4py reads them: ``[data, datatype]``,
    ``[data, count]``, ``[data, count, datatype]``, ``[data, (count, displ), datatype]``
    or ``[data, count, displ, datatype]``; a datatype is an ``MPI.Datatype``, a type
    character (``"d"``) or None (the buffer's own type); displ counts items."""
    _not_a_spec(spec, name)
    if not 2 <= len(spec) <= 4:
        raise TypeError(
            f"{name}: a buffer spec has 2 to 4 items ([data, datatype], [data, count, "
            f"datatype], ...), not {len(spec)}"
        )
    data, *middle = spec
    datatype = middle.pop() if len(middle) == 2 or not _is_count(middle[-1]) else None
    if len(middle) == 2:  # [data, count, displ, datatype]
        count, displ = middle
    elif middle and isinstance(middle[0], (list, tuple)) and len(middle[0]) == 2:
        count, displ = middle[0]
    else:
        count, displ = (middle[0] if middle else None), 0
    if data is None or data is MPI.BOTTOM:  # addresses in the datatype: the library's
        raise UnsupportedError(
            f"{name}: a buffer spec on MPI.BOTTOM (or None) names its memory "
            "by the datatype's addresses"
        )
    raw = _bytes_of(data, name)
    if datatype is None:
        dt = _view(data, name).dtype if not isinstance(data, np.ndarray) else data.dtype
    elif isinstance(datatype, MPI.Datatype):
        if not datatype.is_predefined:  # vector, struct, ...: the library's
            raise UnsupportedError(f"{name}: a derived MPI datatype (ringmpi reduces "
                                   "predefined ones)")  # fmt: skip
        try:
            dt = dtlib.to_numpy_dtype(datatype)
        except (ValueError, TypeError) as exc:
            raise UnsupportedError(f"{name}: MPI datatype has no NumPy equivalent: {exc}") from None
    elif isinstance(datatype, str):
        try:
            dt = np.dtype(datatype)
        except TypeError:
            raise TypeError(f"{name}: {datatype!r} is not a type character") from None
    else:
        raise TypeError(
            f"{name}: a buffer spec's datatype is an MPI.Datatype, a type character or "
            f"None, not {type(datatype).__name__}"
        )
    if raw.nbytes % dt.itemsize:
        raise ValueError(f"{name}: {raw.nbytes} bytes is not a whole number of {dt} items")
    arr = raw.view(dt)
    for what, value in (("count", count), ("displacement", displ)):
        if value is not None and (not _is_count(value) or value < 0):
            raise TypeError(f"{name}: a buffer spec's {what} must be an int >= 0, not {value!r}")
    if count is None:
        count = arr.size - displ
    if displ + count > arr.size:
        raise ValueError(
            f"{name}: count {count}"
            + (f" from displacement {displ}" if displ else "")
            + f" exceeds the buffer's {arr.size} items"
        )
    return arr[displ : displ + count]


def _not_a_spec(spec: list | tuple, name: str) -> None:
    """TypeError for the lists a user may pass that are no buffer spec: numbers (no
    memory to write the result to) or several arrays (one call reduces one buffer)."""
    kind = type(spec).__name__
    if spec and all(isinstance(x, (int, float, complex, np.number)) for x in spec):
        raise TypeError(
            f"{name} is a {kind} of numbers, not a buffer: pass a NumPy array "
            "(np.array(...)), which is reduced in place, or use ringmpi.allreduce(values), "
            "which returns a new one"
        )
    if len(spec) > 1 and all(isinstance(x, np.ndarray) or hasattr(x, "__dlpack__") for x in spec):
        raise TypeError(
            f"{name} is a {kind} of {len(spec)} arrays: one call reduces one buffer; "
            "ringmpi.allreduce_many(arrays) reduces a list of arrays in place, in a few "
            "fused collectives"
        )


def _kind(buf: Any) -> str:
    """What an error adds for an object that is not a NumPy array: its type, e.g. (bytes)."""
    return "" if isinstance(buf, np.ndarray) else f" ({type(buf).__name__})"


def _is_count(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _bytes_of(data: Any, name: str) -> np.ndarray:
    """The bytes of a buffer spec's data, which must be contiguous (as in mpi4py)."""
    arr = data if isinstance(data, np.ndarray) else _view(data, name)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name}: a buffer spec needs a contiguous buffer")
    return arr.reshape(-1).view(np.uint8)


# DLPack's device types (dlpack.h); ringmpi reduces CPU memory only.
_DLPACK_CPU = 1
_DLPACK_DEVICES = {2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal", 9: "VPI",
                   10: "ROCm", 11: "ROCm host", 13: "CUDA managed", 14: "oneAPI", 15: "WebGPU",
                   16: "Hexagon", 17: "MAIA"}  # fmt: skip


def _view(buf: Any, name: str) -> np.ndarray:
    """A NumPy view of the memory of ``buf``, found as mpi4py finds it: the buffer
    protocol first, then DLPack (CPU memory only)."""
    kind = type(buf).__name__
    try:
        view = memoryview(buf)
    except TypeError:
        pass
    else:
        try:
            return np.asarray(view)
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise UnsupportedError(
                f"{name}: NumPy cannot view this {kind}'s buffer: {exc}"
            ) from None
    if hasattr(buf, "__dlpack__") and hasattr(buf, "__dlpack_device__"):
        device, index = buf.__dlpack_device__()
        if device != _DLPACK_CPU:
            where = _DLPACK_DEVICES.get(int(device), f"type {int(device)}")
            raise UnsupportedError(
                f"{name}: this {kind} is in {where} device memory (DLPack device {int(device)}, "
                f"{index}); ringmpi reduces CPU memory only and has no CUDA-aware path: copy "
                "it to the CPU, reduce, copy back (PyTorch: t.cpu(), then t.copy_())"
            )
        try:
            return _dlpack.view(buf)
        except (BufferError, TypeError, ValueError, RuntimeError) as exc:
            raise UnsupportedError(
                f"{name}: NumPy cannot view this {kind} through DLPack: {exc}"
            ) from None
    if hasattr(buf, "__cuda_array_interface__"):
        raise UnsupportedError(
            f"{name}: this {kind} is in GPU memory (__cuda_array_interface__); ringmpi "
            "reduces CPU memory only and has no CUDA-aware path: copy it to the CPU first"
        )
    raise TypeError(
        f"{name} must be a NumPy array, a buffer object, a DLPack producer (CPU) or an "
        f"mpi4py buffer spec, got {kind}"
    )
