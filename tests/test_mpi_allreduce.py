"""The correctness matrix: every allowed (op, dtype) x algorithm x communicator x size, exactly.

Inputs come from :func:`ringmpi.verify.verify_inputs` (small integers, also as
floats and complex numbers), so every reduction order gives the same exact result
and :func:`ringmpi.verify.verify_expected` is the answer to compare with. Each
result is also compared with mpi4py's ``comm.Allreduce`` and, by hash, across the
ranks of its communicator.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest
from conftest import agree, sum_saturates, wrapped_sum
from mpi4py import MPI

import ringmpi
from ringmpi import algorithms, kernels, verify
from ringmpi.algorithms import shared

# matrix: the exactness matrices, run at MATRIX_RANKS under MPICH only (Makefile)
pytestmark = [pytest.mark.mpi, pytest.mark.matrix]

# From the registry, so that a new algorithm enters the matrix; but for those with a
# matrix of their own that this one would repeat: hierarchical (test_mpi_hierarchical.py,
# every op and dtype over emulated node layouts), chain (test_mpi_reproducible.py, every
# op and dtype against the left fold) and rabenseifner_hybrid (rabenseifner's plan halved
# to a depth: every depth simulated in test_plans.py, carried out by the engine that
# carries out this matrix's plans).
OWN_MATRIX = ("hierarchical", "chain", "rabenseifner_hybrid")
ALGORITHMS = tuple(a for a in algorithms.names() if a not in OWN_MATRIX)
# ringmpi's own, run by the engine
STEPPED = tuple(a.name for a in algorithms.records() if a.plan is not None and a.name in ALGORITHMS)
PAIRS = [
    pytest.param(spec.op, dt, id=f"{spec.name}-{dt.name}")
    for spec in kernels._OPS
    for dt in spec.dtypes
]
PRIME = 1009
BIG = 2**20 + 3


@pytest.fixture(scope="module")
def comms():
    """COMM_WORLD, one half of it (color = rank % 2) and a duplicate of it."""
    world = MPI.COMM_WORLD
    half = world.Split(world.Get_rank() % 2, world.Get_rank())
    dup = world.Dup()
    yield {"world": world, "half": half, "dup": dup}
    half.Free()
    dup.Free()


def _sizes(nranks: int, op: object, dtype: np.dtype, algorithm: str, comm_name: str) -> list[int]:
    """0, 1, N-1, N, N+1, a prime and, for some calls, a large size (2**20 + 3).

    The large size runs only on COMM_WORLD, to keep the oversubscribed 5-rank run
    within CI's budget: through the ring with SUM and AVG on every dtype they take
    and LOR on bool, through the latency algorithms with SUM on float64 (many
    segments per message, and recursive doubling's reduce of the very elements it
    sends), through shared_memory likewise (many pieces, both slot sets). shared_memory
    also takes, for every (op, dtype), one piece of its sliced way (SCATTER_BYTES and a
    prime more). The MPI baseline is MPI's own code, "auto" runs one of the others, the
    other communicators share the code with WORLD, and the other ops differ only in
    their kernel, which the smaller sizes exercise (test_many_segments forces many
    segments for every (op, dtype) and algorithm).
    """
    sizes = sorted({0, 1, nranks - 1, nranks, nranks + 1, PRIME})
    big_op = op is ringmpi.AVG or op == MPI.SUM or (op == MPI.LOR and dtype == np.bool_)
    if algorithm == "ring" and comm_name == "world" and big_op:
        sizes.append(BIG)
    latency = algorithm in ("recursive_doubling", "rabenseifner", "shared_memory")
    if latency and comm_name == "world" and op == MPI.SUM and dtype == np.float64:
        sizes.append(BIG)
    if algorithm == "shared_memory":  # one piece of the sliced way, in uneven slices
        sizes.append(shared.SCATTER_BYTES // np.dtype(dtype).itemsize + PRIME)
    return sizes


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def _bytes_of_each(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8).reshape(a.size, a.itemsize)


def _first_difference(got: np.ndarray, want: np.ndarray) -> str:
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    got, want = got.reshape(-1), want.reshape(-1)
    same = got == want
    if got.dtype.kind in "fc":
        same |= np.isnan(got) & np.isnan(want)
    if same.all():  # equal values, other bits: a signed zero or a NaN payload
        same = _bytes_of_each(got) == _bytes_of_each(want)
        same = same.all(axis=1)
    i = int(np.flatnonzero(~same)[0])
    return f"element {i} is {got[i]!r}, expected {want[i]!r}"


def mpi_allreduce(comm: MPI.Intracomm, op: object, send: np.ndarray) -> np.ndarray:
    """mpi4py's comm.Allreduce of ``send``; AVG is the MPI sum divided componentwise."""
    out = np.empty_like(send)
    comm.Allreduce(send, out, op=MPI.SUM if op is ringmpi.AVG else op)
    if op is ringmpi.AVG:
        n = out.real.dtype.type(comm.Get_size())
        total = out.copy()
        out.real = total.real / n
        if out.dtype.kind == "c":
            out.imag = total.imag / n
    return out


def ringmpi_allreduce(
    comm: MPI.Intracomm, op: object, send: np.ndarray, algorithm: str, in_place: bool
) -> tuple[np.ndarray, bool]:
    """One call on a fresh copy of ``send``: the result, and whether sendbuf is untouched."""
    if in_place:
        buf = send.copy()
        ringmpi.Allreduce(MPI.IN_PLACE, buf, op, comm, algorithm=algorithm)
        return buf, True
    sendbuf = send.copy()
    recv = np.empty_like(send)
    ringmpi.Allreduce(sendbuf, recv, op, comm, algorithm=algorithm)
    return recv, sendbuf.tobytes() == send.tobytes()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("op", "dtype"), PAIRS)
def test_exact_result(comms, op, dtype, algorithm):
    problems: list[str] = []
    for name, comm in comms.items():
        rank, n = comm.Get_rank(), comm.Get_size()
        digests = []
        for count in _sizes(n, op, dtype, algorithm, name):
            send = verify.verify_inputs(op, dtype, rank, count)
            expected = verify.verify_expected(op, dtype, n, count)
            reference = mpi_allreduce(comm, op, send)
            for in_place in (False, True):
                where = f"{name} (N={n}) count {count} {'in-place' if in_place else 'out-of-place'}"
                first, intact = ringmpi_allreduce(comm, op, send, algorithm, in_place)
                second, _ = ringmpi_allreduce(comm, op, send, algorithm, in_place)
                if not np.array_equal(first, expected):
                    problems.append(f"{where}: {_first_difference(first, expected)}")
                elif not np.array_equal(first, reference):
                    diff = _first_difference(first, reference)
                    problems.append(f"{where}: unlike comm.Allreduce, {diff}")
                if first.tobytes() != second.tobytes():
                    problems.append(f"{where}: a second call gave a different result")
                if not intact:
                    problems.append(f"{where}: sendbuf was modified")
                digests.append(_digest(first))
        if len({tuple(d) for d in comm.allgather(digests)}) != 1:
            problems.append(f"{name}: results differ across the ranks of the communicator")
    agree(MPI.COMM_WORLD, problems)


# Random data: the reduction order matters, so the ring must fix one.
RANDOM_COUNT = 65_537


def _random_input(dtype: str, seed: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, count)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.uniform(-1.0, 1.0, count)
    return x.astype(dtype)


@pytest.mark.parametrize("op", [MPI.SUM, ringmpi.AVG], ids=["sum", "avg"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex128"])
def test_random_data_is_deterministic(comms, op, dtype):
    """Bitwise identical on every rank and from call to call; close to MPI's own result."""
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 1e-12, "atol": 1e-13}
    problems: list[str] = []
    for name, comm in comms.items():
        send = _random_input(dtype, 1000 * MPI.COMM_WORLD.Get_rank() + 7, RANDOM_COUNT)
        reference = mpi_allreduce(comm, op, send)
        first, intact = ringmpi_allreduce(comm, op, send, "ring", in_place=False)
        second, _ = ringmpi_allreduce(comm, op, send, "ring", in_place=True)
        if first.tobytes() != second.tobytes():
            problems.append(f"{name}: a second call gave a different result")
        if not intact:
            problems.append(f"{name}: sendbuf was modified")
        if not np.allclose(first, reference, **tol):
            worst = float(np.max(np.abs(first - reference)))
            problems.append(f"{name}: differs from comm.Allreduce by up to {worst:.3g}")
        if len(set(comm.allgather(_digest(first)))) != 1:
            problems.append(f"{name}: results differ across the ranks of the communicator")
    agree(MPI.COMM_WORLD, problems)


# Values the small-integer inputs never reach: wrap-around, NaN and infinities,
# signed zeros, complex numbers with imaginary parts in products. Every rank
# builds every rank's input, so NumPy gives the expected result on the stack.
INTEGERS = [dt.name for dt in kernels.DTYPES if dt.kind in "iu"]
SPECIAL_COUNT = 1009


def _near_the_top(dtype: str, rank: int) -> np.ndarray:
    """Values within a few units of the dtype's maximum: sums and products wrap."""
    top = np.full(SPECIAL_COUNT, np.iinfo(dtype).max, dtype)
    return top - (np.arange(SPECIAL_COUNT) % 5 + 3 * rank).astype(dtype)


def _with_nan_and_inf(dtype: str, rank: int) -> np.ndarray:
    """Small integers, with NaN at position rank, +inf at N + rank and -inf at 2N + rank."""
    n = MPI.COMM_WORLD.Get_size()
    x = (np.arange(SPECIAL_COUNT) % 7 - 3).astype(dtype)
    x[rank], x[n + rank], x[2 * n + rank] = np.nan, np.inf, -np.inf
    return x


def _complex_inf_and_signed_zero(dtype: str, rank: int) -> np.ndarray:
    """Small complex numbers; one infinite component at N + rank, -0.0 everywhere at 2N."""
    n = MPI.COMM_WORLD.Get_size()
    j = np.arange(SPECIAL_COUNT)
    x = ((j + rank) % 5 - 2 + 1j * ((j + 2 * rank) % 3 - 1)).astype(dtype)
    x[n + rank] = complex(np.inf, 1) if rank % 2 else complex(2, -np.inf)
    x[2 * n] = complex(-0.0, -0.0)
    return x


def _gaussian_integers(dtype: str, rank: int) -> np.ndarray:
    """1, i, -1, -i, 1+i, 1-i: products over 5 ranks stay exact."""
    units = np.array([1, 1j, -1, -1j, 1 + 1j, 1 - 1j], dtype)
    return units[(np.arange(SPECIAL_COUNT) + 2 * rank) % len(units)]


def numpy_allreduce(op: object, dtype: str, stack: np.ndarray) -> np.ndarray:
    """NumPy's reduction of the ranks' rows, one row after another (ufunc.reduce would
    start from the identity, and 0.0 + -0.0 is 0.0); AVG divides each real component."""
    name = kernels.reduction(op, dtype).name
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum}
    total = functools.reduce(ufunc.get(name, np.minimum), stack)
    if name == "avg":
        lanes = total.view(total.real.dtype)
        total = (lanes / lanes.dtype.type(len(stack))).view(dtype)
    return total


def _special(make, ops, dtypes) -> list:
    label = make.__name__.strip("_").replace("_", "-")
    return [
        pytest.param(op, dt, make, id=f"{label}-{kernels.reduction(op, dt).name}-{dt}")
        for op in ops
        for dt in dtypes
    ]


SPECIAL = [
    *_special(_near_the_top, [MPI.SUM, MPI.PROD], INTEGERS),
    *_special(_with_nan_and_inf, [MPI.MAX, MPI.MIN, MPI.SUM, ringmpi.AVG], ["float32", "float64"]),
    *_special(_complex_inf_and_signed_zero, [MPI.SUM, ringmpi.AVG], ["complex64", "complex128"]),
    *_special(_gaussian_integers, [MPI.PROD, MPI.SUM], ["complex64", "complex128"]),
]


@pytest.mark.parametrize("algorithm", [*STEPPED, "auto"])
@pytest.mark.parametrize(("op", "dtype", "make"), SPECIAL)
def test_special_values(op, dtype, make, algorithm):
    """NumPy's reduction of the stacked inputs, bitwise where the order cannot matter.
    Near the top, SUM wraps as comm.Allreduce wraps it; where the library saturates
    instead (Open MPI, 8- and 16-bit: conftest.sum_saturates), ringmpi still wraps, as
    the library's sum in int64 wrapped back does, and the library gives the maximum."""
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    want = numpy_allreduce(op, dtype, np.stack([make(dtype, r) for r in range(n)]))
    send = make(dtype, rank)
    got, intact = ringmpi_allreduce(comm, op, send, algorithm, in_place=False)
    problems = [] if intact else ["sendbuf was modified"]
    if make is _with_nan_and_inf:  # any NaN will do: MPI does not fix one
        same = np.array_equal(got, want, equal_nan=True)
    elif op == MPI.PROD and np.dtype(dtype).kind == "c":  # the order signs the zeros
        same = np.array_equal(got, want)
    else:
        same = got.tobytes() == want.tobytes()
    if not same:
        problems.append(f"unlike NumPy: {_first_difference(got, want)}")
    if make in (_near_the_top, _gaussian_integers):
        reference = mpi_allreduce(comm, op, send)
        if op == MPI.SUM and sum_saturates(dtype):
            if n > 1 and reference[0] != np.iinfo(dtype).max:
                problems.append(f"comm.Allreduce gave {reference[0]!r}, not the saturated max")
            reference = wrapped_sum(comm, send)
        if not np.array_equal(got, reference):
            problems.append(f"unlike comm.Allreduce: {_first_difference(got, reference)}")
    if len(set(comm.allgather(_digest(got)))) != 1:
        problems.append("results differ across ranks")
    agree(comm, problems)


# The engine sends every message in segments of RINGMPI_SEGMENT_BYTES (1 MiB by
# default, so the sizes above mostly send one segment per step). Tiny segments
# force the many-segment path: a reduce's two scratch segments in turn, uneven
# segments, and at 1 byte one element per segment.
def _segmented(n: int) -> list[tuple[int, int]]:
    """(segment bytes, count) pairs for N ranks."""
    return [(1, n + 1), (1, 2 * n + 1), (40, n + 1), (40, 1009), (1000, 4099)]


@pytest.mark.parametrize("algorithm", STEPPED)
@pytest.mark.parametrize(("op", "dtype"), PAIRS)
def test_many_segments(environ, op, dtype, algorithm):
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    problems: list[str] = []
    for segment_bytes, count in _segmented(n):
        environ.set("RINGMPI_SEGMENT_BYTES", str(segment_bytes))
        send = verify.verify_inputs(op, dtype, rank, count)
        expected = verify.verify_expected(op, dtype, n, count)
        for in_place in (False, True):
            got, _ = ringmpi_allreduce(comm, op, send, algorithm, in_place)
            if not np.array_equal(got, expected):
                where = f"{segment_bytes}-byte segments, count {count}, in-place {in_place}"
                problems.append(f"{where}: {_first_difference(got, expected)}")
    agree(comm, problems)
