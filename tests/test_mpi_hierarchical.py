"""The hierarchical algorithm under emulated nodes: exact results, bitwise agreement, counted traffic.

Nodes are emulated with RINGMPI_RANKS_PER_NODE=k and RINGMPI_NODE_PLACEMENT
(block or cyclic); their ranks really share memory, so the shared-memory phase
is the real one. The expected layout and traffic are computed here from the
definitions, independently of the library's code.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import kernels, tuning, verify
from ringmpi.algorithms import hierarchical, latency
from ringmpi.schedule import chunk_bounds

# matrix: the exactness matrices, run at MATRIX_RANKS under MPICH only (Makefile)
pytestmark = [pytest.mark.mpi, pytest.mark.matrix]

WORLD = MPI.COMM_WORLD
LAYOUTS = [(k, p) for k in (1, 2, 3, 4) for p in ("block", "cyclic")]
OPS = [(MPI.SUM, "float32"), (ringmpi.AVG, "float64"), (MPI.MAX, "int8"), (MPI.LXOR, "bool"),
       (MPI.PROD, "complex64"), (ringmpi.AVG, "complex128")]  # fmt: skip
PAIRS = [pytest.param(s.op, dt, id=f"{s.name}-{dt.name}") for s in kernels._OPS for dt in s.dtypes]
ACROSS = ["ring", "recursive_doubling", "rabenseifner", "rabenseifner_hybrid"]  # across nodes
assert tuple(ACROSS) == hierarchical.across_choices()  # the records with across=True


@pytest.fixture
def nodes(environ, request):
    k, placement = request.param
    environ.set("RINGMPI_RANKS_PER_NODE", str(k))
    environ.set("RINGMPI_NODE_PLACEMENT", placement)
    return k, placement


def expected_nodes(nranks: int, k: int, placement: str) -> list[list[int]]:
    """The emulated nodes as lists of ranks, ordered by their lowest rank."""
    count = -(-nranks // k)
    node_of = [r // k if placement == "block" else r % count for r in range(nranks)]
    nodes: dict[int, list[int]] = {}
    for r in range(nranks):
        nodes.setdefault(node_of[r], []).append(r)
    return sorted(nodes.values())


def expected_inter_node_bytes(
    rank: int, nranks: int, k: int, placement: str, count: int, itemsize: int,
    across: str = "ring",
):  # fmt: skip
    """(bytes sent, steps that sent) of ``rank``'s rails, from the definitions."""
    nodes = expected_nodes(nranks, k, placement)
    slices = max(len(n) for n in nodes)
    bounds = chunk_bounds(count, slices)
    sent = steps = 0
    for j in range(slices):
        rail = [n[j % len(n)] for n in nodes]
        if rank not in rail or len(rail) == 1:
            continue
        length = bounds[j + 1] - bounds[j]
        q = 1 << (len(rail).bit_length() - 1)  # the hybrid's depth as a rank prices it
        depth = latency.hybrid_depth(length * itemsize, q, tuning.load(slices))
        got = rail_traffic(across, len(rail), rail.index(rank), length, depth)
        sent, steps = sent + itemsize * got[0], steps + got[1]
    return sent, steps


def rail_traffic(across: str, m: int, p: int, length: int, depth: int | None = None):
    """(elements sent, steps that sent) of member p of a rail of m on ``length`` elements.

    ring: 2(m-1) steps, every chunk but two. Otherwise the first 2(m - q) members
    fold in pairs (q the power of two below m): the even one sends its slice in
    one step; the odd one sends its partner the result in one more step. Halving
    k of lg q levels (recursive doubling: k = 0; Rabenseifner: k = lg q;
    rabenseifner_hybrid: k = ``depth``) takes lg q + k steps: the halving sends
    every block outside the aligned group of 2^(lg q - k) blocks it keeps, the
    swaps send that group lg q - k times, and the doubling sends the aligned
    group of 2^s blocks it holds at s = lg q - k .. lg q - 1."""
    if across == "ring":
        b = chunk_bounds(length, m)
        size = [b[c + 1] - b[c] for c in range(m)]
        return 2 * length - size[(p + 1) % m] - size[(p + 2) % m], 2 * (m - 1)
    q = 1 << (m.bit_length() - 1)
    rem, lg = m - q, q.bit_length() - 1
    if p < 2 * rem and p % 2 == 0:
        return length, 1
    odd = 1 if p < 2 * rem else 0
    me = p // 2 if odd else p - rem
    k = {"recursive_doubling": 0, "rabenseifner": lg}.get(across, depth)
    assert k is not None, f"{across} needs its depth"
    b = chunk_bounds(length, q)

    def group(s: int) -> int:
        first = me >> s << s
        return b[first + (1 << s)] - b[first]

    kept = group(lg - k)
    sent = length - kept + (lg - k) * kept + sum(group(s) for s in range(lg - k, lg))
    return sent + odd * length, lg + k + odd


def expected_shared_bytes(
    rank: int, nranks: int, k: int, placement: str, count: int, itemsize: int
):
    """(bytes stored to, bytes loaded from) the node's window, from the definitions."""
    node = next(n for n in expected_nodes(nranks, k, placement) if rank in n)
    size = len(node)
    slices = max(len(n) for n in expected_nodes(nranks, k, placement))
    bounds = chunk_bounds(count, slices)
    loaded = 0
    for j in range(slices):
        span = (bounds[j + 1] - bounds[j]) * itemsize
        loaded += span * (size - 1) if j % size == node.index(rank) else span
    return count * itemsize, loaded


def _call(op, send, in_place):
    if in_place:
        buf = send.copy()
        ringmpi.Allreduce(MPI.IN_PLACE, buf, op, WORLD, algorithm="hierarchical")
        return buf
    recv = np.empty_like(send)
    ringmpi.Allreduce(send, recv, op, WORLD, algorithm="hierarchical")
    return recv


@pytest.mark.parametrize("nodes", LAYOUTS, indirect=True, ids=[f"k{k}-{p}" for k, p in LAYOUTS])
@pytest.mark.parametrize(("op", "dtype"), OPS)
def test_layouts(nodes, op, dtype):
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    problems: list[str] = []
    for count in sorted({0, 1, max(n - 1, 0), n, n + 1, 1009, 2**20 + 3}):
        send = verify.verify_inputs(op, dtype, rank, count)
        expected = verify.verify_expected(op, dtype, n, count)
        for in_place in (False, True):
            first, second = _call(op, send, in_place), _call(op, send, in_place)
            where = f"{nodes} count {count} {'in' if in_place else 'out-of'}-place"
            if not np.array_equal(first, expected):
                problems.append(f"{where}: wrong result")
            if first.tobytes() != second.tobytes():
                problems.append(f"{where}: the second call differs")
            digests = WORLD.allgather(hashlib.sha256(first.tobytes()).hexdigest())
            if len(set(digests)) != 1:
                problems.append(f"{where}: ranks hold different bits")
    agree(WORLD, problems)


@pytest.mark.parametrize("nodes", [(2, "block")], indirect=True, ids=["k2-block"])
@pytest.mark.parametrize(("op", "dtype"), PAIRS)
def test_every_op_and_dtype(nodes, op, dtype):
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    problems = []
    for count in (0, 1, n + 1, 1009):
        send = verify.verify_inputs(op, dtype, rank, count)
        got = _call(op, send, in_place=count % 2 == 1)
        if not np.array_equal(got, verify.verify_expected(op, dtype, n, count)):
            problems.append(f"count {count}: wrong result")
    agree(WORLD, problems)


def test_random_floats_agree_bitwise_across_ranks(environ):
    environ.set("RINGMPI_RANKS_PER_NODE", "2")
    rng = np.random.default_rng(WORLD.Get_rank())
    x = rng.standard_normal(100_003).astype(np.float32)
    got = ringmpi.allreduce(x, algorithm="hierarchical")
    again = ringmpi.allreduce(x, algorithm="hierarchical")
    reference = np.empty_like(x)
    WORLD.Allreduce(x, reference)
    digests = WORLD.allgather(hashlib.sha256(got.tobytes()).hexdigest())
    problems = [] if len(set(digests)) == 1 else ["ranks hold different bits"]
    if got.tobytes() != again.tobytes():
        problems.append("a repeated call differs")
    if not np.allclose(got, reference, rtol=1e-5, atol=1e-5):
        problems.append("far from comm.Allreduce")
    agree(WORLD, problems)


@pytest.mark.parametrize("nodes", LAYOUTS, indirect=True, ids=[f"k{k}-{p}" for k, p in LAYOUTS])
@pytest.mark.parametrize("count", [0, 1, 5, 1009, 4096])
@pytest.mark.parametrize("across", ACROSS)
def test_trace_counts_inter_node_traffic(nodes, count, across, environ):
    environ.set("RINGMPI_ACROSS", across)
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    x = np.ones(count, np.float64)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, algorithm="hierarchical")
    sent, steps = expected_inter_node_bytes(rank, n, *nodes, count, 8, across)
    problems = []
    if (t.bytes_sent, t.steps) != (sent, steps):
        problems.append(f"traced {(t.bytes_sent, t.steps)}, closed form {(sent, steps)}")
    if any(e.algorithm != "hierarchical" or "inter-node" not in e.phase for e in t.events):
        problems.append("events not labelled as hierarchical inter-node traffic")
    # The shared-memory phase: every slice of this rank's segment is stored once (its
    # contribution where others need it, its results where it owns the slice); it loads
    # the L-1 other contributions of its slices and the other owners' results.
    shared = expected_shared_bytes(rank, n, *nodes, count, 8)
    if (t.shared_written, t.shared_read) != shared:
        problems.append(f"shared memory {(t.shared_written, t.shared_read)}, expected {shared}")
    if not np.all(x == n):
        problems.append("wrong result")
    agree(WORLD, problems)


@pytest.mark.parametrize("nodes", LAYOUTS, indirect=True, ids=[f"k{k}-{p}" for k, p in LAYOUTS])
@pytest.mark.parametrize("across", ACROSS[1:])
@pytest.mark.parametrize(("op", "dtype"), OPS[:3])
def test_every_plan_across_nodes_sums_exactly_and_agrees_bitwise(nodes, across, op, dtype,
                                                                  environ):  # fmt: skip
    environ.set("RINGMPI_ACROSS", across)
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    problems: list[str] = []
    for count in (0, 1, n + 1, 1009, 100_003):
        send = verify.verify_inputs(op, dtype, rank, count)
        got = _call(op, send, in_place=count % 2 == 1)
        if not np.array_equal(got, verify.verify_expected(op, dtype, n, count)):
            problems.append(f"count {count}: wrong result")
        digests = WORLD.allgather(hashlib.sha256(got.tobytes()).hexdigest())
        if len(set(digests)) != 1:
            problems.append(f"count {count}: ranks hold different bits")
    rng = np.random.default_rng(rank)  # rounding: every rank the same bits
    got = ringmpi.allreduce(rng.standard_normal(10_007).astype(np.float32),
                            algorithm="hierarchical")  # fmt: skip
    if len(set(WORLD.allgather(hashlib.sha256(got.tobytes()).hexdigest()))) != 1:
        problems.append("random floats: ranks hold different bits")
    agree(WORLD, problems)


def test_auto_crosses_nodes_in_log_depth_for_small_and_ring_bytes_for_large(environ):
    """Nodes of one rank (M = N): an 8-byte call takes at most 2 ceil(lg M) serial
    steps across nodes (recursive doubling: lg M, and the fold's two), and a 16 MiB
    call still sends the ring's bytes, 2(M-1)/M of the buffer per rank."""
    environ.set("RINGMPI_RANKS_PER_NODE", "1")
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    problems = []
    x = np.ones(1, np.float64)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, x, algorithm="hierarchical")
    serial = 0 if n == 1 else 2 * math.ceil(math.log2(n))
    if t.steps > serial or x[0] != n:
        problems.append(f"8 B: {t.steps} steps (at most {serial}), result {x[0]}")
    count = 2 << 20
    big = np.ones(count, np.float64)
    with ringmpi.trace() as t:
        ringmpi.Allreduce(MPI.IN_PLACE, big, algorithm="hierarchical")
    ring_bytes = expected_inter_node_bytes(rank, n, 1, "block", count, 8, "ring")[0]
    if t.bytes_sent != ring_bytes or not np.all(big == n):
        problems.append(f"16 MiB: sent {t.bytes_sent}, the ring's {ring_bytes}")
    agree(WORLD, problems)


def test_one_node_has_no_inter_node_steps(environ):
    environ.unset("RINGMPI_RANKS_PER_NODE")
    with ringmpi.trace() as t:
        got = ringmpi.allreduce(np.arange(1000, dtype=np.int64), algorithm="hierarchical")
    n = WORLD.Get_size()
    problems = [] if t.messages == 0 else [f"{t.messages} messages on a single node"]
    if not np.array_equal(got, n * np.arange(1000)):
        problems.append("wrong result")
    agree(WORLD, problems)


def test_window_is_reused_across_sizes_and_dtypes(environ):
    environ.set("RINGMPI_RANKS_PER_NODE", "2")
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    problems = []
    # Back to back, so that a rank still reading one call's slots while another
    # writes the next call's (laid out differently) would show.
    calls = [(10, "int32"), (300_000, "float64"), (7, "complex128"), (300_001, "int8"),
             (0, "float32"), (50_000, "uint16"), (33, "int64"), (5_000, "float32")]  # fmt: skip
    for count, dtype in calls * 8:
        send = verify.verify_inputs(MPI.SUM, dtype, rank, count)
        got = ringmpi.allreduce(send, algorithm="hierarchical")
        if not np.array_equal(got, verify.verify_expected(MPI.SUM, dtype, n, count)):
            problems.append(f"{count} x {dtype}: wrong result")
    agree(WORLD, problems)


@pytest.mark.parametrize(
    "nodes", [(2, "block"), (3, "cyclic")], indirect=True, ids=["k2-block", "k3-cyclic"]
)
@pytest.mark.parametrize("stores", ["cached", "streaming"])
@pytest.mark.parametrize("piece", [64, 4096])
def test_many_pieces(nodes, stores, piece, environ):
    # Tiny pieces force the buffer through the window in many passes, the last one
    # short, with either way of storing (a fresh communicator, so that the window
    # is sized for this piece).
    environ.set("RINGMPI_PIECE_BYTES", str(piece))
    environ.set("RINGMPI_WINDOW_STORES", stores)
    comm = WORLD.Dup()
    rank, n = comm.Get_rank(), comm.Get_size()
    problems = []
    for count, op, dtype in [(1009, MPI.SUM, "float64"), (3001, ringmpi.AVG, "complex64"),
                             (777, MPI.MAX, "int16"), (7_001, MPI.BXOR, "uint8"),
                             (3, MPI.PROD, "complex128")]:  # fmt: skip
        send = verify.verify_inputs(op, dtype, rank, count)
        expected = verify.verify_expected(op, dtype, n, count)
        for in_place in (False, True):
            got = send.copy() if in_place else np.empty_like(send)
            with ringmpi.trace() as t:
                ringmpi.Allreduce(MPI.IN_PLACE if in_place else send, got, op, comm,
                                  algorithm="hierarchical")  # fmt: skip
            if not np.array_equal(got, expected):
                problems.append(f"{count} x {dtype} in_place={in_place}: wrong result")
            itemsize = np.dtype(dtype).itemsize
            shared = expected_shared_bytes(rank, n, *nodes, count, itemsize)
            if (t.shared_written, t.shared_read) != shared:
                problems.append(f"shared {(t.shared_written, t.shared_read)}, expected {shared}")
    comm.Free()
    agree(WORLD, problems)


@pytest.mark.parametrize("nbytes", [3 << 20, 3 << 16], ids=["3MiB", "192KiB"])
def test_the_node_times_both_ways_and_agrees(environ, nbytes):
    # From 64 KiB the first calls of a size class alternate between cached and
    # streaming stores to the window, timing each; then every rank of a node keeps
    # the same way. Results are exact throughout, and the choice lives with the
    # communicator. From 1 MiB the chosen way's calls are timed on (below, only
    # the trials).
    environ.unset("RINGMPI_PIECE_BYTES")
    environ.unset("RINGMPI_WINDOW_STORES")
    environ.set("RINGMPI_RANKS_PER_NODE", "2")
    from ringmpi import _comm
    from ringmpi.algorithms import hierarchical

    comm = WORLD.Dup()
    rank, n = comm.Get_rank(), comm.Get_size()
    count = nbytes // 4 + 3  # float32: a size class of its own
    send = verify.verify_inputs(MPI.SUM, "float32", rank, count)
    expected = verify.verify_expected(MPI.SUM, "float32", n, count)
    problems = []
    for call in range(2 * (hierarchical._TRIALS + 1) + 2):
        got = ringmpi.allreduce(send, comm=comm, algorithm="hierarchical")
        if not np.array_equal(got, expected):
            problems.append(f"call {call}: wrong result")
    ctx = _comm.context(comm)
    (choice,) = ctx.peek("hierarchical").choices.values()
    timed = {way: len(t) for way, t in choice.times.items()}
    if timed != {"cached": hierarchical._TRIALS + 1, "streaming": hierarchical._TRIALS + 1}:
        problems.append(f"timed calls per way: {timed}")
    # Each node chooses for itself (nodes of 2 consecutive ranks here).
    chosen = comm.allgather((rank // 2, choice.chosen))
    if len(set(chosen)) != -(-n // 2) or choice.chosen is None:
        problems.append(f"(node, choice) of every rank: {chosen}")
    # the 2 calls after the choice: timed (1 MiB and more) or not
    watched = len(choice.since) if nbytes >= 1 << 20 else None
    if (choice.watch, watched) != ((True, 2) if nbytes >= 1 << 20 else (False, None)):
        problems.append(f"after the choice: watch {choice.watch}, {choice.since}")
    comm.Free()
    agree(WORLD, problems)


@pytest.mark.parametrize(
    ("name", "value"), [("RINGMPI_PIECE_BYTES", "-1"), ("RINGMPI_WINDOW_STORES", "fast")]
)
def test_bad_window_settings(environ, name, value):
    environ.set(name, value)
    comm = WORLD.Dup()
    with pytest.raises(ValueError, match=name):
        ringmpi.allreduce(np.ones(4), comm=comm, algorithm="hierarchical")
    comm.Free()


@pytest.mark.parametrize(
    ("name", "value", "match"),
    [("RINGMPI_RANKS_PER_NODE", "0", "RANKS_PER_NODE"), ("RINGMPI_RANKS_PER_NODE", "two", "RANKS_PER_NODE"),
     ("RINGMPI_NODE_PLACEMENT", "scatter", "PLACEMENT")],
)  # fmt: skip
def test_bad_node_settings(environ, name, value, match):
    environ.set(name, value)
    with pytest.raises(ValueError, match=match):
        ringmpi.allreduce(np.ones(4), algorithm="hierarchical")


@pytest.mark.parametrize("nodes", LAYOUTS, indirect=True, ids=[f"k{k}-{p}" for k, p in LAYOUTS])
def test_auto_sees_the_emulated_nodes(nodes):
    """auto predicts with the emulated layout (M nodes, the largest node's ranks) and
    runs what it predicts; every size gives the exact result."""
    from ringmpi import _comm, algorithms, tuning

    k, placement = nodes
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    layout = expected_nodes(n, k, placement)
    shape = (len(layout), max(len(x) for x in layout))
    ctx = _comm.context(comm)
    problems = []
    for count in (1, 1009, 1 << 18, 1 << 20):
        nbytes = count * 4
        chosen = algorithms.choose("auto", nbytes, ctx).name
        candidates = [algorithms.get(a) for a in algorithms.usable(ctx)
                      if algorithms.get(a).crowded or not ctx.sleepy]  # fmt: skip
        # untuned: the constants for nodes of the largest node's size
        want = tuning.choose(tuning.load(shape[1]), nbytes, n, *shape, candidates).name
        if chosen != want:
            problems.append(f"{nbytes} B: auto chose {chosen}, the model says {want}")
        x = verify.verify_inputs(MPI.SUM, "float32", comm.Get_rank(), count)
        got = ringmpi.allreduce(x, algorithm="auto")
        if not np.array_equal(got, verify.verify_expected(MPI.SUM, "float32", n, count)):
            problems.append(f"{nbytes} B: wrong result from auto ({chosen})")
    agree(comm, problems)
