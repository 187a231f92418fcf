"""Bad input to the library API under MPI: raised on every rank before any communication."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import ringmpi

pytestmark = pytest.mark.mpi


def _read_only(n: int) -> np.ndarray:
    a = np.zeros(n)
    a.flags.writeable = False
    return a


_x = np.arange(10.0)
BAD_INPUT = [
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(10), np.empty(9)),
        ValueError,
        "recvbuf",
        id="recvbuf-too-small",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(10), np.empty(10, np.float32)),
        TypeError,
        "dtype",
        id="recvbuf-dtype",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(4), _read_only(4)),
        ValueError,
        "read-only",
        id="recvbuf-read-only",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(MPI.IN_PLACE, _read_only(4)),
        ValueError,
        "read-only",
        id="in-place-read-only",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4), MPI.MAXLOC, algorithm="ring"),
        TypeError,
        "op MPI.MAXLOC is not one ringmpi reduces",
        id="op-MAXLOC",
    ),
    pytest.param(lambda: ringmpi.allreduce(np.ones(4), "sum"), ValueError, "op", id="op-string"),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, np.complex64), MPI.MAX),
        TypeError,
        "MPI.MAX.*complex64",
        id="MAX-complex64",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, np.float32), MPI.BAND),
        TypeError,
        "MPI.BAND.*float32",
        id="BAND-float32",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, np.int32), ringmpi.AVG),
        TypeError,
        "AVG.*int32",
        id="AVG-int32",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, np.float16), MPI.PROD),
        TypeError,
        "MPI.PROD.*float16",
        id="PROD-float16",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4, ">f2"), algorithm="ring"),
        TypeError,
        ">f2|float16",
        id="dtype-f2-swapped",
    ),
    pytest.param(lambda: ringmpi.allreduce(np.ones(4), comm=7), TypeError, "comm", id="comm-int"),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4), comm=MPI.COMM_NULL),
        TypeError,
        "intracommunicator",
        id="comm-null",
    ),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4), comm=MPI.Intracomm()),
        TypeError,
        "COMM_NULL",
        id="null-intracomm",  # what a freed communicator becomes
    ),
    pytest.param(lambda: ringmpi.Comm(7), TypeError, "comm", id="Comm-int"),
    pytest.param(
        lambda: ringmpi.allreduce(np.ones(4), algorithm="tree"),
        ValueError,
        r"(?=.*\bring\b)(?=.*\bmpi\b)",
        id="algorithm-unknown",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(_x[:6], _x[4:]), ValueError, "overlap", id="overlapping-buffers"
    ),
    pytest.param(lambda: ringmpi.Allreduce(_x, _x), ValueError, "overlap", id="same-buffer-twice"),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(4), "abc"),
        TypeError,
        "recvbuf",
        id="recvbuf-not-a-buffer",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce([_x[::2], MPI.DOUBLE], np.empty(5)),
        ValueError,
        "contiguous",
        id="spec-not-contiguous",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(4), [np.empty(4), 9, MPI.DOUBLE]),
        ValueError,
        "count",
        id="spec-count-too-large",
    ),
    pytest.param(
        lambda: ringmpi.Allreduce(np.ones(4), [bytearray(6), MPI.INT]),
        ValueError,
        "recvbuf",
        id="spec-partial-item",
    ),
]


@pytest.mark.parametrize(("call", "exc", "match"), BAD_INPUT)
def test_bad_input_raises_before_communicating(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
