"""MPI's C ABI as the step engine sees it (one process, COMM_SELF)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from mpi4py import MPI

from ringmpi import _capi

pytestmark = pytest.mark.family  # the family's handles and status layout


def test_handles_are_signed_64_bit_values_of_mpi4py_handles():
    for obj in (MPI.COMM_WORLD, MPI.COMM_SELF, MPI.BYTE, MPI.SUM):
        h = _capi.handle(obj)
        assert -(1 << 63) <= h < 1 << 63
        assert h % (1 << 64) == MPI._handleof(obj)


def test_the_tag_is_found_in_mpi_status():
    abi = _capi.abi()
    assert abi.status_size == MPI._sizeof(MPI.Status)
    assert abi.request_size == MPI._sizeof(MPI.Request)
    assert abi.tag_offset % 4 == 0 and 0 <= abi.tag_offset <= abi.status_size - 4
    # mpi4py's own Status, filled by a real receive, has the tag at that offset.
    status = MPI.Status()
    out, got = np.zeros(1, np.uint8), np.zeros(1, np.uint8)
    MPI.COMM_SELF.Sendrecv(out, 0, 1234, got, 0, 1234, status)
    raw = ctypes.string_at(MPI._addressof(status), abi.status_size)
    assert status.Get_tag() == 1234
    assert np.frombuffer(raw, np.int32, 1, abi.tag_offset)[0] == 1234
