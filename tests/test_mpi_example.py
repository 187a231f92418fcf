"""examples/train_digits.py: N ranks train the same weights as one process on the full batch.

The tolerance, 1e-12 on weights of magnitude up to about 1.5: with float64
gradients the N-rank run differs from the one-process run only in the order in
which the per-image gradients are summed (within each shard, then across the
ranks), a relative difference of a few times 1e-16 per step. Measured after 100
and 300 steps at 2-5 ranks: at most 7.8e-16. Any mistake in the math -- a
shard missed or counted twice, AVG of per-rank means on uneven shards (34/33/33
images at 3 ranks), a wrong divisor -- moves the weights by 1e-3 or more.
bfloat16 on the wire rounds each rank's gradient sums to 8 significant bits:
measured at most 9.6e-4 from the float64 weights after 300 steps, the tolerance
there is 5e-3. Either way every rank must hold bitwise the same weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import agree
from mpi4py import MPI

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

pytestmark = pytest.mark.mpi

WORLD = MPI.COMM_WORLD
STEPS = 100


@pytest.fixture(scope="module")
def train_digits():
    """The example, imported when a test runs (scikit-learn takes seconds to import:
    not at every collection of the suite, on every rank)."""
    pytest.importorskip("sklearn")
    sys.path.insert(0, str(EXAMPLES))
    import train_digits

    return train_digits


@pytest.fixture(scope="module")
def one_process(train_digits):
    """The weights one process reaches on the full global batches (no communication)."""
    params, losses = train_digits.train(MPI.COMM_SELF, steps=STEPS)
    return params, losses


def identical_on_every_rank(params) -> list[str]:
    mine = b"".join(w.tobytes() for w in params)
    everyone = WORLD.allgather(mine)
    return [] if all(b == everyone[0] for b in everyone) else ["weights differ between ranks"]


def farthest(params, reference) -> float:
    return max(float(np.abs(p - r).max()) for p, r in zip(params, reference, strict=True))


def test_n_ranks_reach_the_one_process_weights(train_digits, one_process):
    params, losses = train_digits.train(WORLD, steps=STEPS)
    reference, ref_losses = one_process
    problems = identical_on_every_rank(params)
    off = farthest(params, reference)
    if off > 1e-12:
        problems.append(f"weights {off:.3g} from the one-process weights")
    if not np.allclose(losses, ref_losses, rtol=1e-12, atol=0):
        problems.append("the losses differ from the one-process losses")
    if not losses[-1] < 0.25 * losses[0]:
        problems.append(f"did not learn: loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    agree(WORLD, problems)


def test_bfloat16_on_the_wire(train_digits, one_process):
    pytest.importorskip("ml_dtypes")
    params, _ = train_digits.train(WORLD, steps=STEPS, bfloat16=True)
    reference, _ = one_process
    problems = identical_on_every_rank(params)
    off = farthest(params, reference)
    if off > 5e-3:
        problems.append(f"weights {off:.3g} from the float64 weights")
    if train_digits.accuracy(params) < 0.95:
        problems.append(f"training accuracy {train_digits.accuracy(params)}")
    agree(WORLD, problems)
