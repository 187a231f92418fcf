"""A drop-in for comm.Allreduce: what ringmpi cannot reduce itself goes to the library.

Long double, MINLOC on pair types, user-defined ops, derived datatypes and
inter-communicators: under ``auto`` (and ``"mpi"``) ringmpi hands the call, as
given, to the library's own all-reduce, and the result is the library's. A named
algorithm raises, naming what it cannot do. Inputs are small integers per rank,
so every expected value is exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI
from mpi4py.util import dtlib

import ringmpi

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
TOTAL = SIZE * (SIZE + 1) // 2  # the sum over ranks of rank + 1


def expect(what: str, got, want) -> list[str]:
    got, want = np.asarray(got), np.asarray(want)
    return [] if np.array_equal(got, want) else [f"{what}: got {got[:6]}, want {want[:6]}"]


@pytest.mark.parametrize("algorithm", ["auto", "mpi"])
def test_long_double_goes_to_the_library(algorithm):
    x = (np.arange(11) + RANK + 1).astype(np.longdouble)
    out = np.zeros_like(x)
    ringmpi.Allreduce(x, out, algorithm=algorithm)
    inplace = x.copy()
    for _ in range(3):  # a repeat of the same call stays the library's
        inplace[...] = x
        ringmpi.Allreduce(None, inplace, MPI.SUM, WORLD, algorithm=algorithm)
    want = SIZE * np.arange(11, dtype=np.longdouble) + TOTAL
    agree(WORLD, expect("send/recv", out, want) + expect("None in place", inplace, want))


def test_a_named_algorithm_says_what_it_cannot_do():
    x = np.ones(3, np.longdouble)
    with pytest.raises(TypeError, match=r"dtype float128 is not supported.*'ring' cannot run"):
        ringmpi.Allreduce(MPI.IN_PLACE, x, algorithm="ring")
    op = MPI.Op.Create(lambda a, b, t: None, commute=True)
    try:
        with pytest.raises(TypeError, match=r"a user-defined MPI.Op.*'chain' cannot run"):
            ringmpi.Allreduce(MPI.IN_PLACE, np.ones(3), op, algorithm="chain")
    finally:
        op.Free()


def _max(inbuf, inoutbuf, datatype):
    a = np.frombuffer(inbuf, np.float64)
    b = np.frombuffer(inoutbuf, np.float64)
    b[...] = np.maximum(a, b)


def _sum(inbuf, inoutbuf, datatype):
    b = np.frombuffer(inoutbuf, np.float64)
    b += np.frombuffer(inbuf, np.float64)


def test_a_user_defined_op():
    op = MPI.Op.Create(_max, commute=True)
    try:
        x = np.array([RANK + 1, -RANK, 0.5], np.float64)
        out = np.empty(3)
        ringmpi.Allreduce(x, out, op)
        comm = ringmpi.Comm(WORLD)
        via_comm = np.empty(3)
        comm.Allreduce(x, via_comm, op)
    finally:
        op.Free()
    want = [SIZE, 0, 0.5]
    agree(WORLD, expect("Allreduce", out, want) + expect("Comm.Allreduce", via_comm, want))


def test_minloc_on_a_pair_type():
    pair = dtlib.to_numpy_dtype(MPI.DOUBLE_INT)  # {value, index}, as MPI lays it out
    x = np.zeros(2, pair)
    x[pair.names[0]] = [RANK % 2, -RANK]
    x[pair.names[1]] = RANK
    out = np.zeros(2, pair)
    ringmpi.Comm(WORLD).Allreduce([x, MPI.DOUBLE_INT], [out, MPI.DOUBLE_INT], MPI.MINLOC)
    # first element: value 0 on the even ranks, lowest of them 0; second: -(SIZE-1) on the last
    want_values, want_index = [0.0, -(SIZE - 1)], [0, SIZE - 1]
    agree(
        WORLD,
        expect("values", out[pair.names[0]], want_values)
        + expect("ranks", out[pair.names[1]], want_index),
    )


def test_a_derived_datatype():
    pairs = MPI.DOUBLE.Create_contiguous(2).Commit()
    op = MPI.Op.Create(_sum, commute=True)  # MPI's own ops take predefined datatypes only
    try:
        x = np.arange(8, dtype=np.float64) + RANK + 1
        out = np.zeros(8)
        ringmpi.Allreduce([x, 4, pairs], [out, 4, pairs], op)
    finally:
        op.Free()
        pairs.Free()
    agree(WORLD, expect("contiguous(2)", out, SIZE * np.arange(8) + TOTAL))


@pytest.mark.skipif(SIZE < 2, reason="an inter-communicator needs two groups")
def test_an_inter_communicator():
    color = RANK % 2
    local = WORLD.Split(color, RANK)
    inter = local.Create_intercomm(0, WORLD, 1 - color, tag=7)
    try:
        x = np.full(4, RANK + 1, np.int64)
        out = np.zeros(4, np.int64)
        ringmpi.Allreduce(x, out, MPI.SUM, inter, timeout=60)
        # each group receives the sum of the other group's contributions
        other = [r + 1 for r in range(SIZE) if r % 2 != color]
        problems = expect("inter-communicator", out, np.full(4, sum(other)))
    finally:
        inter.Free()
        local.Free()
    agree(WORLD, problems)


def test_comm_allreduce_of_an_array_with_an_op_it_does_not_reduce():
    # mpi4py's pickle path applies the op to whole objects: so does the wrapper
    op = MPI.Op.Create(lambda a, b, t: np.concatenate([a, b]) if t is None else None)
    try:
        got = ringmpi.Comm(WORLD).allreduce(np.array([RANK]), op)
    finally:
        op.Free()
    agree(WORLD, expect("concatenated", np.sort(got), np.arange(SIZE)))
