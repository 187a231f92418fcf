"""A cold start compiles once per node: ringmpi.warm, and the first call of an algorithm."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi import algorithms, verify
from ringmpi._comm import context

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD


def test_warm_loads_every_algorithm_and_the_calls_after_it_are_exact():
    comm = WORLD.Dup()
    try:
        took = ringmpi.warm("float64", MPI.SUM, comm)
        assert took >= 0.0 and len(set(comm.allgather(took))) == 1  # the slowest rank's
        ctx = context(comm)
        names = {a.name for a in algorithms.records()}
        assert {(n, "sum", np.dtype("float64").str) for n in names} <= ctx.warmed
        x = verify.verify_inputs(MPI.SUM, "float64", comm.rank, 1000)
        got = ringmpi.allreduce(x, MPI.SUM, comm)
        agree(comm, [f"{verify.count_wrong(got, MPI.SUM, comm.size)} wrong"]
              if verify.count_wrong(got, MPI.SUM, comm.size) else [])  # fmt: skip
    finally:
        comm.Free()


def test_a_first_call_warms_its_algorithm_once(monkeypatch):
    comm = WORLD.Dup()
    seen = []
    real = algorithms.warm_on_node

    def counted(ctx, red, record=None, timeout=0.0):
        seen.append(record.name)
        return real(ctx, red, record, timeout)

    monkeypatch.setattr(algorithms, "warm_on_node", counted)
    try:
        x = verify.verify_inputs(MPI.MAX, "int32", comm.rank, 100)
        for _ in range(3):
            got = ringmpi.allreduce(x, MPI.MAX, comm, algorithm="ring")
        assert seen == ["ring"]
        assert ("ring", "max", np.dtype("int32").str) in context(comm).warmed
        assert not verify.count_wrong(got, MPI.MAX, comm.size)
    finally:
        comm.Free()


def test_warm_measures_the_tuners_evidence_once_per_layout(settings, monkeypatch):
    """With the tuner on, ringmpi.warm times auto's candidates and the library's call
    on buffers of tuner.CALIBRATED_FROM (tuner.calibrate): every one of them, the same
    seconds on every rank (the slowest's), once per process and layout."""
    from ringmpi.algorithms import tuner

    settings(tuner="memory")
    monkeypatch.setattr(tuner, "_measured", {})
    comm = WORLD.Dup()
    try:
        ringmpi.warm("float32", MPI.SUM, comm)
        ctx = context(comm)
        layout = (ctx.size, *ctx.nodes(ringmpi._settings.current()))
        if comm.size == 1:
            assert tuner._measured == {}  # one rank has nothing to choose
            return
        found = tuner._measured[layout]
        pool = {a.name for a in algorithms._fitting(ctx) if a.terms is None or a.auto}
        assert set(found) == pool and "mpi" in pool
        assert all(0 < v < 1 for v in found.values())  # seconds per byte
        assert len({tuple(sorted(found.items())) for found in comm.allgather(found)}) == 1
        ringmpi.warm("float32", MPI.SUM, comm)
        assert tuner._measured[layout] is found  # measured once
    finally:
        comm.Free()
