"""Half precision across ranks: float16 and bfloat16 with SUM, AVG, MAX, MIN.

The contract: 16 bits on the wire, float32 inside, one rounding at the end.
Every algorithm that takes the half types (ring, shared_memory, auto) is run on
random data at sizes 0, 1, N-1, N+1, a prime and ~1e5, in place and not, twice,
and its result must be

* bitwise the contract carried out in NumPy (the N inputs widened to float32,
  folded in rank order, AVG divided by N in float32, rounded once), and
  bitwise the same on every rank;
* within the error bound of that contract from the float64 reference S:
  |result - S| <= ulp_h(|S| + E) / 2 + E, where E = (N-1) 2^-24 sum_k |x_k|
  bounds the float32 fold's error (N-1 additions, unit roundoff 2^-24) and
  ulp_h(v) / 2 is the one final rounding's (ulp_h: the half type's spacing at
  v, its subnormal spacing below the smallest normal). For AVG both terms are
  divided by N, plus the float32 division's 2^-24 |S|/N. MAX and MIN are exact.

For SUM on inputs whose float32 sum is exact (multiples of 2^-6 of at most 12
bits), the result is the float64 sum rounded once, exactly.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from conftest import agree, half_contract
from mpi4py import MPI

import ringmpi
from ringmpi import algorithms, kernels
from ringmpi.schedule import chunk_bounds

# matrix: the exactness matrices, run at MATRIX_RANKS under MPICH only (Makefile)
pytestmark = [pytest.mark.mpi, pytest.mark.matrix]

WORLD = MPI.COMM_WORLD
N, RANK = WORLD.Get_size(), WORLD.Get_rank()
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [pytest.param(np.dtype(np.float16), id="float16"), pytest.param(BF16, id="bfloat16")]
# From the registry: every algorithm with a half-type path runs the matrix, every
# other must refuse the half types before any message.
ALGORITHMS = (*algorithms.half_algorithms(), "auto")
REFUSE = tuple(a.name for a in algorithms.records() if a.half is None)
OPS = [pytest.param(kernels.op_from_name(n), n, id=n) for n in kernels.HALF_OPS]
SIZES = sorted({0, 1, max(N - 1, 0), N + 1, 1009, 100_003})
# (precision p, least normal exponent) of each half type
FORMAT = {np.dtype(np.float16): (11, -14), BF16: (8, -126)}


def _inputs(dt: np.dtype, n: int, rank: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * seed + rank)
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(dt)


def _ulp(v: np.ndarray, dt: np.dtype) -> np.ndarray:
    p, emin = FORMAT[dt]
    _, e = np.frexp(np.maximum(v, np.finfo(np.float64).tiny))
    return np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))


def _bound(parts: list[np.ndarray], name: str, dt: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(S, the bound on |result - S|) in float64."""
    wide = np.stack([x.astype(np.float64) for x in parts])
    k = len(parts)
    if name == "max":
        return wide.max(axis=0), np.zeros(wide.shape[1])
    if name == "min":
        return wide.min(axis=0), np.zeros(wide.shape[1])
    s = wide.sum(axis=0)
    fold = (k - 1) * 2.0**-24 * np.abs(wide).sum(axis=0)
    if name == "avg" and k > 1:
        s, fold = s / k, fold / k + 2.0**-24 * np.abs(s) / k
    return s, _ulp(np.abs(s) + fold, dt) / 2 + fold


def _call(x: np.ndarray, op: object, algorithm: str, in_place: bool, comm=WORLD) -> np.ndarray:
    if in_place:
        buf = x.copy()
        ringmpi.Allreduce(MPI.IN_PLACE, buf, op, comm, algorithm=algorithm)
        return buf
    send = x.copy()
    out = np.full_like(x, np.nan)
    ringmpi.Allreduce(send, out, op, comm, algorithm=algorithm)
    assert send.tobytes() == x.tobytes(), "sendbuf changed"
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("op", "name"), OPS)
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("in_place", [False, True], ids=["send-recv", "in-place"])
def test_random_data_within_one_rounding(algorithm, op, name, dt, in_place):
    problems = []
    for n in SIZES:
        x = _inputs(dt, n, RANK, n)
        parts = WORLD.allgather(x)
        want = half_contract(parts, name, dt)
        s, bound = _bound(parts, name, dt)
        for call in range(2):
            got = _call(x, op, algorithm, in_place)
            if got.view(np.uint16).tobytes() != want.view(np.uint16).tobytes():
                i = int(np.flatnonzero(got.view(np.uint16) != want.view(np.uint16))[0])
                problems.append(f"n={n} call {call}: element {i} is {got[i]}, contract {want[i]}")
            err = np.abs(got.astype(np.float64) - s)
            if n and not (err <= bound).all():
                i = int(np.argmax(err - bound))
                problems.append(f"n={n}: |{got[i]} - {s[i]}| = {err[i]} > bound {bound[i]}")
            if len(set(WORLD.allgather(got.tobytes()))) != 1:
                problems.append(f"n={n} call {call}: ranks differ")
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dt", DTYPES)
def test_exact_sums_are_the_float64_sum_rounded_once(algorithm, dt):
    # Multiples of 2^-6 with at most 8 (bfloat16) or 11 (float16) significant bits:
    # exact in the half type, and their sum of up to 5 exact in float32, so the
    # result must be the float64 sum rounded once, bit for bit.
    top = 255 if dt == BF16 else 2047
    rng = np.random.default_rng(77 + RANK)
    x = (rng.integers(-top, top + 1, 5003) * 2.0**-6).astype(dt)
    assert np.array_equal(x.astype(np.float64) * 64, np.round(x.astype(np.float64) * 64))
    total = np.sum([p.astype(np.float64) for p in WORLD.allgather(x)], axis=0)
    want = total.astype(np.float32).astype(dt)  # exact to float32, then one rounding
    got = _call(x, MPI.SUM, algorithm, False)
    rounded = int(np.count_nonzero(want.astype(np.float64) != total))
    problems = [] if np.array_equal(got.view(np.uint16), want.view(np.uint16)) else ["differs"]
    if N > 1 and rounded == 0:
        problems.append("no sum needed rounding: the test tests nothing")
    agree(WORLD, problems)


@pytest.mark.parametrize("dt", DTYPES)
def test_special_values(dt):
    # NaN, infinities, signed zeros, and a float16 sum that overflows only when rounded.
    vals = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 60000.0, -1.0], np.float32)
    x = np.roll(vals, RANK).astype(dt)
    parts = WORLD.allgather(x)
    problems = []
    for op, name in ((MPI.SUM, "sum"), (ringmpi.AVG, "avg"), (MPI.MAX, "max"), (MPI.MIN, "min")):
        want = half_contract(parts, name, dt)
        for algorithm in ALGORITHMS:
            got = _call(x, op, algorithm, False)
            # A NaN's sign and payload are not promised (inf - inf, vectorized or not).
            nan = np.isnan(want.astype(np.float32))
            same = got.view(np.uint16) == want.view(np.uint16)
            if not (np.isnan(got.astype(np.float32)) == nan).all() or not same[~nan].all():
                problems.append(f"{name} {algorithm}: {got.tolist()} != {want.tolist()}")
            if name == "max":
                with np.errstate(invalid="ignore"):
                    ref = np.maximum.reduce(np.stack(parts), axis=0)
                if not np.array_equal(np.isnan(got), np.isnan(ref)):
                    problems.append(f"max NaNs {got.tolist()} vs np.maximum {ref.tolist()}")
    agree(WORLD, problems)


@pytest.mark.parametrize("dt", DTYPES)
def test_ring_and_shared_memory_agree_bitwise_and_are_reproducible(dt):
    x = _inputs(dt, 20_011, RANK, 3)
    results = {
        (a, r): _call(x, MPI.SUM, a, False, WORLD).tobytes()
        for a in ALGORITHMS for r in (False, True)
    }  # fmt: skip
    x2 = x.copy()
    ringmpi.Allreduce(MPI.IN_PLACE, x2, MPI.SUM, WORLD, reproducible=True)
    distinct = set(results.values()) | {x2.tobytes()}
    agree(WORLD, [] if len(distinct) == 1 else [f"{len(distinct)} different results"])


@pytest.mark.parametrize("algorithm", REFUSE)
@pytest.mark.parametrize("dt", DTYPES)
def test_algorithms_that_would_round_twice_refuse_before_any_message(algorithm, dt):
    x = np.ones(10, dt)
    problems = []
    with ringmpi.trace() as t, pytest.raises(ValueError, match=r"cannot reduce .* one rounding"):
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, WORLD, algorithm=algorithm)
    if t.bytes_sent:
        problems.append(f"sent {t.bytes_sent} bytes")
    if algorithm == "mpi":  # the reason is MPI's
        with pytest.raises(ValueError, match="MPI has no bfloat16"):
            ringmpi.allreduce(x, MPI.MAX, WORLD, algorithm="mpi")
    # the communicator still works
    got = ringmpi.allreduce(x, MPI.SUM, WORLD)
    if not np.array_equal(got.astype(np.float64), np.full(10, float(N))):
        problems.append(f"then {got.tolist()}")
    agree(WORLD, problems)


@pytest.mark.parametrize("dt", DTYPES)
def test_hierarchical_refuses_across_nodes_before_any_message(dt, environ):
    # Emulated nodes of one rank: N nodes (one node at N = 1, where it runs).
    environ.set("RINGMPI_RANKS_PER_NODE", "1")
    comm = WORLD.Dup()  # a fresh context: its node layout follows the setting
    x = np.ones(10, dt)
    problems = []
    with ringmpi.trace() as t:
        try:
            ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, algorithm="hierarchical")
            said = None
        except ValueError as exc:
            said = str(exc)
    if N == 1:
        if said is not None or not (x == 1).all():
            problems.append(f"one rank: {said!r}, {x.tolist()}")
    elif said is None or f"with one rounding across {N} nodes" not in said:
        problems.append(f"raised {said!r}")
    if t.bytes_sent:
        problems.append(f"sent {t.bytes_sent} bytes")
    # auto keeps to the others there
    ctx = ringmpi._comm.context(comm)
    red = kernels.reduction(MPI.SUM, dt)
    name = ringmpi.algorithms.choose("auto", 64 << 20, ctx, red).name
    if N > 1 and name == "hierarchical":
        problems.append("auto chose hierarchical across nodes")
    comm.Free()
    agree(WORLD, problems)


@pytest.mark.parametrize("stores", ["cached", "streaming"])
@pytest.mark.parametrize(("op", "name"), OPS)
@pytest.mark.parametrize("dt", DTYPES)
def test_hierarchical_large_buffers_through_many_pieces(stores, op, name, dt, environ):
    # 1 MiB and more: the copies into the result stream; 64 KiB pieces put the
    # buffer through the window many times, the last piece short.
    environ.set("RINGMPI_WINDOW_STORES", stores)
    environ.set("RINGMPI_PIECE_BYTES", str(64 << 10))
    comm = WORLD.Dup()  # a window sized for these pieces
    problems = []
    for n in (524_289, 1_000_003):
        x = _inputs(dt, n, RANK, 7)
        want = half_contract(WORLD.allgather(x), name, dt)
        for in_place in (False, True):
            got = _call(x, op, "hierarchical", in_place, comm)
            if got.view(np.uint16).tobytes() != want.view(np.uint16).tobytes():
                problems.append(f"n={n} in_place={in_place}: differs from the contract")
    comm.Free()
    agree(WORLD, problems)


def test_auto_and_the_environment_keep_to_the_half_algorithms(environ):
    x = np.ones(1 << 16, np.float16)
    problems = []
    for nbytes in (2, 2 << 10, 2 << 20):
        ctx = ringmpi._comm.context(WORLD)
        red = kernels.reduction(MPI.SUM, np.float16)
        name = ringmpi.algorithms.choose("auto", nbytes, ctx, red).name
        if name not in ("ring", "shared_memory", "hierarchical"):
            problems.append(f"auto chose {name} for {nbytes} bytes")
    environ.set("RINGMPI_ALGORITHM", "recursive_doubling")
    with pytest.raises(ValueError, match="RINGMPI_ALGORITHM: 'recursive_doubling' cannot"):
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, WORLD)
    environ.set("RINGMPI_ALGORITHM", "ring")
    ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, WORLD)
    if not (x == N).all():
        problems.append("RINGMPI_ALGORITHM=ring gave a wrong sum")
    agree(WORLD, problems)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", sorted({0, 1, N + 1, 1009, 100_003}))
def test_trace_counts_sixteen_bits_on_the_wire(dt, n):
    # The ring's half path sends each rank's input chunks but the one it finishes
    # (direct exchange) and the finished chunks but one (all-gather): at rank r,
    # 2 (2n - len(r+1) - len(r+2)) bytes, 2(N-1) steps; nothing wider than 16 bits.
    bounds = chunk_bounds(n, N)
    length = [bounds[c + 1] - bounds[c] for c in range(N)]
    x = _inputs(dt, n, RANK, 5)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, ringmpi.AVG, WORLD, algorithm="ring")
    problems = []
    if N > 1:
        want = 2 * (2 * n - length[(RANK + 1) % N] - length[(RANK + 2) % N])
        phases = {e.phase for e in t.events}
        if t.bytes_sent != want:
            problems.append(f"ring: traced {t.bytes_sent} bytes, closed form {want}")
        if t.steps != 2 * (N - 1) and n >= N:
            problems.append(f"ring: {t.steps} steps, not {2 * (N - 1)}")
        if phases != {"direct-exchange", "all-gather"} and n >= N:
            problems.append(f"phases {phases}")
        exchange = sum(e.nbytes for e in t.events if e.phase == "direct-exchange")
        if exchange != 2 * (n - length[(RANK + 1) % N]):
            problems.append(f"direct exchange sent {exchange} bytes")
    elif t.bytes_sent:
        problems.append(f"one rank sent {t.bytes_sent} bytes")
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, WORLD, algorithm="shared_memory")
    if (t.bytes_sent, t.shared_written, t.shared_read) != (0, 2 * n, 2 * n * (N - 1)):
        problems.append(f"shared_memory: {t.bytes_sent} {t.shared_written} {t.shared_read}")
    agree(WORLD, problems)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize(("op", "name"), [OPS[0], OPS[1]])  # SUM and AVG
@pytest.mark.parametrize("in_place", [False, True], ids=["send-recv", "in-place"])
@pytest.mark.parametrize("timeout", [0.0, 60.0], ids=["wait", "poll"])
def test_many_segments(environ, dt, op, name, in_place, timeout):
    # Tiny segments: every exchanged chunk in many messages, each folded as it arrives
    # (the last step); with a timeout the engine polls instead of waiting.
    environ.set("RINGMPI_SEGMENT_BYTES", "64")
    problems = []
    for n in (4099, 31):
        x = _inputs(dt, n, RANK, 9)
        want = half_contract(WORLD.allgather(x), name, dt)
        for call in range(2):
            out = x.copy() if in_place else np.empty_like(x)
            send = MPI.IN_PLACE if in_place else x
            ringmpi.Allreduce(send, out, op, WORLD, algorithm="ring", timeout=timeout)
            if out.view(np.uint16).tobytes() != want.view(np.uint16).tobytes():
                problems.append(f"n={n} call {call}: differs from the contract")
    agree(WORLD, problems)
