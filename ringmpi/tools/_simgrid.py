"""Replay ringmpi's plans in SimGrid (the ``simulate`` extra): ``scaling --simulate``.

The platform, for M nodes of L ranks (block placement, rank = node·L + local):

* a two-level fat tree of M leaves with full bisection (``add_netzone_fatTree``),
  its links of the node links' bandwidth and no latency of their own;
* each leaf a node: a star zone of L hosts (the ranks) and a gateway host
  (the node's network interface). A rank reaches the others of its node over
  its own link (the node's alpha and beta: half the latency each way); it
  reaches other nodes through its link, then the node's interface link,
  whose latency is half the fabric's alpha each way and whose bandwidth is
  L/beta (a rail of 1/beta per rank, as the model's hierarchical term
  assumes) or 1/beta (``shared_nic``: one link for the node's L ranks).

A message between nodes thus takes alpha plus the node's alpha, and n bytes take n
times the narrowest link's seconds per byte (SimGrid's CM02 model, no
latency or bandwidth factors, no TCP window). Each rank is an
actor that carries out its plan's rows as the step engine does: post the
row's send, receive the row's message, wait for the send; a reduce then
takes gamma per byte received. Hierarchical's node phase is not messages but
memory: each rank spends the model's node-phase time (``node_call``,
``node_step``, ``node_byte``), half before its rails and half after. Every
algorithm's rows are the plans ringmpi runs (:mod:`ringmpi.plans`); the
rails' plan across nodes is the one :func:`~ringmpi.algorithms.hierarchical.
across_nodes` picks with the same constants.

What is replayed: every message of recursive doubling (lg N rows a rank); the
flat ring's N·2(N-1) messages up to :data:`RING_MAX_RANKS` ranks, none above
(SimGrid's Python actors take about a millisecond a message here); and
hierarchical's rails. With a link per rail the L rails run alike on links of
their own, so one rail's M ranks stand for all, on interfaces of 1/beta (a
process of their own); with ``shared_nic`` all L rails run, sharing it.

Each (nodes, ranks per node) runs in a process of its own (SimGrid has one
engine per process); its scenarios run one after another in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ringmpi import algorithms, plans, tuning
from ringmpi.algorithms import hierarchical

__all__ = ["RING_MAX_RANKS", "available", "simulate"]

# The flat ring is replayed up to this many ranks (2(N-1)·N messages: 8,064 at 64).
RING_MAX_RANKS = 64
_ITEMSIZE = 4  # float32, as the benchmark


def available() -> str | None:
    """None if SimGrid's Python module imports, else why not."""
    probe = subprocess.run([sys.executable, "-c", "import simgrid"], capture_output=True,
                           text=True, env=_env(), check=False)  # fmt: skip
    if probe.returncode == 0:
        return None
    return (probe.stderr.strip().splitlines() or ["import failed"])[-1]


def _env() -> dict[str, str]:
    """The environment SimGrid's module loads in: its shared library sits next to it
    in site-packages, which the dynamic loader does not search by itself."""
    env = dict(os.environ)
    import sysconfig  # noqa: PLC0415

    site = sysconfig.get_paths()["platlib"]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (site, env.get("LD_LIBRARY_PATH")) if p)
    return env


def simulate(nodes: int, per_node: int, sizes, names, costs: tuning.Costs, node: tuning.Costs,
             fabric_alpha: float, fabric_beta: float,
             shared_nic: bool = False) -> dict[tuple[str, int], float | None]:  # fmt: skip
    """Simulated seconds of each (algorithm, size) on ``nodes`` nodes of ``per_node``
    ranks (None: not replayed), in a SimGrid process of its own. ``costs`` are the
    model's constants for the layout (its choice across nodes), ``node`` the node's
    own (its alpha, beta for messages inside a node, gamma and the node phase)."""
    base = {"nodes": nodes, "per_node": per_node, "sizes": list(sizes),
            "costs": tuning.as_dict(costs), "node": tuning.as_dict(node),
            "alpha": fabric_alpha, "beta": fabric_beta}  # fmt: skip
    flat = [a for a in names if a != "hierarchical"]
    jobs = []
    if flat:  # every rank's messages; the node's interface: L rails of 1/beta, or one
        jobs.append({**base, "names": flat, "links": 1 if shared_nic else per_node, "rails": 0})
    if "hierarchical" in names:  # one rail on a link of its own, or all L on a shared one
        jobs.append({**base, "names": ["hierarchical"], "links": 1,
                     "rails": per_node if shared_nic else 1})  # fmt: skip
    found: dict[tuple[str, int], float | None] = {}
    for job in jobs:
        done = subprocess.run([sys.executable, "-m", "ringmpi.tools._simgrid"],
                              input=json.dumps(job), capture_output=True, text=True, env=_env(),
                              check=False)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"SimGrid replay of {nodes} x {per_node} failed: "
                               f"{done.stderr.strip()[-2000:]}")  # fmt: skip
        out = json.loads(done.stdout.strip().splitlines()[-1])
        found.update({(a, int(n)): t for a, n, t in out})
    return found


def _rows(name: str, nranks: int, nodes: int, per_node: int, nbytes: int, costs: tuning.Costs,
          rails: int):  # fmt: skip
    """Per rank: (delay before, rows, delay after) or None (it sits out); a row is (send
    to, bytes, receive from, bytes, reduces). None if the plan is not replayed."""
    count = max(1, nbytes // _ITEMSIZE)
    if name == "hierarchical":
        return _hierarchical_rows(nranks, nodes, per_node, count, costs, rails)
    if name == "ring" and nranks > RING_MAX_RANKS:
        return None
    build = algorithms.get(name).plan
    assert build is not None, f"{name} has no plan to replay"
    call = costs.call
    return [(call, _table(build(nranks, r, count, _ITEMSIZE), None), 0.0) for r in range(nranks)]


def _table(plan, peers) -> list[tuple[int, int, int, int, bool]]:
    out = []
    for row in plan.table:
        to, frm = int(row[plans.SEND_TO]), int(row[plans.RECV_FROM])
        if peers is not None:
            to = peers[to] if to >= 0 else -1
            frm = peers[frm] if frm >= 0 else -1
        out.append((to, int(row[plans.SEND_LEN]) * _ITEMSIZE, frm,
                    int(row[plans.RECV_LEN]) * _ITEMSIZE,
                    bool(row[plans.ACTION] & plans.REDUCE)))  # fmt: skip
    return out


def _hierarchical_rows(nranks, nodes, per_node, count, costs, rails):
    """Slice j of the buffer is reduced by local rank j of every node; rail j runs
    the plan across nodes the model picks for the slice (priced with ``costs``).
    Only the ranks of the first ``rails`` rails act (the others are idle)."""
    t = algorithms.get("hierarchical").terms(count * _ITEMSIZE, nranks, nodes, per_node)
    phase = sum(getattr(costs, k) * v for k, v in t.items() if k.startswith("node_"))
    bounds = [count * j // per_node for j in range(per_node + 1)]
    out = []
    for r in range(nranks):
        m, j = divmod(r, per_node)
        if j >= rails:
            out.append(None)
            continue
        length = bounds[j + 1] - bounds[j]
        rows = []
        if nodes > 1:
            with tuning.pricing_with(costs):
                name = hierarchical.across_nodes(length * _ITEMSIZE, nodes, per_node)
                built = algorithms.get(name).plan(nodes, m, length, _ITEMSIZE)
            rail = [k * per_node + j for k in range(nodes)]
            rows = _table(built, rail)
        out.append((phase / 2, rows, phase / 2))
    return out


def _run(job: dict) -> list:
    """Build the platform, then replay every scenario (runs in its own process)."""
    import simgrid as sg  # noqa: PLC0415 (the simulate extra)

    nodes, per_node = job["nodes"], job["per_node"]
    nranks = nodes * per_node
    node = tuning.Costs(**{k: v for k, v in job["node"].items() if k in _FIELDS})
    costs = tuning.Costs(**{k: v for k, v in job["costs"].items() if k in _FIELDS})
    alpha, beta = job["alpha"], job["beta"]
    nic_bw = job["links"] / beta
    engine = sg.Engine(["ringmpi-scaling", *_CONFIG])
    duplex = sg.Link.SharingPolicy.SPLITDUPLEX
    up = sg.LinkInRoute.Direction.UP
    hosts: list = [None] * nranks

    def leaf(zone, coord, ident):
        z = zone.add_netzone_star(f"node{ident}")
        gateway = z.add_host(f"nic{ident}", 1e9).seal()
        z.set_gateway(gateway.netpoint)
        nic = z.add_split_duplex_link(f"nic{ident}", nic_bw).set_latency(alpha / 2).seal()
        z.add_route(gateway, None, [sg.LinkInRoute(nic, up)], True)
        for local in range(per_node):
            rank = ident * per_node + local
            host = z.add_host(f"rank{rank}", 1e9).seal()
            link = z.add_split_duplex_link(f"mem{rank}", 1.0 / node.beta)
            link.set_latency(node.alpha / 2).seal()
            z.add_route(host, None, [sg.LinkInRoute(link, up)], True)
            hosts[rank] = host
        z.seal()
        return z

    down1 = 1 << (nodes.bit_length() - 1) // 2  # leaves per edge switch: about sqrt(M)
    down2 = nodes // down1
    if down1 * down2 != nodes:
        down1, down2 = 1, nodes
    root = engine.netzone_root
    tree = root.add_netzone_fatTree("fabric", 2, [down1, down2], [1, down1], [1, 1],
                                    nic_bw, 0.0, duplex)  # fmt: skip
    tree.set_netzone_cb(leaf).seal()
    root.seal()

    results = []
    for nbytes in job["sizes"]:
        for name in job["names"]:
            ranks = _rows(name, nranks, nodes, per_node, nbytes, costs, job["rails"])
            if ranks is None:
                results.append((name, nbytes, None))
                continue
            finished = [0.0] * nranks
            start = engine.clock

            def actor(rank, before, rows, after, finished=finished):
                sg.this_actor.sleep_for(before)
                for to, sbytes, frm, rbytes, reduces in rows:
                    sent = None
                    if to >= 0:
                        sent = sg.Mailbox.by_name(f"{rank}>{to}").put_async(rank, max(sbytes, 1))
                    if frm >= 0:
                        sg.Mailbox.by_name(f"{frm}>{rank}").get()
                        if reduces and rbytes:
                            sg.this_actor.sleep_for(rbytes * node.gamma)
                    if sent is not None:
                        sent.wait()
                sg.this_actor.sleep_for(after)
                finished[rank] = sg.Engine.clock

            for rank, plan in enumerate(ranks):
                if plan is not None:
                    sg.Actor.create(f"{name}-{nbytes}-{rank}", hosts[rank], actor, rank, *plan)
            engine.run()
            results.append((name, nbytes, max(finished) - start))
    return results


# SimGrid's network model as the alpha-beta model reads: a message of n bytes takes its
# route's latency plus n / its narrowest bandwidth, shared by the flows that cross a
# link the same way (no latency or bandwidth factors, no TCP window, no ACK traffic).
_CONFIG = ("--cfg=network/model:CM02", "--cfg=network/TCP-gamma:0",
           "--cfg=network/crosstraffic:0", "--log=root.thres:critical")  # fmt: skip
_FIELDS = frozenset(f for f in tuning.Costs.__dataclass_fields__ if f != "extra")


if __name__ == "__main__":
    print(json.dumps(_run(json.loads(sys.stdin.read()))))
    sys.stdout.flush()
    os._exit(0)  # SimGrid's engine has no teardown to wait for
