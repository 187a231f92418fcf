"""The ring schedule, checked on simulated ranks for every N from 1 to 64 (no MPI)."""

from __future__ import annotations

import pytest

from ringmpi import tuning
from ringmpi.algorithms import latency
from ringmpi.schedule import (
    ALL_GATHER,
    REDUCE_SCATTER,
    chunk_bounds,
    hierarchical_plan,
    owned_slices,
    ring_steps,
)
from ringmpi.tools.schedule import main, simulate_hierarchical, simulate_naive, simulate_ring

RING_SIZES = range(1, 65)


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 7, 8, 64])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 8, 63, 64, 65, 1009])
def test_chunk_bounds_are_uneven_only_at_the_front(nranks, count):
    b = chunk_bounds(count, nranks)
    sizes = [b[c + 1] - b[c] for c in range(nranks)]
    assert b[0] == 0 and b[-1] == count
    base, extra = divmod(count, nranks)
    assert sizes == [base + 1] * extra + [base] * (nranks - extra)


def test_chunk_bounds_reject_nonsense():
    with pytest.raises(ValueError, match="count"):
        chunk_bounds(-1, 4)
    with pytest.raises(ValueError, match="nchunks"):
        chunk_bounds(4, 0)


@pytest.mark.parametrize("nranks", RING_SIZES)
def test_step_rule(nranks):
    for r in range(nranks):
        steps = list(ring_steps(nranks, r))
        assert len(steps) == 2 * (nranks - 1)
        rs = [s for s in steps if s.phase == REDUCE_SCATTER]
        ag = [s for s in steps if s.phase == ALL_GATHER]
        assert [s.step for s in rs] == list(range(nranks - 1))
        assert [s.step for s in ag] == list(range(nranks - 1))
        for s in rs:
            assert (s.send_chunk, s.recv_chunk) == (
                (r - s.step) % nranks,
                (r - s.step - 1) % nranks,
            )
            assert s.last == (s.step == nranks - 2)
        for s in ag:
            assert (s.send_chunk, s.recv_chunk) == (
                (r - s.step + 1) % nranks,
                (r - s.step) % nranks,
            )


@pytest.mark.parametrize("nranks", RING_SIZES)
def test_what_arrives_is_what_the_receiver_accumulates(nranks):
    # At every step, the chunk rank r sends is the chunk rank r+1 expects to receive.
    plans = [list(ring_steps(nranks, r)) for r in range(nranks)]
    for k in range(2 * (nranks - 1)):
        for r in range(nranks):
            assert plans[r][k].send_chunk == plans[(r + 1) % nranks][k].recv_chunk


@pytest.mark.parametrize("nranks", RING_SIZES)
def test_reduce_scatter_completes_each_chunk_on_exactly_one_rank(nranks):
    _, after_rs, final = simulate_ring(nranks, count=3 * nranks + 1)
    everyone = set(range(nranks))
    for c in range(nranks):
        owners = [r for r in range(nranks) if after_rs[r][c] == everyone]
        assert owners == [(c - 1) % nranks]  # rank r finishes chunk r + 1
    # ... and after all-gather every rank holds every chunk, complete.
    assert all(chunk == everyone for chunks in final for chunk in chunks)


@pytest.mark.parametrize("nranks", RING_SIZES)
def test_counted_cost_equals_the_closed_form(nranks):
    count, itemsize = 1000 * nranks, 4  # divisible: the closed form is exact
    ring, _, _ = simulate_ring(nranks, count, itemsize)
    buffer = count * itemsize
    assert ring.bytes_sent == [2 * (nranks - 1) * buffer // nranks] * nranks
    assert ring.steps == [2 * (nranks - 1)] * nranks
    assert ring.messages == nranks * 2 * (nranks - 1)
    naive = simulate_naive(nranks, count, itemsize)
    assert naive.bytes_sent == [(nranks - 1) * buffer] * nranks


@pytest.mark.parametrize("nranks", [2, 3, 5, 7])
@pytest.mark.parametrize("count", [1, 2, 10, 1009])
def test_counted_bytes_with_uneven_chunks(nranks, count):
    # Rank r sends every chunk but r+1 in reduce-scatter and every chunk but r+2 in all-gather.
    b = chunk_bounds(count, nranks)
    size = [b[c + 1] - b[c] for c in range(nranks)]
    ring, _, _ = simulate_ring(nranks, count)
    expected = [2 * count - size[(r + 1) % nranks] - size[(r + 2) % nranks] for r in range(nranks)]
    assert ring.bytes_sent == expected


def test_cli_prints_the_tables(capsys):
    assert main(["4"]) == 0
    out = capsys.readouterr().out
    assert "reduce-scatter     0      0->3      1->0      2->1      3->2" in out
    assert "all-gather         2      3->2      0->3      1->0      2->1" in out
    assert "ring bytes per rank / buffer          1.50" in out
    assert "serial steps                             6" in out
    assert "chunk sends, all ranks                  24" in out
    assert main(["64", "--no-steps"]) == 0
    out = capsys.readouterr().out
    assert "ring bytes per rank / buffer          1.97" in out
    assert "naive bytes per rank / buffer        63.00" in out
    assert "serial steps                           126" in out
    assert "chunk sends, all ranks                8064" in out


@pytest.mark.parametrize("placement", ["block", "cyclic"])
@pytest.mark.parametrize("per_node", [1, 2, 3, 4])
@pytest.mark.parametrize("nranks", range(1, 9))
def test_hierarchical_plan_and_counted_cost(nranks, per_node, placement):
    plan = hierarchical_plan(nranks, per_node, placement)
    assert sorted(r for n in plan.nodes for r in n) == list(range(nranks))
    assert len(plan.nodes) == -(-nranks // per_node)
    assert all(len(n) <= per_node for n in plan.nodes)
    # Rail j holds one rank per node: the owner of slice j there.
    for j, rail in enumerate(plan.rails):
        assert [n.index(r) for n, r in zip(plan.nodes, rail, strict=True)] == [
            j % len(n) for n in plan.nodes
        ]
    count = 40320  # 8!: every slice and every rail chunk even, so the closed forms are exact
    cost = simulate_hierarchical(nranks, per_node, placement, count)
    m, s = len(plan.nodes), plan.nslices
    for node in plan.nodes:
        for local, r in enumerate(node):
            owned = len(owned_slices(local, len(node), s))
            assert cost.inter_steps[r] == owned * 2 * (m - 1)
            assert cost.inter_bytes[r] == owned * 2 * (m - 1) * count // (s * m)
            assert cost.shared_stored[r] == count
            assert cost.shared_loaded[r] == count - owned * count // s * (2 - len(node))


def test_hierarchical_cli(capsys):
    assert main(["8", "--ranks-per-node", "3", "--across", "ring"]) == 0
    out = capsys.readouterr().out
    assert "nodes: [0,1,2] [3,4,5] [6,7]" in out
    assert "slice 2: rail 2 -> 5 -> 6" in out
    assert "serial inter-node steps (max)                            8          14" in out


@pytest.mark.parametrize(
    ("count", "across", "steps", "share"),
    [(8, "recursive_doubling", 3, 3 / 8), (65536, "rabenseifner_hybrid", 4, 2 / 8),
     (1 << 20, "rabenseifner_hybrid", 5, 2 * 7 / 8 / 8)],
)  # fmt: skip
def test_auto_across_eight_nodes_is_log_depth(capsys, count, across, steps, share):
    """8 nodes of 8: recursive doubling's lg 8 steps for a small slice; larger ones
    halve part of the way: one halving (4 steps, 2/M of the slice), then two (5
    steps: the ring's bytes, 2(M-1)/M of each rank's slice, one step short of
    Rabenseifner's 2 lg 8, as the last halving and the first doubling send what
    one swap sends)."""
    assert main(["64", "--ranks-per-node", "8", "--count", str(count)]) == 0
    out = capsys.readouterr().out
    assert f"across them {across})" in out
    assert f"serial inter-node steps (max){steps:>29}" in out
    assert f"inter-node bytes per rank / buffer (max){share:>18.2f}" in out


@pytest.mark.parametrize("nodes", range(2, 17))
@pytest.mark.parametrize("across", ["ring", "rabenseifner", "recursive_doubling",
                                    "rabenseifner_hybrid"])  # fmt: skip
@pytest.mark.parametrize("count", [40320 * 2, 8192])
def test_every_plan_across_nodes_completes_every_rail(nodes, across, count):
    """Every plan across M = 2-16 nodes of 2 leaves every slice complete (the simulator
    checks it) with its closed-form serial steps per rail (the hybrid: lg M plus the
    halvings it prices fastest for the slice, with the constants of nodes of 2)."""
    cost = simulate_hierarchical(2 * nodes, 2, "block", count, across=across)
    q = 1 << (nodes.bit_length() - 1)
    lg, folded = q.bit_length() - 1, nodes > q
    depth = latency.hybrid_depth(count // 2, q, tuning.load(2))
    want = {"ring": 2 * (nodes - 1), "rabenseifner": 2 * lg + 2 * folded,
            "recursive_doubling": lg + 2 * folded,
            "rabenseifner_hybrid": lg + depth + 2 * folded}[across]  # fmt: skip
    assert max(cost.inter_steps) == want
    if across == "rabenseifner_hybrid" and nodes == 16:
        assert 0 < depth < lg  # part of the way, at the ring's bytes


def test_hierarchical_plot(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert (
        main(["5", "--ranks-per-node", "2", "--node-placement", "cyclic", "--plot", str(png)]) == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        main(["5", "--plot", str(png)])  # a picture of the hierarchical plan needs K
