"""Property tests: Hypothesis draws the calls, the same on every rank, and comm.Allreduce judges.

Every rank runs the same derandomized search (a fixed seed, no example
database, no deadline, no timed health check), and nothing rank-dependent
enters a strategy: a case holds a seed, and each rank's input is made from a
NumPy generator seeded with (seed, world rank), so every rank can also rebuild
every other rank's input. Each example first checks that every rank drew the
same case, and every outcome goes through :func:`agree`, so all ranks pass or
fail each example together and Hypothesis shrinks in step on all of them.

For each op (a test each) a case draws the dtype, the shape (0-d, 1-D of 0
to 6000 elements, 2-D to 4-D), the values (small integers, whose every
reduction order is exact; uniform; wide exponents with cancellation; whole
integer ranges), the algorithm (every name :func:`ringmpi.algorithms.names`
gives at run time), the communicator (WORLD, an even/odd split, a duplicate),
the API (``Allreduce`` or ``allreduce``), the layouts of sendbuf and recvbuf
(contiguous, strided, reversed, Fortran, transposed, a larger recvbuf), in
place or not, one call or three (the third takes the path of calls that
repeat), reproducible mode or not, the segment size, and emulated nodes for
hierarchical and auto.

The hard cases follow the property test: NaN and infinities, signed zeros,
integer wrap-around.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import agree, mpi_family, sum_saturates, wrapped_sum
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from mpi4py import MPI

import ringmpi
from ringmpi import algorithms, kernels

# matrix: the exactness matrices, run at MATRIX_RANKS under MPICH only (Makefile)
pytestmark = [pytest.mark.mpi, pytest.mark.matrix]

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
# MAX and MIN of the three families' comm.Allreduce drop a NaN depending on its rank and
# the count (measured: MPICH 5.0.2, Open MPI 5.0.11, Intel MPI 2021.18); another MPI is
# not known to.
NAN_DROPPING = mpi_family() in ("MPICH", "Open MPI", "Intel(R) MPI")
# Read at run time: an algorithm registered later (another engineer's) is drawn too.
ALGORITHMS = tuple(algorithms.names())
OWN = tuple(a for a in ALGORITHMS if a != "mpi")  # ringmpi's own, and auto choosing among them
RANK_ORDER = ("chain",)  # documented to fold every element in communicator rank order
# What reproducible=True may run on floating and complex data (any other name: ValueError).
KEEP_ORDER = ("auto", *(a.name for a in algorithms.records() if a.keeps_order))
DTYPES = {spec.name: tuple(dt.name for dt in spec.dtypes) for spec in kernels._OPS}
OP = {spec.name: spec.op for spec in kernels._OPS}
UFUNC = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
         "min": np.minimum, "band": np.bitwise_and, "bor": np.bitwise_or,
         "bxor": np.bitwise_xor}  # fmt: skip
SENTINEL = 77  # fits every dtype; never compared as a result, only where nothing may be written
EXAMPLES_PER_OP = 50


@pytest.fixture(scope="module")
def comms():
    """WORLD, one half of it (color = rank % 2), a duplicate; their members; one node or not."""
    half = WORLD.Split(RANK % 2, RANK)
    dup = WORLD.Dup()
    made = {"world": WORLD, "half": half, "dup": dup}
    members = {name: comm.allgather(RANK) for name, comm in made.items()}
    node = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = WORLD.allreduce(node.Get_size() == SIZE, op=MPI.LAND)
    node.Free()
    names_everywhere = WORLD.allgather(ALGORITHMS)
    agree(WORLD, [] if len(set(names_everywhere)) == 1 else [f"names() {names_everywhere}"])
    yield {"comm": made, "members": members, "one_node": one_node}
    half.Free()
    dup.Free()


# --- the cases ------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    api: str  # "Allreduce" or "allreduce"
    op: str
    dtype: str
    shape: tuple[int, ...]
    style: str  # how the values are drawn, see _values
    seed: int
    algorithm: str
    comm: str
    in_place: bool
    send_layout: str
    recv_layout: str
    calls: int  # 3: the third call with the same objects takes the repeat path
    reproducible: bool | None
    segment: int | None  # RINGMPI_SEGMENT_BYTES
    nodes: tuple[int, str] | None  # RINGMPI_RANKS_PER_NODE, RINGMPI_NODE_PLACEMENT

    @property
    def count(self) -> int:
        return math.prod(self.shape)


SHAPES = st.one_of(
    st.just(()),
    st.integers(0, 40).map(lambda n: (n,)),  # around N, N +- 1 and the chunk edges
    st.integers(0, 6000).map(lambda n: (n,)),
    hnp.array_shapes(min_dims=2, max_dims=4, min_side=0, max_side=8),
)
STYLES = {"b": ("bits",), "i": ("small", "full", "edges"), "u": ("small", "full", "edges"),
          "f": ("small", "uniform", "wide"), "c": ("small", "uniform", "wide")}  # fmt: skip
SEND_LAYOUTS = ("contiguous", "strided", "reversed", "fortran")
RECV_LAYOUTS = ("contiguous", "strided", "reversed", "fortran", "transposed", "larger")
NODE_LAYOUTS = (None, (1, "block"), (2, "block"), (2, "cyclic"), (3, "cyclic"))


@st.composite
def cases(draw, op: str) -> Case:
    dtype = draw(st.sampled_from(DTYPES[op]))
    shape = draw(SHAPES)
    api = draw(st.sampled_from(("Allreduce", "allreduce")))
    in_place = api == "Allreduce" and draw(st.booleans())
    algorithm = draw(st.sampled_from(ALGORITHMS))
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    # 1-byte segments only where they stay few: a message per element is slow at 5 ranks.
    segments = (None, 1, 256, 4096) if nbytes <= 4096 else (None, 256, 4096)
    return Case(
        api=api,
        op=op,
        dtype=dtype,
        shape=shape,
        style=draw(st.sampled_from(STYLES[np.dtype(dtype).kind])),
        seed=draw(st.integers(0, 2**32 - 1)),
        algorithm=algorithm,
        comm=draw(st.sampled_from(("world", "half", "dup"))),
        in_place=in_place,
        send_layout="contiguous" if in_place else draw(st.sampled_from(SEND_LAYOUTS)),
        recv_layout=draw(st.sampled_from(RECV_LAYOUTS)) if api == "Allreduce" else "contiguous",
        calls=draw(st.sampled_from((1, 3))),
        reproducible=draw(st.sampled_from((None, True))),
        segment=draw(st.sampled_from(segments)),
        nodes=draw(st.sampled_from(NODE_LAYOUTS))
        if algorithm in ("hierarchical", "auto")
        else None,
    )


def _reals(rng: np.random.Generator, style: str, op: str, count: int) -> np.ndarray:
    if style == "small":  # small integers: every order of every op is exact
        return rng.integers(-3, 3, count, endpoint=True).astype(np.float64)
    sign = rng.choice([-1.0, 1.0], count)
    if op == "prod":  # magnitudes near 1: no product over 5 ranks leaves the normal range
        spread = 6 if style == "wide" else 0
        return (
            sign * rng.uniform(0.5, 2.0, count) * np.exp2(rng.integers(-spread, spread + 1, count))
        )
    if style == "uniform":
        return rng.uniform(-1.0, 1.0, count)
    return sign * rng.uniform(1.0, 2.0, count) * np.exp2(rng.integers(-40, 41, count))


def _values(case: Case, world_rank: int) -> np.ndarray:
    """World rank ``world_rank``'s input for ``case`` (C order, the case's shape)."""
    rng = np.random.default_rng([case.seed, world_rank])
    dt, n = np.dtype(case.dtype), case.count
    if dt.kind == "b":
        x = rng.random(n) < 0.7  # mostly True: LAND is not always False
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        if case.style == "small":
            x = rng.integers(0 if dt.kind == "u" else -3, 6 if dt.kind == "u" else 3, n,
                             endpoint=True)  # fmt: skip
        elif case.style == "full":
            x = rng.integers(info.min, info.max, n, endpoint=True, dtype=dt)
        else:
            edges = np.array([info.min, info.min + 1, 0, 1, info.max - 1, info.max], dt)
            x = edges[rng.integers(0, len(edges), n)]
    else:
        x = _reals(rng, case.style, case.op, n)
        if dt.kind == "c":
            x = x + 1j * _reals(rng, case.style, case.op, n)
    return np.asarray(x).astype(dt).reshape(case.shape)


# --- layouts: where the arrays live -----------------------------------------------------
# A layout is a parent array (filled with SENTINEL) and a view of it; after the call
# every element of the parent outside the view must still hold SENTINEL.


def _layout(name: str, shape: tuple[int, ...], dtype, count: int, fill: object = SENTINEL):
    """(parent, view, result): ``result`` is where the result must land in ``view``."""
    if not shape and name != "larger":
        name = "contiguous"  # a 0-d array has one layout
    if name == "transposed" and len(shape) < 2:
        name = "reversed"
    if name == "fortran" and len(shape) < 2:
        name = "strided"
    if name == "larger":  # a 1-D recvbuf three elements longer: the first count get the result
        parent = np.full(count + 3, fill, dtype)
        return parent, parent, parent[:count].reshape(shape)
    if name == "strided":
        parent = np.full((*shape[:-1], 2 * shape[-1] + 1), fill, dtype)
        view = parent[..., 1::2]
    elif name == "reversed":
        parent = np.full(shape, fill, dtype)
        view = parent[::-1]
    elif name == "fortran":
        parent = np.full(shape, fill, dtype, order="F")
        view = parent
    elif name == "transposed":
        parent = np.full(shape[::-1], fill, dtype)
        view = parent.T
    else:
        parent = np.full(shape, fill, dtype)
        view = parent
    return parent, view, view


def _outside(name: str, parent: np.ndarray, shape: tuple[int, ...], count: int) -> np.ndarray:
    """The elements of ``parent`` (a ``name`` layout) outside the result's view."""
    mask, _, inside = _layout(name, shape, bool, count, fill=True)
    inside[...] = False
    return parent[mask]


# --- the references -------------------------------------------------------------------


def _lanes(a: np.ndarray) -> np.ndarray:
    """A complex array as its real components, flat (a real array as itself); a view."""
    return a.reshape(-1).view(a.real.dtype) if a.dtype.kind == "c" else a


def mpi_reference(
    comm: MPI.Intracomm, op: str, x: np.ndarray, algorithm: str | None = None
) -> np.ndarray:
    """comm.Allreduce of ``x`` (flat, C order); AVG: MPI's sum divided componentwise.
    Where the library's SUM saturates the dtype (Open MPI: conftest.sum_saturates), the
    sum wrapped as C and MPICH wrap it, except for ``algorithm`` "mpi": that is the
    library's own Allreduce, saturating with it."""
    send = np.ascontiguousarray(x).reshape(-1)
    if op == "sum" and algorithm != "mpi" and sum_saturates(send.dtype.name):
        return wrapped_sum(comm, send)
    out = np.empty_like(send)
    comm.Allreduce(send, out, op=MPI.SUM if op == "avg" else OP[op])
    if op == "avg":
        lanes = _lanes(out)
        lanes /= lanes.dtype.type(comm.Get_size())
    return out


def _complex_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a * b by the textbook formula, every multiply and add rounded on its own, as
    ringmpi's kernels and NumPy's scalar path compute it. NumPy's array loop fuses
    them (FMA) on CPUs that have it, so its last bit depends on the machine."""
    a, b = np.asarray(a), np.asarray(b)
    out = np.empty(np.broadcast(a, b).shape, a.dtype)
    out.real = a.real * b.real - a.imag * b.imag
    out.imag = a.real * b.imag + a.imag * b.real
    return out


def rank_order_fold(op: str, stack: list[np.ndarray]) -> np.ndarray:
    """NumPy's left fold of the ranks' inputs in rank order, ((x0 op x1) op x2) ...;
    AVG then divides each real component once. One rank's result is its input, as in
    MPI (no op is applied: a logical op leaves it as it is, not 0/1)."""
    if len(stack) == 1:
        return np.array(stack[0])
    if op in ("land", "lor", "lxor"):
        logical = {"land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor}[op]
        total = functools.reduce(logical, [s != 0 for s in stack])
        return np.array(total).astype(stack[0].dtype)
    ufunc = _complex_product if op == "prod" and stack[0].dtype.kind == "c" else UFUNC[op]
    with np.errstate(all="ignore"):  # inf - inf, integers that wrap: as the ranks compute
        total = np.array(functools.reduce(ufunc, stack))  # 0-d: an array, not a scalar
    if op == "avg":
        lanes = _lanes(total)
        lanes /= lanes.dtype.type(len(stack))
    return total


def exact(case: Case) -> bool:
    """Whether every reduction order gives the same value (so results must be equal)."""
    kind = np.dtype(case.dtype).kind
    return kind in "iub" or case.op in ("max", "min") or case.style == "small"


def tolerance(op: str, stack: list[np.ndarray], got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """How far two all-reduces of ``stack`` (N rows) that add or multiply in different
    orders may lie apart, element by element (for complex PROD: in modulus, per element;
    otherwise per real component).

    With u the unit roundoff (eps / 2) and gamma(k) = k u / (1 - k u), any order of
    the N - 1 additions of a sum S = x_0 + ... + x_(N-1) gives s' with
    |s' - S| <= gamma(N-1) sum |x_r| (Higham, Accuracy and Stability of Numerical
    Algorithms, 2nd ed., eq. 4.4), so ringmpi's and MPI's sums lie within
    2 gamma(N-1) sum |x_r| of each other. AVG divides each by N with one more
    rounding: 2 gamma(N-1) sum |x_r| / N + u / (1 - u) (|got| + |ref|). A product of N
    real factors in any order is within gamma(N-1) |P| of P (Higham, Lemma 3.1), so
    2 gamma(N-1) prod |x_r| apart; a complex multiplication has relative error at most
    sqrt(2) gamma(2) in modulus (Higham, Lemma 3.5; 2u with a fused multiply-add), so
    N - 1 of them give 2 ((1 + sqrt(2) gamma(2))^(N-1) - 1) prod |z_r|. Complex SUM and
    AVG act on each component alone, as the real bound says. The bound is computed in
    float64 and widened by 1% for its own rounding. Values are drawn so that nothing
    overflows or underflows.
    """
    n = len(stack)
    u = float(np.finfo(got.real.dtype).eps) / 2

    def gamma(k: float) -> float:
        return k * u / (1 - k * u)

    if op == "prod" and got.dtype.kind == "c":
        size = functools.reduce(np.multiply, [np.abs(s.astype(np.complex128)) for s in stack])
        return 1.01 * 2 * ((1 + math.sqrt(2) * gamma(2)) ** (n - 1) - 1) * size
    lanes = [np.abs(_lanes(s).astype(np.float64)) for s in stack]
    if op == "prod":
        return 1.01 * 2 * gamma(n - 1) * functools.reduce(np.multiply, lanes)
    bound = 2 * gamma(n - 1) * functools.reduce(np.add, lanes)
    if op == "avg":
        magnitude = np.abs(_lanes(got).astype(np.float64)) + np.abs(_lanes(ref).astype(np.float64))
        bound = bound / n + u / (1 - u) * magnitude
    return 1.01 * bound


def compare(case: Case, stack: list[np.ndarray], got: np.ndarray, ref: np.ndarray) -> list[str]:
    """Problems with ``got`` (flat, C order) against MPI's ``ref`` for this case."""
    if exact(case):
        if np.array_equal(got, ref):
            return []
        i = int(np.flatnonzero(got != ref)[0])
        return [f"element {i}: {got[i]!r}, comm.Allreduce {ref[i]!r}"]
    bound = tolerance(case.op, [s.reshape(-1) for s in stack], got, ref)
    if case.op == "prod" and got.dtype.kind == "c":
        off = np.abs(got.astype(np.complex128) - ref.astype(np.complex128))
    else:
        off = np.abs(_lanes(got).astype(np.float64) - _lanes(ref).astype(np.float64))
    bad = np.flatnonzero(~(off <= bound))
    if not bad.size:
        return []
    i = int(bad[0])
    lanes_got, lanes_ref = (got, ref) if off.size == got.size else (_lanes(got), _lanes(ref))
    return [f"{bad.size} element(s) beyond the tolerance; first at {i}: {lanes_got[i]!r}, "
            f"comm.Allreduce {lanes_ref[i]!r}, |difference| {off[i]:.3g} > {bound[i]:.3g}"]  # fmt: skip


# --- one example ------------------------------------------------------------------------


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _call(case: Case, comm: MPI.Intracomm, x: np.ndarray) -> tuple[np.ndarray, list[str], list]:
    """Run the case's ringmpi calls on this rank's input ``x``: (the last result as a
    flat C-order copy, problems, digests of every call's result)."""
    problems, digests = [], []
    if case.api == "allreduce":
        send = _placed(case.send_layout, x)
        before = send.copy()
        for _ in range(case.calls):
            out = ringmpi.allreduce(send, OP[case.op], comm, algorithm=case.algorithm,
                                    reproducible=case.reproducible)  # fmt: skip
            if out.shape != x.shape or out.dtype != x.dtype:
                problems.append(f"allreduce returned {out.dtype}{out.shape}")
            digests.append(_digest(out))
        if not np.array_equal(send, before) or send.tobytes() != before.tobytes():
            problems.append("allreduce changed its input")
        return out.reshape(-1), problems, digests
    layout = "contiguous" if case.in_place and case.recv_layout == "larger" else case.recv_layout
    parent, recv, result = _layout(layout, x.shape, case.dtype, case.count)
    send = MPI.IN_PLACE if case.in_place else _placed(case.send_layout, x)
    before = None if case.in_place else send.copy()
    for _ in range(case.calls):
        if case.in_place:
            recv[...] = x  # the same object each call, refilled
        ringmpi.Allreduce(send, recv, OP[case.op], comm, algorithm=case.algorithm,
                          reproducible=case.reproducible)  # fmt: skip
        digests.append(_digest(result))
    if before is not None and send.tobytes() != before.tobytes():
        problems.append("sendbuf was modified")
    outside = _outside(layout, parent, x.shape, case.count)
    if np.any(outside != np.asarray(SENTINEL).astype(case.dtype)):
        problems.append("memory outside the result's view was written")
    return np.ascontiguousarray(result).reshape(-1), problems, digests


def _placed(layout: str, x: np.ndarray) -> np.ndarray:
    """``x`` in a sendbuf of this layout."""
    _, view, _ = _layout(layout, x.shape, x.dtype.name, x.size)
    view[...] = x
    return view


def order_matters(case: Case) -> bool:
    """Whether the order of the reduction can change the bits (floating and complex)."""
    return np.dtype(case.dtype).kind in "fc"


def refused(case: Case) -> bool:
    """reproducible=True names an algorithm that cannot fold in rank order: ValueError
    before communicating, on every rank."""
    return bool(case.reproducible) and order_matters(case) and case.algorithm not in KEEP_ORDER


def judge(case: Case, stack: list[np.ndarray], got, ref, digests: list[str]) -> list[str]:
    """Problems with this rank's result ``got`` (flat) of ``case``."""
    problems = compare(case, stack, got, ref)
    if len(set(digests)) > 1:
        problems.append("the calls gave different results")
    if case.algorithm in RANK_ORDER or (case.reproducible and order_matters(case)):
        fold = rank_order_fold(case.op, stack).reshape(-1)
        if fold.tobytes() != got.tobytes():
            i = int(np.flatnonzero(fold.view(np.uint8) != got.view(np.uint8))[0])
            problems.append(f"not bitwise NumPy's left fold in rank order (byte {i})")
    return problems


def run_case(case: Case, comms: dict) -> None:
    """Every rank runs ``case``; all pass or all fail (AssertionError) together."""
    key = repr(case)
    if len(set(WORLD.allgather(hashlib.sha256(key.encode()).hexdigest()))) != 1:
        agree(WORLD, [f"the ranks drew different cases; this rank: {key}"])
    comm = comms["comm"][case.comm]
    members = comms["members"][case.comm]
    stack = [_values(case, r) for r in members]  # in this communicator's rank order
    x = stack[comm.Get_rank()]
    ref = mpi_reference(comm, case.op, x, case.algorithm)
    problems: list[str] = []
    got, digests = None, []
    changes = {} if case.segment is None else {"segment_bytes": case.segment}
    if case.nodes is not None:
        changes.update(ranks_per_node=case.nodes[0], node_placement=case.nodes[1])
    with ringmpi.configured(**changes):
        try:
            got, problems, digests = _call(case, comm, x)
        except Exception as exc:  # every rank still meets the others below
            if not (refused(case) and isinstance(exc, ValueError) and "rank order" in str(exc)):
                problems.append(f"raised {type(exc).__name__}: {exc}")
        else:
            if refused(case):
                problems.append("reproducible=True ran an algorithm that does not keep the order")
    if got is not None:
        try:  # an error of this test's own on one rank must not leave the others waiting
            problems += judge(case, stack, got, ref, digests)
        except Exception as exc:
            problems.append(f"judging the result raised {type(exc).__name__}: {exc}")
    everyone = comm.allgather(digests[-1] if digests else None)
    if got is not None and len(set(everyone)) != 1:
        problems.append("results differ across the ranks of the communicator")
    agree(WORLD, [f"{p}\n  case: {case}" for p in problems])


@settings(
    derandomize=True,  # the same seed, so the same examples, on every rank
    database=None,  # no examples replayed from one rank's disk
    deadline=None,  # timing differs by rank: nothing may depend on it
    max_examples=EXAMPLES_PER_OP,
    suppress_health_check=list(HealthCheck),
    print_blob=False,
)
@given(data=st.data())
@pytest.mark.parametrize("op", DTYPES)
def test_matches_comm_allreduce(comms, op, data):
    """Drawn calls of every algorithm give comm.Allreduce's result, bitwise the same on
    every rank of the communicator and from call to call, touching no other memory;
    chain, and reproducible mode on floating data, give NumPy's left fold in rank order
    bit for bit, and reproducible mode refuses the algorithms that cannot."""
    case = data.draw(cases(op), label="case")
    assume(case.algorithm != "shared_memory" or comms["one_node"])  # the same on all ranks
    run_case(case, comms)


# --- the hard cases: NaN and infinities, signed zeros, integer wrap-around ---------------
# Every rank builds every rank's input (a function of rank and N only), so NumPy's fold
# of the stack is the expected result on every rank. Each block below is chosen so that
# the result does not depend on the order of the reduction.


def _nan_and_inf(dtype: str, rank: int, n: int) -> np.ndarray:
    """Six blocks of N elements; element k of each block holds, at rank k (else a finite value):
    NaN (1.0 elsewhere); +inf, and -inf at rank k + 1 (2.0 elsewhere: inf + -inf = nan);
    +inf (2.0 elsewhere); -inf, and 0.0 at rank k + 1 (3.0 elsewhere: -inf * 0 = nan);
    NaN on every rank; 1.5 (k + 1) everywhere. Complex: the same in the real part, and
    in the imaginary part the blocks of rank N - 1 - rank."""
    k = np.arange(n)
    blocks = [
        np.where(k == rank, np.nan, 1.0),
        np.where(k == rank, np.inf, np.where((k + 1) % n == rank, -np.inf, 2.0)),
        np.where(k == rank, np.inf, 2.0),
        np.where(k == rank, -np.inf, np.where((k + 1) % n == rank, 0.0, 3.0)),
        np.full(n, np.nan),
        1.5 * (k + 1),
    ]
    x = np.concatenate(blocks)
    if np.dtype(dtype).kind == "c":
        z = np.empty(x.size, dtype)  # not x + 1j * y: 1j * inf has a NaN real part
        z.real, z.imag = x, _nan_and_inf("float64", n - 1 - rank, n)
        return z
    return x.astype(dtype)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal values, component by component, any NaN matching any NaN."""
    return np.array_equal(_lanes(got), _lanes(want), equal_nan=True)


def _where_unlike(got: np.ndarray, want: np.ndarray) -> str:
    g, w = _lanes(got), _lanes(want)
    bad = ~((g == w) | (np.isnan(g) & np.isnan(w)))
    return ", ".join(f"[{i}] {g[i]!r} vs {w[i]!r}" for i in np.flatnonzero(bad)[:6])


IEEE_OPS = [
    (op, dt) for op in ("sum", "prod", "avg", "max", "min") for dt in ("float32", "float64")
]
IEEE_OPS += [(op, "complex128") for op in ("sum", "avg")]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("op", "dtype"), IEEE_OPS, ids=[f"{o}-{d}" for o, d in IEEE_OPS])
def test_nan_and_inf_propagate(comms, op, dtype, algorithm):
    """NaN in, NaN out; inf + -inf = nan; -inf * 0 = nan; inf * -inf = -inf. SUM, PROD and
    AVG give what NumPy and comm.Allreduce give. MAX and MIN: ringmpi's own algorithms let
    NaN win, as np.maximum and np.minimum do; the "mpi" baseline gives comm.Allreduce's
    result (MPICH's and Open MPI's, which do not: see
    test_max_min_with_nan_like_comm_allreduce)."""
    assume_algorithm(comms, algorithm)
    stack = [_nan_and_inf(dtype, r, SIZE) for r in range(SIZE)]
    want = rank_order_fold(op, stack)
    mpi = mpi_reference(WORLD, op, stack[RANK])
    got = ringmpi.allreduce(stack[RANK], OP[op], WORLD, algorithm=algorithm)
    again = ringmpi.allreduce(stack[RANK], OP[op], WORLD, algorithm=algorithm)
    problems = []
    ordered = op in ("max", "min")
    if not (ordered and algorithm == "mpi") and not _same(got, want):
        problems.append(f"unlike NumPy: {_where_unlike(got, want)}")
    if not (ordered and algorithm != "mpi") and not _same(got, mpi):
        problems.append(f"unlike comm.Allreduce: {_where_unlike(got, mpi)}")
    if got.tobytes() != again.tobytes():
        problems.append("a second call gave other bits")
    if len(set(WORLD.allgather(_digest(got)))) != 1:
        problems.append("results differ across ranks")
    agree(WORLD, problems)


def assume_algorithm(comms: dict, algorithm: str) -> None:
    """shared_memory needs every rank on one node (the same answer on every rank)."""
    if algorithm == "shared_memory" and not comms["one_node"]:
        pytest.skip("shared_memory: the communicator spans nodes")


@pytest.mark.xfail(
    SIZE > 1,
    reason="MPICH's, Open MPI's and Intel MPI's MAX and MIN keep the other operand when a NaN comes "
    "first, so comm.Allreduce drops NaNs depending on their rank and the count; ringmpi's "
    "own algorithms propagate every NaN, as np.maximum/np.minimum do",
    strict=NAN_DROPPING,
)
@pytest.mark.parametrize("algorithm", OWN)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_with_nan_like_comm_allreduce(comms, op, algorithm):
    """Recorded disagreement: element k holds NaN at rank k only; comm.Allreduce (MPICH,
    Open MPI) returns 1.0 for some of those elements, ringmpi NaN for all."""
    assume_algorithm(comms, algorithm)
    x = np.where(np.arange(SIZE) == RANK, np.nan, 1.0)
    got = ringmpi.allreduce(x, OP[op], WORLD, algorithm=algorithm)
    mpi = mpi_reference(WORLD, op, x)
    agree(WORLD, [] if _same(got, mpi) else [f"unlike comm.Allreduce: {_where_unlike(got, mpi)}"])


def _signed_zeros(dtype: str, rank: int, n: int) -> np.ndarray:
    """Four elements: -0.0 on every rank; -0.0 on even ranks and +0.0 on odd ones; +0.0
    on rank 0 and -0.0 elsewhere; -0.0 on rank N - 1 and +0.0 elsewhere (complex: in
    both components)."""
    negative = [True, rank % 2 == 0, rank != 0, rank == n - 1]
    x = np.array([-0.0 if neg else 0.0 for neg in negative])
    return _both_parts(x, dtype)


def _both_parts(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` in ``dtype``; complex: ``x`` in both components (x + 1j * x would not keep
    the signs of zeros)."""
    if np.dtype(dtype).kind != "c":
        return x.astype(dtype)
    z = np.empty(x.size, dtype)
    z.real, z.imag = x, x
    return z


def _zero_signs(op: str, n: int) -> list[bool]:
    """Which of the four results of :func:`_signed_zeros` are -0.0, whatever the order:
    a sum is -0.0 only if every term is; a product is -0.0 if an odd number of factors
    are; AVG divides a sum, keeping its sign."""
    negatives = [n, (n + 1) // 2, n - 1, 1]  # how many ranks hold -0.0, per element
    if op == "prod":
        return [m % 2 == 1 for m in negatives]
    return [m == n for m in negatives]


ZERO_OPS = [(op, dt) for op in ("sum", "avg", "prod") for dt in ("float32", "float64")]
ZERO_OPS += [(op, "complex64") for op in ("sum", "avg")]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("op", "dtype"), ZERO_OPS, ids=[f"{o}-{d}" for o, d in ZERO_OPS])
def test_signed_zeros(comms, op, dtype, algorithm):
    """The sum of -0.0 on every rank is -0.0 with its sign bit (no +0.0 identity folded
    in), a mixed sum +0.0, and a product signed by the count of -0.0 factors: bit for
    bit, and as comm.Allreduce gives them."""
    assume_algorithm(comms, algorithm)
    x = _signed_zeros(dtype, RANK, SIZE)
    signs = _zero_signs(op, SIZE)
    want = np.array([-0.0 if s else 0.0 for s in signs])
    want = _both_parts(want, dtype)
    got = ringmpi.allreduce(x, OP[op], WORLD, algorithm=algorithm)
    mpi = mpi_reference(WORLD, op, x)
    problems = []
    for what, result in (("ringmpi", got), ("comm.Allreduce", mpi)):
        if result.tobytes() != want.tobytes():
            found = np.signbit(_lanes(result)).tolist()
            problems.append(f"{what}: sign bits {found}, expected those of {want.tolist()}")
    agree(WORLD, problems)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_min_of_signed_zeros(comms, op, algorithm):
    """MAX and MIN of -0.0 and +0.0 compare equal, so which one comes out depends on the
    order of the reduction (IEEE 754-2008's maxNum may return either); whichever it is,
    it is a zero, the same bits on every rank and on a second call; the "mpi" baseline
    gives comm.Allreduce's bits. On every rank -0.0 everywhere stays -0.0."""
    assume_algorithm(comms, algorithm)
    x = _signed_zeros("float64", RANK, SIZE)
    got = ringmpi.allreduce(x, OP[op], WORLD, algorithm=algorithm)
    again = ringmpi.allreduce(x, OP[op], WORLD, algorithm=algorithm)
    mpi = mpi_reference(WORLD, op, x)
    problems = []
    if not (got == 0).all():
        problems.append(f"not zeros: {got.tolist()}")
    if not np.signbit(got[0]):
        problems.append("MAX/MIN of -0.0 on every rank lost its sign")
    if got.tobytes() != again.tobytes():
        problems.append("a second call gave other bits")
    if algorithm == "mpi" and got.tobytes() != mpi.tobytes():
        problems.append(f"sign bits {np.signbit(got).tolist()}, MPI {np.signbit(mpi).tolist()}")
    # Intel MPI 2021.18 returns different zeros on different ranks at 5 ranks (its own
    # answer, which the "mpi" algorithm gives: checked above); ringmpi's never do.
    if len(set(WORLD.allgather(_digest(got)))) != 1 and not (
        algorithm == "mpi" and mpi_family() == "Intel(R) MPI"
    ):
        problems.append("results differ across ranks")
    agree(WORLD, problems)


WRAPPING = ["int8", "uint8", "int32", "int64"]
OVERFLOW_COUNT = 1009


def _overflowing(dtype: str, rank: int) -> np.ndarray:
    """Values whose sums and products wrap: near the top, near the bottom, whole-range
    random, powers of two (products wrap to 0), -1 and the minimum (min * -1 = min)."""
    dt = np.dtype(dtype)
    info, bits = np.iinfo(dt), 8 * dt.itemsize
    j = np.arange(OVERFLOW_COUNT // 5 + 1)
    top = (info.max - (j % 5) - 3 * rank).astype(dt)
    bottom = (info.min + (j % 5) + 3 * rank).astype(dt) if dt.kind == "i" else top[::-1]
    rng = np.random.default_rng([WRAPPING.index(dtype), rank])
    whole = rng.integers(info.min, info.max, j.size, endpoint=True, dtype=dt)
    powers = (np.ones(j.size, np.uint64) << ((j + 7 * rank) % bits).astype(np.uint64)).astype(dt)
    extremes = np.where((j + rank) % 2 == 0, info.min, -1 if dt.kind == "i" else info.max)
    return np.concatenate([top, bottom, whole, powers, extremes.astype(dt)])[:OVERFLOW_COUNT]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", ["sum", "prod"])
@pytest.mark.parametrize("dtype", WRAPPING)
def test_integer_overflow_wraps(comms, dtype, op, algorithm):
    """Integer SUM and PROD wrap modulo 2^bits as NumPy and MPI wrap them: bit for bit
    NumPy's fold and comm.Allreduce's result. Where the library's SUM saturates instead
    (Open MPI's, on 8-bit integers here), ringmpi's own algorithms still wrap; the "mpi"
    algorithm gives the library's result, which holds the dtype's maximum where every
    rank's value is near the top (element 0)."""
    assume_algorithm(comms, algorithm)
    stack = [_overflowing(dtype, r) for r in range(SIZE)]
    want = rank_order_fold(op, stack)
    got = ringmpi.allreduce(stack[RANK], OP[op], WORLD, algorithm=algorithm)
    mpi = mpi_reference(WORLD, op, stack[RANK], algorithm)
    problems = []
    saturates = op == "sum" and sum_saturates(dtype)
    expected = [("comm.Allreduce", mpi)]
    if not (saturates and algorithm == "mpi"):
        expected.insert(0, ("NumPy", want))
    if saturates and SIZE > 1:
        top = mpi_reference(WORLD, op, stack[RANK], "mpi")[0]
        if top != np.iinfo(dtype).max:
            problems.append(f"comm.Allreduce gave {top!r} at element 0, not the saturated max")
    for what, other in expected:
        if got.tobytes() != other.tobytes():
            i = int(np.flatnonzero(got != other)[0])
            problems.append(f"unlike {what}: element {i} is {got[i]!r}, expected {other[i]!r}")
    exact_ints = functools.reduce(UFUNC[op], [s.astype(object) for s in stack])
    if SIZE > 1 and np.array_equal(want.astype(object), exact_ints):
        problems.append("nothing wrapped: the inputs are too weak for this test")
    agree(WORLD, problems)
