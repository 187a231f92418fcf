"""Identical calls give identical bits from the first call on: auto's tuner, which
times candidates in a size class's first calls, never changes what a call returns.

Random floats (not the small integers of the exactness tests, which every order
sums exactly) on an untuned communicator: the same call again and again, through
the tuner's trials, its lead's calls between them and after it settled, must
return the first call's bits on every rank. Where the candidates would differ
(floating sums at three ranks and more), the tuner does not run and the model's
pick stands.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

import ringmpi
from ringmpi.algorithms import tuner

pytestmark = pytest.mark.mpi
WORLD = MPI.COMM_WORLD


@pytest.fixture
def comm():
    c = WORLD.Dup()  # a new communicator: auto starts untuned on it
    yield c
    c.Free()


@pytest.mark.parametrize("nbytes", [8, 64 << 10, 1 << 20, 16 << 20])
@pytest.mark.parametrize(("op", "dtype"), [(MPI.SUM, np.float64), (MPI.SUM, np.float32),
                                           (MPI.MAX, np.float64)])  # fmt: skip
@pytest.mark.parametrize("spacing", [0, 3])  # the trials back to back, or the lead's between
def test_identical_calls_give_identical_bits_from_the_first_on(settings, comm, nbytes, op, dtype,
                                                              spacing):  # fmt: skip
    settings(tuner="memory", spacing=spacing)  # no file: the trials run in these very calls
    rng = np.random.default_rng(1000 + comm.rank)
    x = (rng.standard_normal(nbytes // np.dtype(dtype).itemsize) * 1e3).astype(dtype)
    x[::7] *= 1e-6  # magnitudes far apart: each order of the sum rounds differently
    out = np.empty_like(x)
    calls = (1 + spacing) * tuner.most_trial_calls(nbytes) + 2  # the trials, the lead's, the winner
    problems, first = [], None
    with ringmpi.trace() as t:
        for i in range(calls):
            if t.tuned and t.tuned[0].call < i - 2:  # settled (on every rank at once): done
                break
            ringmpi.Allreduce(x, out, op, comm)
            if first is None:
                first = out.tobytes()
            elif out.tobytes() != first:
                ran = t.ran[-1] if t.ran else "?"
                problems.append(f"call {i} ({ran}) returned other bits than call 0")
                break
    agree(comm, problems)
    assert len(set(comm.allgather(first))) == 1, "the ranks' results differ"
    red = ringmpi.kernels.reduction(op, np.dtype(dtype))
    if comm.size == 2 and op is MPI.SUM:  # one addition an element: the tuner ran
        assert t.trials and len(t.tuned) == 1
    elif comm.size > 1:  # other bits in another order: the model's pick, untried
        assert (t.trials, t.tuned) == ([], [])
        assert not ringmpi.algorithms.answers_agree(red, comm.size)
