"""Data-parallel training of a small MLP on scikit-learn's digits, gradients through ringmpi.

::

    mpirun -n 4 python examples/train_digits.py              # float64 gradients
    mpirun -n 4 python examples/train_digits.py --bfloat16   # bfloat16 on the wire

Every rank holds the whole model (64 -> 32 tanh -> 10 softmax, float64) and
starts from the same weights (the same seed). Each step takes the next global
batch of ``--batch`` images from a permutation that every rank draws alike;
rank r works on its shard, ``np.array_split(batch, N)[r]`` (shards may differ
by one image). Each rank computes the *sum* over its shard of the per-image
gradients; ``ringmpi.allreduce_many`` sums those over the ranks -- the four
parameter gradients and the loss in one or two fused collectives -- and every
rank divides by the global batch size. That is the gradient of the mean loss
over the whole global batch, the same one process computes: op=SUM, then one
division, not op=AVG, whose mean of per-rank means would weigh a short shard's
images more. Every rank then applies the same update to the same bits, so the
ranks' weights stay bitwise identical (ringmpi gives every rank the same bits).

``--bfloat16`` sends the gradient sums as bfloat16 (``ml_dtypes.bfloat16``):
half the bytes of float32, a quarter of float64; ringmpi adds them in float32
and rounds once, and each rank widens the result back to float64 for the
update.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from ml_dtypes import bfloat16 as bf16
from mpi4py import MPI
from sklearn.datasets import load_digits  # the data ship inside scikit-learn

import ringmpi

HIDDEN, CLASSES = 32, 10


def load() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 8x8 digits as rows of 64 pixels in [0, 1], and their labels."""
    data = load_digits()
    return data.data / 16.0, data.target


def init(rng: np.random.Generator, features: int = 64) -> list[np.ndarray]:
    """W1, b1, W2, b2: Glorot-scaled normal weights, zero biases."""
    return [
        rng.standard_normal((features, HIDDEN)) * np.sqrt(2.0 / (features + HIDDEN)),
        np.zeros(HIDDEN),
        rng.standard_normal((HIDDEN, CLASSES)) * np.sqrt(2.0 / (HIDDEN + CLASSES)),
        np.zeros(CLASSES),
    ]


def forward(params: list[np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w1, b1, w2, b2 = params
    hidden = np.tanh(x @ w1 + b1)
    logits = hidden @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    return hidden, p


def gradient_sums(
    params: list[np.ndarray], x: np.ndarray, y: np.ndarray
) -> tuple[list[np.ndarray], float]:
    """The sums over the images of ``x`` of each parameter's gradient of the
    cross-entropy, and the summed loss."""
    w2 = params[2]
    hidden, p = forward(params, x)
    rows = np.arange(len(y))
    loss = -np.log(p[rows, y]).sum()
    d_logits = p
    d_logits[rows, y] -= 1.0
    d_hidden = (d_logits @ w2.T) * (1.0 - hidden**2)
    grads = [x.T @ d_hidden, d_hidden.sum(axis=0), hidden.T @ d_logits, d_logits.sum(axis=0)]
    return grads, float(loss)


def train(
    comm: MPI.Intracomm,
    steps: int = 200,
    batch: int = 100,
    lr: float = 0.5,
    bfloat16: bool = False,
    seed: int = 0,
    log: bool = False,
) -> tuple[list[np.ndarray], list[float]]:
    """Train on ``comm``'s ranks; returns the weights and the mean loss of each step."""
    x, y = load()
    rank, size = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(seed)  # the same draws on every rank
    params = init(rng, x.shape[1])
    per_epoch = len(x) // batch
    losses = []
    for step in range(steps):
        if step % per_epoch == 0:
            order = rng.permutation(len(x))
        global_batch = order[(step % per_epoch) * batch : (step % per_epoch + 1) * batch]
        shard = np.array_split(global_batch, size)[rank]
        grads, loss = gradient_sums(params, x[shard], y[shard])
        grads.append(np.array([loss]))
        if bfloat16:
            wire = [g.astype(bf16) for g in grads]
            ringmpi.allreduce_many(wire, MPI.SUM, comm)
            grads = [w.astype(np.float64) for w in wire]
        else:
            ringmpi.allreduce_many(grads, MPI.SUM, comm)
        for p, g in zip(params, grads, strict=False):  # the loss is not a parameter
            p[...] -= (lr / batch) * g
        losses.append(float(grads[-1][0]) / batch)
        if log and rank == 0 and (step % 50 == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.4f}", flush=True)
    return params, losses


def accuracy(params: list[np.ndarray]) -> float:
    x, y = load()
    return float((forward(params, x)[1].argmax(axis=1) == y).mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (300)")
    p.add_argument("--batch", type=int, default=100, help="global batch size (100)")
    p.add_argument("--lr", type=float, default=0.5, help="learning rate (0.5)")
    p.add_argument("--bfloat16", action="store_true", help="bfloat16 gradients on the wire")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="FILE.npz", help="rank 0 saves the weights here")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    ringmpi.abort_on_error()  # one failing rank ends the job instead of hanging it
    params, _ = train(comm, args.steps, args.batch, args.lr, args.bfloat16, args.seed, log=True)
    # Every rank holds the very same bits: compare them with rank 0's (a check).
    mine = b"".join(w.tobytes() for w in params)
    same = comm.allreduce(mine == comm.bcast(mine), MPI.LAND)
    if comm.Get_rank() == 0:
        print(f"ranks {comm.Get_size()}, training accuracy {accuracy(params):.4f}, "
              f"weights identical on every rank: {bool(same)}")  # fmt: skip
        if args.out:
            np.savez(args.out, *params)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
