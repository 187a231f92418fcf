"""Edge sizes of the library API under MPI: count 0, and one rank."""

from __future__ import annotations

import numpy as np
import pytest
from api_helpers import ALGORITHMS, WORLD, communicators, filled, inputs, mismatch
from conftest import agree
from mpi4py import MPI

import ringmpi

pytestmark = pytest.mark.mpi

comms = pytest.fixture(scope="module")(communicators)


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("name", ["self", "world", "half"])
def test_count_zero(comms, name, algorithm, validate):
    comm = comms[name]
    recv = filled(3)
    empty = np.empty(0)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(empty, recv, MPI.SUM, comm, algorithm=algorithm, validate=validate)
        ringmpi.Allreduce(
            MPI.IN_PLACE, empty, MPI.SUM, comm, algorithm=algorithm, validate=validate
        )
    problems = mismatch("recvbuf", recv, filled(3))
    problems += mismatch("in place", empty, np.empty(0))
    if t.bytes_sent != 0 or t.calls != 2:
        problems.append(f"{t.bytes_sent} bytes traced in {t.calls} calls")
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    ("op", "dtype"),
    [
        (MPI.SUM, "float64"),
        (ringmpi.AVG, "float64"),
        (ringmpi.AVG, "complex128"),
        (MPI.PROD, "int8"),
        (MPI.LXOR, "bool"),
    ],
)
def test_one_rank_returns_the_input(comms, op, dtype, algorithm):
    """On COMM_SELF the result is this rank's input; AVG divides by 1."""
    x = inputs(1009, dtype, op=op)
    if np.dtype(dtype).kind in "fc":
        x = x / 7  # not small integers: AVG must divide by exactly 1
    out = ringmpi.allreduce(x, op, comms["self"], algorithm=algorithm)
    problems = mismatch("result", out, x)
    if out.tobytes() != x.tobytes():
        problems.append("result is not bitwise the input")
    agree(WORLD, problems)
