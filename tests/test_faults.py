"""Faults under mpirun, for real (this file itself runs without MPI): a rank killed
mid-collective, a rank that raises, a rank that never arrives, for every algorithm.

Each job ends with a non-zero status, within RINGMPI_TIMEOUT plus a few seconds
of the fault, and its output names the culprit: the RingMPIError of a rank that
waited for it (ringmpi.tools.reliability runs the jobs; docs/reliability.md has the
measured table).
"""

from __future__ import annotations

import pytest

from ringmpi.tools import reliability, shm

# What "a few seconds" is: the launcher tearing the job down on 2 cores.
GRACE = 5.0
# The three ways a job meets its MPI family (its messages, its shared windows, the
# library's own collective): these run under every family (make test-family).
FAMILY_CASES = ("ring", "shared_memory", "mpi")


@pytest.mark.parametrize("fault", reliability.FAULTS)
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.family) if c in FAMILY_CASES
                                  else c for c in reliability.ALGORITHMS])  # fmt: skip
def test_fault_ends_the_job_and_names_the_rank(case, fault):
    before = shm.names()
    o = reliability.launch(case, fault)
    # the segments of the ranks it killed went with the job
    assert shm.stale(among=shm.names() - before) == []
    if fault != "kill":  # an abort: the failing rank removed them itself
        assert o.left == [], f"the aborted job left {o.left} in /dev/shm"
    assert o.returncode is not None, f"the job hung: {o.message}"
    assert o.returncode != 0, o.message
    if fault == "kill":  # the launcher's report: MPICH's may name another process it reaped
        assert o.named or "signal 9" in o.message or "Killed" in o.message, o.message
    else:
        assert o.named, f"no line names rank {reliability.CULPRIT}: {o.message}"
    waited = reliability.TIMEOUT if fault == "sleep" else 0.0
    assert o.seconds < waited + GRACE, f"{o.seconds:.1f} s after the fault: {o.message}"
    if fault == "sleep":  # only the timeout can end it, so not before it
        assert o.seconds >= reliability.TIMEOUT, o.message
        assert "(timeout)" in o.message
