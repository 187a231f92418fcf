"""A new engine algorithm in one file, from outside the package: the pairwise exchange,
as an all-reduce and as a reduce-scatter.

Reduce-scatter: in step s = 1 .. N-1 rank r sends its own chunk (r + s) to that
chunk's owner, rank r + s, and reduces the chunk rank r - s sends it into its
own chunk r (so every send reads an input chunk no step has changed). All-gather:
in step s rank r sends its finished chunk r to rank r + s and stores chunk r - s.
2(N-1) steps and the ring's 2(N-1)/N of the buffer per rank, but a new partner
every step. Its cost has a constant of its own, ``pairwise_step``, whose
default (a second a step) keeps auto from choosing it unless a tuning file says
otherwise. The reduce-scatter is the first phase alone, on blocks of any counts
(MPI_Reduce_scatter's layout: rank r finishes block r).
"""

from __future__ import annotations

import functools
import itertools
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


@functools.lru_cache(maxsize=16)
def pairwise_reduce_scatter(counts: tuple[int, ...]):
    """Pairwise exchange's reduce-scatter: in step s rank r sends block r + s to its owner."""
    bounds = list(itertools.accumulate(counts, initial=0))

    def build(nranks: int, rank: int, count: int, itemsize: int = 1) -> Plan:
        rows = Rows(nranks, rank)
        for s in range(1, nranks):
            to, frm = (rank + s) % nranks, (rank - s) % nranks
            action = REDUCE | (FINAL if s == nranks - 1 else 0)
            rows.add("pairwise-reduce", s - 1, (to, bounds[to], counts[to]),
                     (frm, bounds[rank], counts[rank]), action)  # fmt: skip
        return rows.plan(count)

    return build


def reduce_scatter_terms(n: float, p: int, nodes: int = 1, per_node: int = 1):
    """(p-1) pairwise_step + n(p-1)/p (beta + gamma)."""
    if p <= 1:
        return {"call": 1.0}
    part = n * (p - 1) / p
    return {"call": 1.0, "pairwise_step": p - 1.0, "beta": part, "gamma": part}


@contextmanager
def registered():
    """The algorithms registered inside a ``with`` block only."""
    register(NAME, plan=pairwise, terms=terms, constants={"pairwise_step": 1.0},
             no_half="each step rounds the partial chunk to 16 bits")  # fmt: skip
    register(NAME, collective="reduce_scatter", plan=pairwise_reduce_scatter,
             terms=reduce_scatter_terms, constants={"pairwise_step": 1.0},
             no_half="each step rounds the partial block to 16 bits")  # fmt: skip
    try:
        yield
    finally:
        unregister(NAME)
        unregister(NAME, "reduce_scatter")
