"""Window-resident arrays (ringmpi.empty, ringmpi.zeros) and the symmetric all-reduce.

Closed-form inputs (rank r contributes r + 1 + i at element i), each call twice,
sizes 0, 1, N-1, N, N+1, a prime and a large one; random floats for the bits,
which must be shared_memory's (the same fold in rank order) on every rank.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import RingMPIError
from ringmpi.algorithms import symmetric

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD
N = WORLD.size
SIZES = sorted({0, 1, max(1, N - 1), N, N + 1, 97, 1 << 18})


def _inputs(count: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(count, dtype=np.int64)
    return (WORLD.rank + 1 + i).astype(dtype), (N * (N + 1) // 2 + N * i).astype(dtype)


@pytest.mark.parametrize("count", SIZES)
@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.complex128])
def test_in_place_on_window_arrays_is_exact(count, dtype):
    x = ringmpi.empty(count, dtype)
    mine, exact = _inputs(count, dtype)
    problems = []
    for call in range(2):
        x[...] = mine
        with ringmpi.trace() as t:
            ringmpi.Allreduce(MPI.IN_PLACE, x, algorithm="symmetric")
        if not np.array_equal(x, exact):
            problems.append(f"call {call}: not the exact sum")
        if t.ran != ["symmetric"]:
            problems.append(f"call {call} ran {t.ran}")
    agree(WORLD, problems)


@pytest.mark.parametrize(("op", "dtype", "expect"), [
    (MPI.MAX, np.int64, lambda i: N + i),
    (MPI.MIN, np.float32, lambda i: 1 + i),
    (ringmpi.AVG, np.float64, lambda i: (N + 1) / 2 + i),
])  # fmt: skip
def test_other_ops_and_from_one_array_to_another_of_the_allocation(op, dtype, expect):
    count = 1001
    both = ringmpi.zeros((2, count), dtype)
    send, recv = both[0], both[1]
    mine, _ = _inputs(count, dtype)
    send[...] = mine
    ringmpi.Allreduce(send, recv, op, algorithm="symmetric")
    ringmpi.Allreduce(send, recv, op, algorithm="symmetric")
    assert np.array_equal(recv, expect(np.arange(count)).astype(dtype))
    assert np.array_equal(send, mine)  # the input is left as it was


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_floats_give_shared_memorys_bits_on_every_rank(dtype):
    rng = np.random.default_rng(7 + WORLD.rank)
    data = (rng.standard_normal(100_003) * 1e3).astype(dtype)
    data[::5] *= 1e-6
    x = ringmpi.empty(data.size, dtype)
    x[...] = data
    ringmpi.Allreduce(MPI.IN_PLACE, x, algorithm="symmetric")
    other = data.copy()
    ringmpi.Allreduce(MPI.IN_PLACE, other, algorithm="shared_memory")
    assert x.tobytes() == other.tobytes()
    assert len(set(WORLD.allgather(x.tobytes()))) == 1


def test_auto_reads_window_arrays_where_it_pays(monkeypatch):
    monkeypatch.setattr(symmetric, "AUTO_FROM_BYTES", 4096)
    x, plain = ringmpi.empty(2048, np.int32), np.empty(2048, np.int32)
    small = ringmpi.empty(16, np.int32)
    mine, exact = _inputs(2048, np.int32)
    ran = []
    for array in (x, plain, small):
        array[...] = mine[: array.size]
        with ringmpi.trace() as t:
            ringmpi.Allreduce(MPI.IN_PLACE, array)
        assert np.array_equal(array, exact[: array.size])
        ran.append(t.ran[0])
    assert ran[0] == "symmetric"
    assert "symmetric" not in ran[1:]  # ordinary memory, or below AUTO_FROM_BYTES


def test_the_algorithm_setting_overrides_auto_for_window_arrays_too(monkeypatch, environ):
    """RINGMPI_ALGORITHM overrides auto, also where auto would read window-resident
    arrays where they lie."""
    monkeypatch.setattr(symmetric, "AUTO_FROM_BYTES", 4096)
    environ.set("RINGMPI_ALGORITHM", "ring")
    x = ringmpi.empty(2048, np.int32)
    mine, exact = _inputs(2048, np.int32)
    x[...] = mine
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x)
    assert np.array_equal(x, exact)
    assert t.ran == ["ring"]


def test_ranks_whose_arrays_lie_at_other_places_all_raise():
    if N == 1:
        pytest.skip("one rank: nothing to disagree with")
    x = ringmpi.zeros(20, np.float64)
    part = x[:10] if WORLD.rank == 0 else x[10:]
    with pytest.raises(RingMPIError, match=r"another place of the window than this rank's"):
        ringmpi.Allreduce(MPI.IN_PLACE, part, algorithm="symmetric")


def test_ranks_that_disagree_on_the_count_all_raise():
    if N == 1:
        pytest.skip("one rank: nothing to disagree with")
    x = ringmpi.zeros(20, np.float64)
    part = x[:10] if WORLD.rank == 0 else x[:11]
    with pytest.raises(RingMPIError, match=r"ranks disagree on count: 1[01] there, 1[01] here"):
        ringmpi.Allreduce(MPI.IN_PLACE, part, algorithm="symmetric")


def test_a_rank_that_never_comes_is_named():
    if N == 1:
        pytest.skip("one rank: nobody to wait for")
    comm = WORLD.Dup()  # broken off by the timeout: not WORLD
    x = ringmpi.zeros(100, np.float32, comm)
    ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, algorithm="symmetric")  # loaded everywhere
    if comm.rank == 0:
        with pytest.raises(RingMPIError, match=r"rank 0: symmetric phase 0: waited 0.5 s for "
                           r"rank 1 \(every rank's input to be ready\)"):  # fmt: skip
            ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, algorithm="symmetric", timeout=0.5)
    WORLD.Barrier()


def test_bad_allocations_are_named_before_any_window_is_made(monkeypatch):
    before = len(symmetric.regions)
    with pytest.raises(ValueError, match=r"negative dimensions in shape \(3, -1\)"):
        ringmpi.empty((3, -1))
    if N > 1:
        with pytest.raises(ValueError, match=r"ranks disagree on the array's bytes"):
            ringmpi.empty(10 + WORLD.rank)
    monkeypatch.setattr(symmetric, "MOST_WINDOWS", before)
    with pytest.raises(RuntimeError, match=rf"{before} windows are live in this process"):
        ringmpi.empty(10)
    assert len(symmetric.regions) == before


def test_windows_are_freed_with_their_communicator():
    comm = WORLD.Dup()
    before = len(symmetric.regions)
    x = ringmpi.zeros((4, 5), np.int16, comm)
    assert x.shape == (4, 5) and x.dtype == np.int16 and x.flags.c_contiguous
    assert len(symmetric.regions) == before + 1
    comm.Free()
    assert len(symmetric.regions) == before
