"""``mpirun -n N python -m ringmpi tune``: measure the cost model's constants here.

Times every algorithm ``auto`` chooses among at sizes from ``-b`` to ``-e``
(interleaved, median of the slowest rank's times), then fits the constants of
:mod:`ringmpi.tuning` to them by least squares on relative error (so that
8 bytes counts as much as 64 MiB): alpha, beta, gamma and the per-call cost
from the ring and the latency algorithms, the node-phase constants from the
hierarchical algorithm. Writes them, with every measurement and its
prediction, as JSON for ``RINGMPI_TUNING``; the layout it was measured on is
recorded with them (rank count and nodes: the constants describe the links
and memory of that layout).
"""

from __future__ import annotations

import datetime
import json
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

from ringmpi import algorithms, tuning
from ringmpi._comm import context
from ringmpi._errors import abort_on_error
from ringmpi.algorithms.hierarchical import layout
from ringmpi.algorithms.registry import TermsFn
from ringmpi.kernels import reduction

from . import command_parser
from ._units import whole

__all__ = ["fit", "main", "measure"]

_ENGINE = ("ring", "recursive_doubling", "rabenseifner")
_ENGINE_TERMS = ("call", "alpha", "beta", "gamma")
_NODE_TERMS = ("node_call", "node_step", "node_byte")
_SHM_TERMS = ("shm_wait", "shm_byte")


def measure(comm: MPI.Intracomm, sizes: list[int], iters: int, budget: float) -> list[dict]:
    """Median seconds (slowest rank) of every candidate and the MPI baseline per size."""
    red = reduction(MPI.SUM, np.float32)
    red.warm()
    algorithms.warm(red)
    out = []
    names = [*algorithms.usable(context(comm)), "mpi"]
    for size in sizes:
        count = max(1, size // 4)
        send = np.ones(count, np.float32)
        recv = np.empty_like(send)
        times: dict[str, list[float]] = {a: [] for a in names}
        # Two warm-up calls each, then interleaved rounds within the budget.
        for name in names:
            for _ in range(2):
                algorithms.get(name).run(recv, red, context(comm), send)
        deadline = time.perf_counter() + budget
        for i in range(iters):
            # Each round starts with the next algorithm: a call finds the caches as the
            # one before it left them, so no algorithm always follows the same one.
            for name in names[i % len(names) :] + names[: i % len(names)]:
                algo = algorithms.get(name)
                comm.Barrier()
                t0 = time.perf_counter()
                algo.run(recv, red, context(comm), send)
                times[name].append(time.perf_counter() - t0)
            if comm.allreduce(time.perf_counter() > deadline and i >= 2, op=MPI.LOR):
                break
        for name in names:
            slowest = np.asarray(times[name])
            comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
            out.append(
                {"algorithm": name, "bytes": count * 4, "seconds": float(np.median(slowest))}
            )
    return out


def _solve(rows: list[tuple[dict[str, float], float, float]], names: tuple[str, ...]):
    """Least squares on relative error, every constant >= 0 (a negative one is dropped).

    A row is (terms, measured seconds, seconds already accounted for by constants
    fitted before): the constants ``names`` are to explain the rest, each row's
    error relative to its whole measured time (so a small size whose time the
    known part nearly covers weighs no more than any other).
    """
    active = list(names)
    while True:
        a = np.array([[t.get(k, 0.0) / y for k in active] for t, y, _ in rows])
        b = np.array([1.0 - known / y for _, y, known in rows])
        x, *_ = np.linalg.lstsq(a, b, rcond=None)
        if (x >= 0).all() or len(active) == 1:
            found = dict(zip(active, np.maximum(x, 0.0), strict=True))
            return {k: float(found.get(k, 0.0)) for k in names}
        active.pop(int(np.argmin(x)))


def _terms(name: str) -> TermsFn:
    """Algorithm ``name``'s cost-model terms (every algorithm fitted here has them)."""
    terms = algorithms.get(name).terms
    assert terms is not None, name
    return terms


def fit(measured: list[dict], p: int, nodes: int, per_node: int) -> tuning.Costs:
    """The constants that best predict ``measured`` (see the module docstring)."""
    engine = [(_terms(m["algorithm"])(m["bytes"], p), m["seconds"], 0.0)
              for m in measured if m["algorithm"] in _ENGINE]  # fmt: skip
    first = _solve(engine, _ENGINE_TERMS)
    # (first's keys are _ENGINE_TERMS, float fields all: none is Costs.extra)
    partial = tuning.Costs(**first, **{k: 0.0 for k in _NODE_TERMS + _SHM_TERMS})  # type: ignore[arg-type]
    # hierarchical: the node phase over what its plan across nodes costs
    node_rows = []
    for m in measured:
        if m["algorithm"] == "hierarchical":
            t = _terms("hierarchical")(m["bytes"], p, nodes, per_node)
            across = algorithms.predict(partial, "hierarchical", m["bytes"], p, nodes, per_node)
            node_rows.append(({k: t.get(k, 0.0) for k in _NODE_TERMS}, m["seconds"], across))
    second = _solve(node_rows, _NODE_TERMS) if node_rows else {}
    # shared_memory: its own constants over the per-call cost fitted above
    shm_rows = []
    for m in measured:
        if m["algorithm"] == "shared_memory":
            t = _terms("shared_memory")(m["bytes"], p)
            shm_rows.append(({k: t[k] for k in _SHM_TERMS}, m["seconds"], first["call"]))
    third = _solve(shm_rows, _SHM_TERMS) if shm_rows else {}
    shm = {k: third.get(k, getattr(tuning.DEFAULTS, k)) for k in _SHM_TERMS}
    return tuning.Costs(**first, **{k: second.get(k, 0.0) for k in _NODE_TERMS}, **shm)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("tune", __doc__)
    parser.add_argument("-o", "--output", default="ringmpi-tuning.json", help="the JSON file")
    parser.add_sweep(8, 64 << 20, 4)
    parser.add_argument("-n", "--iters", type=whole(1), default=20, help="calls per size, at most")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per size, about")
    comm = MPI.COMM_WORLD
    abort_on_error(comm)
    args = parser.parse_args(argv)
    sizes = parser.sizes(args)
    if args.budget <= 0:
        parser.error(f"--budget {args.budget}: more than 0 seconds")
    ctx = context(comm)
    lay = layout(ctx)
    measured = measure(comm, sizes, args.iters, args.budget)
    costs = fit(measured, comm.Get_size(), lay.nodes, lay.slices)
    for m in measured:
        if m["algorithm"] != "mpi":
            m["predicted"] = algorithms.predict(costs, m["algorithm"], m["bytes"], comm.Get_size(),
                                                lay.nodes, lay.slices)  # fmt: skip
    if comm.Get_rank() == 0:
        lib = " ".join(MPI.Get_library_version().replace("\x00", "").split("\n")[0].split())
        result = {
            "costs": tuning.as_dict(costs),
            "layout": {"ranks": comm.Get_size(), "nodes": lay.nodes, "ranks_per_node": lay.slices},
            "host": socket.gethostname(),
            "date": datetime.date.today().isoformat(),
            "mpi_library": lib,
            "command": "python -m ringmpi tune " + " ".join(sys.argv[1:] if argv is None else argv),
            "measured": measured,
        }
        with open(args.output, "w") as fh:
            json.dump(result, fh, indent=1)
        print(f"# cost model constants, {comm.Get_size()} ranks on {lay.nodes} node(s):")
        for k, v in tuning.as_dict(costs).items():
            print(f"  {k:<10} {v:.3e} s")
        print(f"# {'bytes':>10} {'algorithm':>19} {'measured':>10} {'predicted':>10}   (us)")
        for m in measured:
            pred = f"{m['predicted'] * 1e6:10.1f}" if "predicted" in m else f"{'-':>10}"
            print(f"  {m['bytes']:>10} {m['algorithm']:>19} {m['seconds'] * 1e6:10.1f} {pred}")
        print(f"# written to {args.output}; use it with RINGMPI_TUNING={args.output}")
    return 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("tune")
