"""The latency algorithms: few steps for small buffers (plans in :mod:`ringmpi.plans`).

* ``recursive_doubling``: lg p steps, each swapping and reducing the whole
  buffer with the partner ``rank xor 2^k``; lg p buffers sent per rank.
* ``rabenseifner``: reduce-scatter by recursive halving, then all-gather by
  recursive doubling: 2 lg p steps and the ring's 2(p-1)/p buffers.

Both fold a non-power-of-two N onto the largest power of two p <= N (two
extra steps for the first 2(N - p) ranks). Both run in the compiled step
engine; ``auto`` picks them for small buffers by the cost model.
"""

from __future__ import annotations

import numpy as np

from .. import _engine
from .._comm import Context
from ..kernels import Reduction
from . import register


@register("recursive_doubling", plan="recursive_doubling")
def recursive_doubling_allreduce(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """Recursive doubling: lg p steps swapping and reducing whole buffers."""
    _engine.run(ctx.plan("recursive_doubling", work.size), work, red, ctx, "recursive_doubling",
                source=source)  # fmt: skip


@register("rabenseifner", plan="rabenseifner")
def rabenseifner_allreduce(
    work: np.ndarray, red: Reduction, ctx: Context, source: np.ndarray | None = None
) -> None:
    """Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling."""
    _engine.run(ctx.plan("rabenseifner", work.size), work, red, ctx, "rabenseifner",
                source=source)  # fmt: skip
