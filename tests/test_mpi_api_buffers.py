"""The library API under MPI, arrays and buffers: ``allreduce`` returns a new array;
``Allreduce`` takes any layout, a larger recvbuf and buffer specs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from api_helpers import WORLD, expected, filled, inputs, mismatch
from conftest import agree
from mpi4py import MPI

import ringmpi

pytestmark = pytest.mark.mpi


# --- allreduce(array): a new array ----------------------------------------------


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((), "float64"), ((7,), "int32"), ((3, 4), "complex64"), ((2, 3, 5), "uint8")],
)
@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
def test_allreduce_returns_a_new_array(shape, dtype, algorithm):
    x = inputs(shape, dtype)
    before = x.copy()
    out = ringmpi.allreduce(x, algorithm=algorithm)
    problems = mismatch("result", out, expected(shape, dtype))
    problems += mismatch("input after the call", x, before)
    if np.shares_memory(out, x):
        problems.append("the result shares memory with the input")
    agree(WORLD, problems)


# --- buffers: layouts, larger recvbuf, buffer specs ---------------------------------
# Each case builds its buffers on this rank and says where the result must appear
# and which memory must be left alone.


@dataclass
class Case:
    sendbuf: object  # an array, a buffer spec or MPI.IN_PLACE
    recvbuf: object
    result: np.ndarray  # a view of where the result must land
    want: np.ndarray
    untouched: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)
    mpi4py_too: bool = False  # mpi4py takes these buffers as well: it must agree

    def keep(self, what: str, view: np.ndarray) -> Case:
        """Check after the call that ``view`` still holds what it holds now."""
        self.untouched.append((what, view, view.copy()))
        return self


def _strided_send() -> Case:
    parent = filled(22)
    parent[::2] = inputs(11)
    recv = np.empty(11)
    return Case(parent[::2], recv, recv, expected(11)).keep("sendbuf's parent", parent)


def _strided_recv() -> Case:
    parent = filled(22)
    return Case(inputs(11), parent[::2], parent[::2], expected(11)).keep("gaps", parent[1::2])


def _fortran_2d() -> Case:
    send = np.asfortranarray(inputs((5, 7)))
    recv = filled((5, 7), order="F")
    return Case(send, recv, recv, expected((5, 7))).keep("sendbuf", send)


def _transposed_recv() -> Case:
    parent = filled((7, 5))
    return Case(inputs((5, 7)), parent.T, parent.T, expected((5, 7)))


def _in_place_strided() -> Case:
    parent = filled((6, 10))
    parent[:, ::2] = inputs((6, 5))
    view = parent[:, ::2]
    return Case(MPI.IN_PLACE, view, view, expected((6, 5))).keep("gaps", parent[:, 1::2])


def _send_2d_recv_1d() -> Case:
    recv = np.empty(12)
    return Case(inputs((3, 4)), recv, recv, expected(12), mpi4py_too=True)


# recvbuf larger than sendbuf (10 elements): the first 10, in C order, are written
# (mpi4py itself insists on equal counts, so it is not compared here).


def _larger_contiguous() -> Case:
    recv = filled(15)
    return Case(inputs(10), recv, recv[:10], expected(10)).keep("tail", recv[10:])


def _larger_strided() -> Case:
    parent = filled(30)
    recv = parent[::2]
    case = Case(inputs(10), recv, recv[:10], expected(10))
    return case.keep("tail", recv[10:]).keep("gaps", parent[1::2])


def _larger_fortran() -> Case:
    recv = filled((3, 5), order="F")  # C order: rows 0 and 1 are the first 10
    return Case(inputs(10), recv, recv[:2], expected((2, 5))).keep("row 2", recv[2])


def _spec_float() -> Case:
    recv = np.empty(9, np.float32)
    send = [inputs(9, "float32"), MPI.FLOAT]
    return Case(send, [recv, MPI.FLOAT], recv, expected(9, "float32"), mpi4py_too=True)


def _spec_with_count() -> Case:
    recv = filled(12, "float32")
    send = [inputs(12, "float32"), 7, MPI.FLOAT]
    case = Case(send, [recv, 7, MPI.FLOAT], recv[:7], expected(7, "float32"), mpi4py_too=True)
    return case.keep("recvbuf past the count", recv[7:])


def _spec_bytearray() -> Case:
    send = bytearray(inputs(9, "int32").tobytes())
    recv = bytearray(len(send))
    result = np.frombuffer(recv, np.int32)
    case = Case([send, MPI.INT], [recv, MPI.INT], result, expected(9, "int32"), mpi4py_too=True)
    return case.keep("sendbuf", np.frombuffer(send, np.int32))


def _spec_in_place() -> Case:
    buf = inputs(9)
    return Case(MPI.IN_PLACE, [buf, MPI.DOUBLE], buf, expected(9), mpi4py_too=True)


def _spec_count_in_place() -> Case:
    buf = inputs(12)
    case = Case(MPI.IN_PLACE, [buf, 7, MPI.DOUBLE], buf[:7], expected(7), mpi4py_too=True)
    return case.keep("buffer past the count", buf[7:])


CASES = {
    "strided-sendbuf": _strided_send,
    "strided-recvbuf": _strided_recv,
    "fortran-2d": _fortran_2d,
    "transposed-recvbuf": _transposed_recv,
    "in-place-strided": _in_place_strided,
    "send-2d-recv-1d": _send_2d_recv_1d,
    "larger-recvbuf": _larger_contiguous,
    "larger-recvbuf-strided": _larger_strided,
    "larger-recvbuf-fortran": _larger_fortran,
    "spec-FLOAT": _spec_float,
    "spec-count-FLOAT": _spec_with_count,
    "spec-bytearray-INT": _spec_bytearray,
    "spec-in-place": _spec_in_place,
    "spec-count-in-place": _spec_count_in_place,
}


def _check_case(case: Case, label: str) -> list[str]:
    problems = mismatch(f"{label}: result", case.result, case.want)
    for what, view, before in case.untouched:
        problems += mismatch(f"{label}: {what}", view, before)
    return problems


@pytest.mark.parametrize("algorithm", ["ring", "mpi"])
@pytest.mark.parametrize("build", CASES.values(), ids=CASES.keys())
def test_buffers(build, algorithm):
    case = build()
    ringmpi.Allreduce(case.sendbuf, case.recvbuf, MPI.SUM, WORLD, algorithm=algorithm)
    problems = _check_case(case, "ringmpi")
    if case.mpi4py_too:  # the same expectations hold for MPI's own Allreduce
        ref = build()
        WORLD.Allreduce(ref.sendbuf, ref.recvbuf, MPI.SUM)
        problems += _check_case(ref, "comm.Allreduce")
    agree(WORLD, problems)
