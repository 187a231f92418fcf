"""Any buffer: what mpi4py's Allreduce takes, ringmpi takes, writing into the caller's memory.

Buffer-protocol objects (array.array, bytearray, bytes, memoryview, MPI.buffer),
every form of mpi4py buffer spec, and DLPack producers (array-api-strict's
arrays, PyTorch's CPU tensors when torch is importable). Where mpi4py takes the
same buffers, ``comm.Allreduce`` must give the same result. Inputs are rank + 1
times a small pattern, so every expected value is exact.
"""

from __future__ import annotations

import array
from collections.abc import Callable

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi._api import _as_array

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
TOTAL = SIZE * (SIZE + 1) // 2  # the sum over ranks of rank + 1


def pattern(n: int, dtype="float64") -> np.ndarray:
    return (np.arange(n) % 5 + 1).astype(dtype)


def mine(n: int, dtype="float64") -> np.ndarray:
    return pattern(n, dtype) * (RANK + 1)


def both(run: Callable[[Callable], list[str]]) -> list[str]:
    """Run a case through ringmpi.Allreduce and through comm.Allreduce."""
    problems = [f"ringmpi: {p}" for p in run(ringmpi.Allreduce)]
    problems += [f"mpi4py: {p}" for p in run(lambda s, r: WORLD.Allreduce(s, r, MPI.SUM))]
    return problems


def expect(what: str, got, want) -> list[str]:
    got, want = np.asarray(got), np.asarray(want)
    return [] if np.array_equal(got, want) else [f"{what}: got {got[:6]}, want {want[:6]}"]


# --- buffer-protocol objects ---------------------------------------------------------


def test_array_array():
    def run(allreduce):
        send = array.array("d", mine(7))
        recv = array.array("d", bytes(7 * 8))
        allreduce(send, recv)
        inplace = array.array("i", mine(5, "int32"))
        allreduce(MPI.IN_PLACE, inplace)
        return expect("send/recv", recv, pattern(7) * TOTAL) + expect(
            "in place", inplace, pattern(5, "int32") * TOTAL
        )

    agree(WORLD, both(run))


def test_bytearray_and_bytes():
    def run(allreduce):
        recv = bytearray(6)
        allreduce(bytes(mine(6, "uint8")), recv)  # bytes: a read-only sendbuf
        return expect("bytearray", np.frombuffer(recv, np.uint8), pattern(6, "uint8") * TOTAL)

    agree(WORLD, both(run))


def test_memoryview_and_mpi_buffer():
    def run(allreduce):
        a, b = mine(6), mine(4, "uint8")
        allreduce(MPI.IN_PLACE, memoryview(a))
        allreduce(MPI.IN_PLACE, MPI.buffer(b))  # mpi4py's own buffer object: bytes
        return expect("memoryview", a, pattern(6) * TOTAL) + expect(
            "MPI.buffer", b, pattern(4, "uint8") * TOTAL
        )

    agree(WORLD, both(run))


def test_strided_memoryview_ringmpi_only():
    # mpi4py needs contiguous memory; ringmpi reduces through a view, the gaps untouched.
    parent = np.full(12, -1.0)
    parent[::3] = mine(4)
    ringmpi.Allreduce(MPI.IN_PLACE, memoryview(parent)[::3])
    want = np.full(12, -1.0)
    want[::3] = pattern(4) * TOTAL
    agree(WORLD, expect("strided memoryview", parent, want))


# --- every form of buffer spec mpi4py reads -----------------------------------------

SPECS = {
    "[buf, MPI.DOUBLE]": (lambda b: [b, MPI.DOUBLE], slice(0, 8)),
    "[buf, 'd']": (lambda b: [b, "d"], slice(0, 8)),
    "[buf, None]": (lambda b: [b, None], slice(0, 8)),
    "[buf, 5]": (lambda b: [b, 5], slice(0, 5)),
    "[buf, 5, 'd']": (lambda b: [b, 5, "d"], slice(0, 5)),
    "(buf, 5, MPI.DOUBLE)": (lambda b: (b, 5, MPI.DOUBLE), slice(0, 5)),
    "[buf, (5, 2), MPI.DOUBLE]": (lambda b: [b, (5, 2), MPI.DOUBLE], slice(2, 7)),
    "[buf, 5, 2, MPI.DOUBLE]": (lambda b: [b, 5, 2, MPI.DOUBLE], slice(2, 7)),
    "[bytearray, 3, 1, MPI.DOUBLE]": (lambda b: [bytearray(b.tobytes()), 3, 1, MPI.DOUBLE], None),
}


@pytest.mark.parametrize("name", SPECS.keys())
def test_buffer_specs_in_place(name):
    make, where = SPECS[name]

    def run(allreduce):
        buf = mine(8)
        spec = make(buf)
        allreduce(MPI.IN_PLACE, spec)
        if where is None:  # a copy of the bytes: the result is in the bytearray
            got = np.frombuffer(spec[0], np.float64)
            want = mine(8)
            want[1:4] = pattern(8)[1:4] * TOTAL
            return expect(name, got, want)
        want = mine(8)
        want[where] = pattern(8)[where] * TOTAL
        return expect(name, buf, want)

    agree(WORLD, both(run))


def test_buffer_spec_reinterprets_bytes():
    # [array of 16 uint8, MPI.DOUBLE]: two doubles, as mpi4py reads it.
    def run(allreduce):
        raw = mine(2).view(np.uint8)
        allreduce(MPI.IN_PLACE, [raw, MPI.DOUBLE])
        return expect("bytes as doubles", raw.view(np.float64), pattern(2) * TOTAL)

    agree(WORLD, both(run))


# --- DLPack producers ----------------------------------------------------------------


def test_array_api_strict_arrays_zero_copy():
    xp = pytest.importorskip("array_api_strict")
    send = xp.asarray(mine(9))
    recv = xp.zeros(9, dtype=xp.float64)
    # The view ringmpi works on is the producer's own memory, not a copy.
    shared = np.shares_memory(_as_array(recv, "recvbuf"), np.from_dlpack(recv))
    ringmpi.Allreduce(send, recv)
    inplace = xp.asarray(mine(4, "int64"))
    ringmpi.Allreduce(MPI.IN_PLACE, inplace, op=MPI.MAX)
    problems = [] if shared else ["not zero copy"]
    problems += expect("send/recv", np.from_dlpack(recv), pattern(9) * TOTAL)
    problems += expect("in place MAX", np.from_dlpack(inplace), pattern(4, "int64") * SIZE)
    problems += expect("sendbuf untouched", np.from_dlpack(send), mine(9))
    agree(WORLD, problems)


def test_array_api_strict_strided_and_specs():
    xp = pytest.importorskip("array_api_strict")
    parent = xp.asarray(np.tile(mine(5), 2))  # [x, x]
    view = parent[::2]  # a strided DLPack export: written back through a copy
    ringmpi.Allreduce(MPI.IN_PLACE, view)
    got_parent = np.from_dlpack(parent)
    spec_buf = xp.asarray(mine(6))
    ringmpi.Allreduce(MPI.IN_PLACE, [spec_buf, 4, MPI.DOUBLE])
    want_spec = mine(6)
    want_spec[:4] = pattern(6)[:4] * TOTAL
    tiled = np.tile(mine(5), 2)
    want = tiled.copy()
    want[::2] = tiled[::2] / (RANK + 1) * TOTAL
    problems = expect("strided view", got_parent, want)
    problems += expect("spec of a DLPack array", np.from_dlpack(spec_buf), want_spec)
    agree(WORLD, problems)


def test_array_api_strict_through_allreduce_many():
    xp = pytest.importorskip("array_api_strict")
    arrays = [xp.asarray(mine(3)), xp.asarray(mine(4, "float32").reshape(2, 2))]
    ringmpi.allreduce_many(arrays, comm=WORLD)
    problems = expect("float64", np.from_dlpack(arrays[0]), pattern(3) * TOTAL)
    problems += expect(
        "float32", np.from_dlpack(arrays[1]), (pattern(4, "float32") * TOTAL).reshape(2, 2)
    )
    agree(WORLD, problems)


def test_torch_cpu_tensors():
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(mine(6))
    out = torch.zeros(6, dtype=torch.float64)
    ringmpi.Allreduce(t, out)
    grads = [torch.ones(3, dtype=torch.float32) * (RANK + 1), torch.ones(2, 2) * (RANK + 1)]
    ringmpi.allreduce_many(grads, comm=WORLD)
    problems = expect("Allreduce", out.numpy(), pattern(6) * TOTAL)
    problems += expect("allreduce_many", grads[0].numpy(), np.full(3, TOTAL, np.float32))
    problems += expect("allreduce_many 2-d", grads[1].numpy(), np.full((2, 2), TOTAL, np.float32))
    agree(WORLD, problems)


class _Device:
    """A DLPack producer in another device's memory (its data is never touched)."""

    def __init__(self, device: int):
        self.device = device

    def __dlpack__(self, **kwargs):
        raise AssertionError("ringmpi must refuse before asking for the data")

    def __dlpack_device__(self):
        return (self.device, 0)


class _CudaArrayInterface:
    @property
    def __cuda_array_interface__(self):
        return {"shape": (4,), "typestr": "<f8", "data": (0, False), "version": 3}


class _ReadOnlyExport:
    """A CPU DLPack producer that marks its export read-only (as JAX's arrays do)."""

    def __init__(self, a: np.ndarray):
        self.a = a
        self.a.flags.writeable = False

    def __dlpack__(self, **kwargs):
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


BAD = [
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, _Device(2), algorithm="ring"),
        TypeError,
        r"recvbuf: this _Device is in CUDA device memory \(DLPack device 2, 0\); ringmpi "
        "reduces CPU memory only and has no CUDA-aware path",
        id="dlpack-cuda",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(_Device(10), np.empty(4), algorithm="ring"),
        TypeError,
        "sendbuf: this _Device is in ROCm device memory",
        id="dlpack-rocm-sendbuf",
    ),
    pytest.param(
        lambda: ringmpi.allreduce_many([np.ones(2), _Device(2)]),
        TypeError,
        r"arrays\[1\]: this _Device is in CUDA device memory",
        id="dlpack-cuda-in-many",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, _CudaArrayInterface(), algorithm="ring"),
        TypeError,
        r"recvbuf: this _CudaArrayInterface is in GPU memory \(__cuda_array_interface__\)",
        id="cuda-array-interface",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, _ReadOnlyExport(np.ones(3))),
        ValueError,
        r"recvbuf is read-only \(_ReadOnlyExport\)",
        id="dlpack-read-only",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(2, np.uint8), b"ab"),
        ValueError,
        r"recvbuf is read-only \(bytes\)",
        id="bytes-recvbuf",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, [memoryview(np.ones(8))[::2], MPI.DOUBLE]),
        ValueError,
        "recvbuf: a buffer spec needs a contiguous buffer",
        id="spec-of-strided-memoryview",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, [np.ones(4), 3, 2, MPI.DOUBLE]),
        ValueError,
        "recvbuf: count 3 from displacement 2 exceeds the buffer's 4 items",
        id="spec-displacement-too-large",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, [np.ones(4)]),
        TypeError,
        "recvbuf: a buffer spec has 2 to 4 items",
        id="spec-one-item",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, [np.ones(4), 1.5]),
        TypeError,
        "datatype is an MPI.Datatype, a type character or None, not float",
        id="spec-float-datatype",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, [np.ones(4), -1, MPI.DOUBLE]),
        TypeError,
        "count must be an int >= 0, not -1",
        id="spec-negative-count",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, array.array("u", "ab"), algorithm="ring"),
        TypeError,
        "dtype <U1 is not supported",
        id="array-of-unicode",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, object()),
        TypeError,
        "recvbuf must be a NumPy array, a buffer object, a DLPack producer",
        id="not-a-buffer",
    ),
]


@pytest.mark.parametrize(("call", "exc", "match"), BAD)
def test_what_it_cannot_do_raises_before_communicating(call, exc, match):
    # Raised on every rank before any message: the next test starts cleanly.
    with pytest.raises(exc, match=match):
        call()
