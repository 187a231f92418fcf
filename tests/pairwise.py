"""A new engine algorithm in one file, from outside the package: the pairwise exchange.

Reduce-scatter: in step s = 1 .. N-1 rank r sends its own chunk (r + s) to that
chunk's owner, rank r + s, and reduces the chunk rank r - s sends it into its
own chunk r (so every send reads an input chunk no step has changed). All-gather:
in step s rank r sends its finished chunk r to rank r + s and stores chunk r - s.
2(N-1) steps and the ring's 2(N-1)/N of the buffer per rank, but a new partner
every step. Its cost has a constant of its own, ``pairwise_step``, whose
default (a second a step) keeps auto from choosing it unless a tuning file says
otherwise.
"""

from __future__ import annotations

from contextlib import contextmanager

from ringmpi.algorithms import register, unregister
from ringmpi.plans import FINAL, REDUCE, STORE, Plan, Rows
from ringmpi.schedule import chunk_bounds

NAME = "pairwise"


def pairwise(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
    """Pairwise exchange: each chunk's owner reduces it, then sends it to every rank."""
    rows = Rows(nranks, rank)
    bounds = chunk_bounds(count, nranks)

    def chunk(c: int) -> tuple[int, int]:
        return bounds[c], bounds[c + 1] - bounds[c]

    for s in range(1, nranks):
        to, frm = (rank + s) % nranks, (rank - s) % nranks
        action = REDUCE | (FINAL if s == nranks - 1 else 0)
        rows.add("pairwise-reduce", s - 1, (to, *chunk(to)), (frm, *chunk(rank)), action)
    for s in range(1, nranks):
        to, frm = (rank + s) % nranks, (rank - s) % nranks
        rows.add("pairwise-gather", s - 1, (to, *chunk(rank)), (frm, *chunk(frm)), STORE)
    return rows.plan(count)


def terms(n: float, p: int, nodes: int = 1, per_node: int = 1) -> dict[str, float]:
    """2(p-1) pairwise_step + 2n(p-1)/p beta + n(p-1)/p gamma."""
    if p <= 1:
        return {"call": 1.0}
    return {"call": 1.0, "pairwise_step": 2.0 * (p - 1), "beta": 2 * n * (p - 1) / p,
            "gamma": n * (p - 1) / p}  # fmt: skip


@contextmanager
def registered():
    """The algorithm registered inside a ``with`` block only."""
    register(NAME, plan=pairwise, terms=terms, constants={"pairwise_step": 1.0},
             no_half="each step rounds the partial chunk to 16 bits")  # fmt: skip
    try:
        yield
    finally:
        unregister(NAME)
