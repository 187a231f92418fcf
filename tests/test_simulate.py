"""The SimGrid replay of scaling --simulate: its timings against closed forms.

Skipped where SimGrid is not installed (``make simulate`` builds it); ``make
test-simulate`` sets RINGMPI_REQUIRE_SIMGRID=1, so there a missing SimGrid fails.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from ringmpi import tuning
from ringmpi.tools import _simgrid, scaling

_WHY = _simgrid.available()
pytestmark = [
    pytest.mark.simulate,
    pytest.mark.skipif(
        _WHY is not None and os.environ.get("RINGMPI_REQUIRE_SIMGRID") != "1",
        reason=f"SimGrid is not installed (make simulate): {_WHY}",
    ),
]

FABRIC = scaling.Fabric(alpha=2e-6, beta=1e-9)
NODE = dataclasses.replace(tuning.DEFAULTS, alpha=1e-6, beta=1e-10, gamma=2e-10, call=3e-6)


def _replay(nodes, per_node, sizes, names, shared_nic=False):
    costs = scaling.costs_for(nodes, per_node, FABRIC, NODE)
    return _simgrid.simulate(nodes, per_node, sizes, names, costs, NODE, FABRIC.alpha,
                             FABRIC.beta, shared_nic)  # fmt: skip


def test_a_ring_of_two_nodes_takes_its_closed_form():
    """2 nodes of 1 rank, the ring: two messages of n/2 bytes each way, each the
    fabric's alpha plus the node's, at the fabric's beta (the narrowest link); one
    reduce of n/2 bytes; the call's fixed cost."""
    n = 1 << 20
    got = _replay(2, 1, [n], ["ring"])[("ring", n)]
    want = NODE.call + 2 * (FABRIC.alpha + NODE.alpha) + 2 * (n / 2) * FABRIC.beta
    want += (n / 2) * NODE.gamma
    assert got == pytest.approx(want, rel=1e-6)


def test_recursive_doubling_inside_a_node_uses_the_node_links():
    """1 node of 2 ranks: one exchange of the whole buffer at the node's alpha and beta."""
    n = 4096
    got = _replay(1, 2, [n], ["recursive_doubling"])[("recursive_doubling", n)]
    want = NODE.call + NODE.alpha + n * NODE.beta + n * NODE.gamma
    assert got == pytest.approx(want, rel=1e-6)


def test_rails_share_the_nic_only_when_told():
    """2 nodes of 4: each rail moves a quarter of the buffer; with a NIC per node of
    L/beta the rails run at 1/beta each, sharing one of 1/beta they take 4 times as
    long to move their bytes."""
    n = 8 << 20
    own = _replay(2, 4, [n], ["hierarchical"])[("hierarchical", n)]
    shared = _replay(2, 4, [n], ["hierarchical"], shared_nic=True)[("hierarchical", n)]
    moved = 2 * (n / 4 / 2) * FABRIC.beta  # the ring across 2 nodes on a quarter
    assert shared - own == pytest.approx(3 * moved, rel=1e-3)


def test_every_algorithm_replays_and_log_depth_wins_small_buffers():
    rows = scaling.simulate_grid(FABRIC, NODE, nodes=[8], per_node=2, sizes=[8, 1 << 20])
    small, large = rows
    assert small["auto"]["algorithm"] in ("hierarchical", "recursive_doubling")
    for row in rows:
        for a in scaling.ALGORITHMS:
            assert row[a]["simulated"] > 0
        assert row["auto"]["simulated"] == row[row["auto"]["algorithm"]]["simulated"]
    # 8 B on 8 nodes: no way round lg 8 = 3 messages across nodes in a row
    assert small["auto"]["simulated"] >= 3 * FABRIC.alpha
    assert small["auto"]["bound"] == 4 * FABRIC.alpha  # ceil(lg 16) alpha
    # and recursive doubling's 4 exchanges beat the flat ring's 30 steps
    assert small["recursive_doubling"]["simulated"] < small["ring"]["simulated"] / 3
    # 1 MiB: the bound's 2n(N-1)/N beta charges every byte to the fabric; hierarchical
    # sends a rank's 1/L of them across nodes, so it may come in below it
    assert large["auto"]["bound"] == pytest.approx(2 * (1 << 20) * 15 / 16 * FABRIC.beta)


def test_a_measured_run_is_replayed_on_its_layout():
    """--check: each row of a run (auto's label too) next to its replay on the run's
    nodes; rows of algorithms outside the model are left out."""
    run = {"header": {"ranks": 2, "nodes": 2},
           "rows": [{"algorithm": "ring", "size": 1 << 20, "time_us": 2000.0},
                    {"algorithm": "auto(recursive_doubling)", "size": 8, "time_us": 10.0},
                    {"algorithm": "mpi", "size": 8, "time_us": 3.0}]}  # fmt: skip
    rows = scaling.simulate_check([run], FABRIC, NODE)
    assert [(r["algorithm"], r["bytes"]) for r in rows] == [("ring", 1 << 20),
                                                           ("auto(recursive_doubling)", 8)]  # fmt: skip
    ring = _replay(2, 1, [1 << 20], ["ring"])[("ring", 1 << 20)]
    assert rows[0]["simulated"] == pytest.approx(ring, rel=1e-9)
    assert rows[0]["ratio"] == pytest.approx(2000e-6 / ring)
