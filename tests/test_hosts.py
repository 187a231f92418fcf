"""Across emulated hosts: real nodes, separate network stacks, the hierarchical algorithm.

``make test-hosts`` makes hosts with ``cluster/hosts-up.sh`` (a network, UTS and
IPC namespace each, docs/cluster.md), runs the MPI tests here under mpirun
through ``cluster/host-agent.sh`` for several layouts (2, 3 and 4 hosts of 2
ranks, 3 + 2 ranks), then the launcher test, and removes the hosts. Without the
hosts every test here is skipped, saying so. Nodes are the real ones
(``MPI_Comm_split_type``): the rails' messages cross TCP between namespaces.
The closed forms are test_mpi_hierarchical's, for block nodes of the first
host's size, which is what ``-hosts h1:k,h2:k,...`` gives.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI
from test_mpi_hierarchical import (
    ACROSS,
    OPS,
    expected_inter_node_bytes,
    expected_nodes,
    expected_shared_bytes,
    rail_traffic,
)

import ringmpi
from ringmpi import verify

pytestmark = pytest.mark.hosts

WORLD = MPI.COMM_WORLD
ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "cluster" / "host-agent.sh"
STATE = Path(os.environ.get("RINGMPI_HOSTS_STATE", "/run/ringmpi-hosts"))
PREFIX = "ringmpi-h"
NOT_UP = (
    "the emulated hosts are not up (make test-hosts, or cluster/hosts-up.sh N and mpirun "
    "-launcher ssh -launcher-exec cluster/host-agent.sh -localhost ringmpi-root -hosts ...)"
)


@pytest.fixture(scope="module")
def nodes() -> list[list[int]]:
    """The job's hosts as lists of world ranks, by lowest rank; skips unless the job
    spans two or more emulated hosts (collective: every rank decides alike)."""
    names = WORLD.allgather(socket.gethostname())
    if len(set(names)) < 2 or not all(n.startswith(PREFIX) for n in names):
        pytest.skip(f"not running across emulated hosts (hosts {sorted(set(names))}): {NOT_UP}")
    by_host: dict[str, list[int]] = {}
    for rank, name in enumerate(names):
        by_host.setdefault(name, []).append(rank)
    return sorted(by_host.values())


@pytest.fixture
def real_nodes(nodes, environ) -> tuple[int, str]:
    """(k, "block") such that the closed forms' emulated layout is the real one."""
    environ.unset("RINGMPI_RANKS_PER_NODE")
    environ.unset("RINGMPI_NODE_PLACEMENT")
    k = len(nodes[0])
    assert nodes == expected_nodes(WORLD.Get_size(), k, "block"), (
        f"hosts {nodes} are not consecutive blocks of {k}: launch with -hosts h1:k,h2:k,... "
        "(the last host may have fewer)"
    )
    return k, "block"


@pytest.mark.mpi
def test_each_host_is_a_node(nodes):
    """The hostnames, MPI's shared-memory nodes and the namespaces agree."""
    rank = WORLD.Get_rank()
    node = WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    mine = node.allgather(rank)
    node.Free()
    problems = []
    if mine not in nodes:
        problems.append(f"MPI's node {mine} is not a host: {nodes}")
    # Ranks of one host share its network and IPC namespaces; no two hosts do.
    spaces = WORLD.allgather(
        tuple(os.readlink(f"/proc/self/ns/{k}") for k in ("net", "ipc", "uts"))
    )
    for host in nodes:
        if len({spaces[r] for r in host}) != 1:
            problems.append(f"ranks {host} are in different namespaces")
    if len({spaces[host[0]] for host in nodes}) != len(nodes):
        problems.append("two hosts share a namespace")
    # The layout asked for with -hosts, when the launcher says (make test-hosts does).
    asked = os.environ.get("RINGMPI_TEST_HOSTS")
    if asked:
        want = [
            h for item in asked.split(",") for h in [item.split(":")[0]] * int(item.split(":")[1])
        ]
        got = WORLD.allgather(socket.gethostname())
        if got != want:
            problems.append(f"ranks run on {got}, asked for {want}")
    agree(WORLD, problems)


@pytest.mark.mpi
def test_shared_window_within_a_host(nodes):
    """MPI_Win_allocate_shared (the hierarchical algorithm's window) within a host."""
    rank = WORLD.Get_rank()
    node = WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    win = MPI.Win.Allocate_shared(8, 8, comm=node)
    mem = np.frombuffer(win.tomemory(), np.int64)
    win.Lock_all()
    mem[0] = 1000 + rank
    win.Sync()
    node.Barrier()
    win.Sync()
    seen = []
    for r in range(node.Get_size()):
        buf, _ = win.Shared_query(r)
        seen.append(int(np.frombuffer(buf, np.int64)[0]))
    win.Unlock_all()
    want = [1000 + r for r in node.allgather(rank)]
    win.Free()
    node.Free()
    agree(WORLD, [] if seen == want else [f"read {seen} from the window, expected {want}"])


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["hierarchical", "ring", "auto"])
@pytest.mark.parametrize(("op", "dtype"), OPS)
def test_exact_results(real_nodes, algorithm, op, dtype):
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    problems: list[str] = []
    for count in sorted({0, 1, n - 1, n, n + 1, 1009, 2**18 + 3}):
        send = verify.verify_inputs(op, dtype, rank, count)
        expected = verify.verify_expected(op, dtype, n, count)
        for in_place in (False, True):
            results = []
            for _ in range(2):  # each call twice: cached state must not change the result
                if in_place:
                    got = send.copy()
                    ringmpi.Allreduce(MPI.IN_PLACE, got, op, WORLD, algorithm=algorithm)
                else:
                    got = np.empty_like(send)
                    ringmpi.Allreduce(send, got, op, WORLD, algorithm=algorithm)
                results.append(got)
            where = f"count {count} {'in' if in_place else 'out-of'}-place"
            if not np.array_equal(results[0], expected):
                problems.append(f"{where}: wrong result")
            if results[0].tobytes() != results[1].tobytes():
                problems.append(f"{where}: the second call differs")
            digests = WORLD.allgather(hashlib.sha256(results[0].tobytes()).hexdigest())
            if len(set(digests)) != 1:
                problems.append(f"{where}: ranks hold different bits")
    agree(WORLD, problems)


@pytest.mark.mpi
@pytest.mark.parametrize("dtype", ["float64", "int8"])
@pytest.mark.parametrize("count", [0, 1, 5, 1009, 65543])
@pytest.mark.parametrize("across", ACROSS)
def test_trace_counts_inter_node_traffic(real_nodes, nodes, dtype, count, across, environ):
    """Inter-node bytes and steps of the hierarchical algorithm, counted, against the
    closed form of each plan across hosts (the ring: 2(M-1) steps per rail on M
    hosts), and the flat ring's 2(N-1)."""
    environ.set("RINGMPI_ACROSS", across)
    rank, n = WORLD.Get_rank(), WORLD.Get_size()
    itemsize = np.dtype(dtype).itemsize
    x = verify.verify_inputs(MPI.SUM, dtype, rank, count)
    with ringmpi.trace() as t:
        got = ringmpi.allreduce(x, algorithm="hierarchical")
    with ringmpi.trace() as flat:
        ringmpi.allreduce(x, algorithm="ring")
    problems = []
    if not np.array_equal(got, verify.verify_expected(MPI.SUM, dtype, n, count)):
        problems.append("wrong result")
    sent, steps = expected_inter_node_bytes(rank, n, *real_nodes, count, itemsize, across)
    if (t.bytes_sent, t.steps) != (sent, steps):
        problems.append(
            f"traced (bytes, steps) {(t.bytes_sent, t.steps)}, closed form {(sent, steps)}"
        )
    shared = expected_shared_bytes(rank, n, *real_nodes, count, itemsize)
    if (t.shared_written, t.shared_read) != shared:
        problems.append(f"shared memory {(t.shared_written, t.shared_read)}, expected {shared}")
    # Every peer of a rail message is on another host.
    host_of = {r: i for i, host in enumerate(nodes) for r in host}
    local = [e.peer for e in t.events if host_of[e.peer] == host_of[rank]]
    if local:
        problems.append(f"rail messages to ranks of its own host: {local}")
    # With hosts of equal size every rank owns one slice: the ring's exactly 2(M-1)
    # steps, and the flat ring's 2(N-1) counted in the same run.
    m = len(nodes)
    if across == "ring" and len({len(h) for h in nodes}) == 1 and t.steps != 2 * (m - 1):
        problems.append(f"{t.steps} inter-node steps on {m} hosts, not 2(M-1) = {2 * (m - 1)}")
    if flat.steps != 2 * (n - 1):
        problems.append(f"flat ring: {flat.steps} steps, not 2(N-1) = {2 * (n - 1)}")
    agree(WORLD, problems)


def _hosts_up() -> list[str]:
    hostfile = STATE / "hostfile"
    if not hostfile.exists() or not Path("/run/netns", "ringmpi-h1").exists():
        return []
    return hostfile.read_text().split()


@pytest.mark.skipif("--with-mpi" in sys.argv, reason="starts mpirun itself")
def test_cli_across_hosts(tmp_path):
    """The command line, launched across every host at 2 ranks each: the header counts
    the hosts as nodes, no wrong element, hierarchical's inter-node steps those of a
    plan across nodes (recursive doubling's at 8 B)."""
    hosts = _hosts_up()
    if len(hosts) < 2:
        pytest.skip(NOT_UP)
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or "mpirun"
    out = tmp_path / "rows.json"
    cmd = [mpirun, "-launcher", "ssh", "-launcher-exec", str(AGENT), "-localhost", "ringmpi-root",
           "-hosts", ",".join(f"{h}:2" for h in hosts), sys.executable, "-m", "ringmpi.allreduce",
           "-a", "hierarchical,ring,mpi", "-b", "8", "-e", "1M", "-f", "32", "-n", "2", "-w", "1",
           "--json", str(out)]  # fmt: skip
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    env.pop("RINGMPI_RANKS_PER_NODE", None)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    m, n = len(hosts), 2 * len(hosts)
    assert f"# ranks {n}, nodes {m}\n" in done.stdout
    assert "# wrong elements in total: 0" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["wrong"] == 0 for r in rows)
    # rank 0 is its rails' member 0: each plan's steps there (the ring's 2(M-1))
    lg = m.bit_length() - 1
    plans = {a: rail_traffic(a, m, 0, 1, depth=lg)[1] for a in ACROSS}
    plans.update({k: rail_traffic("rabenseifner_hybrid", m, 0, 1, depth=k)[1] for k in range(lg)})
    for row in rows:
        if row["algorithm"] == "hierarchical":
            assert row["steps"] in plans.values(), row
            if row["size"] == 8:  # latency-bound: recursive doubling's lg M
                assert row["steps"] == plans["recursive_doubling"], row
        elif row["algorithm"] == "ring":
            assert row["steps"] == 2 * (n - 1), row
