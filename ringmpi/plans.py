"""Plans: one rank's steps as a table the step engine carries out, and their simulator.

A **plan** is one rank's steps, one row each, in order. In a row the rank
sends ``SEND_LEN`` elements from ``SEND_OFF`` of its buffer to rank
``SEND_TO`` and receives ``RECV_LEN`` elements from rank ``RECV_FROM``, which
it stores at ``RECV_OFF`` or reduces into the elements there (``ACTION``); -1
means no send or no receive in that row. Each algorithm builds its own plan
with :class:`Rows` (a pure function of ranks, rank, count and itemsize, its
record's ``plan``); the engine (:mod:`ringmpi._engine`) only carries plans
out, and :func:`simulate` runs every rank's plan without MPI to check them and
to count their cost.

Every reduce combines the two operands in one order on both partners (the
lower-numbered partner's operand first, ``THEIRS_FIRST`` on the higher one),
and every finished element is then only copied, so the result is bitwise the
same on every rank.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Plan", "Rows", "Simulated", "check_rank", "simulate"]

# The columns of a plan's table.
PHASE, STEP, SEND_TO, SEND_OFF, SEND_LEN, RECV_FROM, RECV_OFF, RECV_LEN, ACTION = range(9)
COLUMNS = 9
# ACTION: store what arrives, or reduce it into the elements there; flags on REDUCE:
STORE, REDUCE = 0, 1
THEIRS_FIRST = 2  # the received operand is the left one: ``acc = inp (op) acc``
FINAL = 4  # these elements are complete after this reduce (AVG divides them here)
# The half types' direct exchange (the ring's, ringmpi.algorithms.ring.direct_exchange):
FROM_INPUT = 8  # the send reads this rank's input where it lies, not the working buffer
TO_SLOTS = 16  # the receive lands in the slots: RECV_OFF counts from the plan's count on
FOLD = 32  # each arrived segment completes elements of this rank's chunk: fold them
# The reduce's own operand is this rank's input where it lies, not the working buffer:
# ``acc = input (op) received`` (a reduce-scatter alone copies nothing in first).
OWN_FROM_INPUT = 64


@dataclass(frozen=True, eq=False)  # a plan is itself: equal and hashed by identity
class Plan:
    """One rank's steps (``table``, int64, one row per step) for a buffer of
    ``count`` elements, and the phase names that column ``PHASE`` indexes. A plan
    whose rows FOLD also says where each rank's contribution to the chunk it
    finishes starts (``starts``, rank order: below the count in the input, from it
    on in the slots) and where that chunk starts (``chunk``)."""

    table: np.ndarray
    phases: tuple[str, ...]
    count: int
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    chunk: int = 0

    @property
    def steps(self) -> int:
        return len(self.table)


class Rows:
    """A plan being built, row by row (phases named, numbered in order of use)."""

    def __init__(self, nranks: int, rank: int) -> None:
        check_rank(nranks, rank)
        self.rows: list[list[int]] = []
        self.phases: list[str] = []

    def add(self, phase: str, step: int, send=(-1, 0, 0), recv=(-1, 0, 0), action=STORE):
        if phase not in self.phases:
            self.phases.append(phase)
        self.rows.append([self.phases.index(phase), step, *send, *recv, action])

    def plan(self, count: int, **fold) -> Plan:
        table = np.array(self.rows, np.int64).reshape(-1, COLUMNS)
        return Plan(table, tuple(self.phases), count, **fold)


def check_rank(nranks: int, rank: int) -> None:
    """ValueError unless ``rank`` is one of ``nranks`` ranks (every builder's first check)."""
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} is not one of {nranks} ranks")


@dataclass
class Simulated:
    """What :func:`simulate` counted: per rank, bytes sent, messages and serial steps
    (rows); and per rank and element the expression it ends with: a rank number,
    or (left, right) for a reduce, left the operand first."""

    bytes_sent: list[int]
    messages: list[int]
    steps: list[int]
    results: list[list] = field(default_factory=list, repr=False)
    # per rank and element, the ranks whose contributions it holds at the end
    held: list[list[frozenset]] = field(default_factory=list, repr=False)


def simulate(build, nranks: int, count: int, itemsize: int = 1, complete: bool = True) -> Simulated:
    """Run every rank's plan ``build(nranks, rank, count, itemsize)`` without MPI, each
    element a set of contributions and the expression that combines them
    (``complete=False``: plans of a part, which leave elements unfinished).

    A row's sends leave when the row starts; its receive completes when the
    matching message (the next one from that peer, in order) is there. Raises
    AssertionError if the plans deadlock, a message's length differs from what
    its receiver expects, a reduce would count a contribution twice, or any
    rank ends without every contribution in every element.

    Elements that no row's bounds separate go through every step alike: they are
    simulated as one run each (and one by one where a message's runs would not
    line up with its receiver's).
    """
    plans = [build(nranks, r, count, itemsize) for r in range(nranks)]
    cuts = {0, count}
    for p in plans:
        t = p.table
        for off, n in ((SEND_OFF, SEND_LEN), (RECV_OFF, RECV_LEN)):
            cuts.update(int(c) for c in t[:, off])
            cuts.update(int(c) for c in t[:, off] + t[:, n])
    bounds = sorted(c for c in cuts if 0 <= c <= count)
    try:
        return _simulate(plans, nranks, count, itemsize, complete, bounds)
    except _MisalignedError:
        return _simulate(plans, nranks, count, itemsize, complete, list(range(count + 1)))


class _MisalignedError(Exception):
    """A message's runs do not line up with its receiver's (simulate per element)."""


def _simulate(plans, nranks, count, itemsize, complete, bounds) -> Simulated:
    runs = len(bounds) - 1
    length = [bounds[k + 1] - bounds[k] for k in range(runs)]
    at = {c: k for k, c in enumerate(bounds)}  # element -> the run that starts there

    def span(off: int, n: int) -> range:
        if n == 0:
            return range(0)
        if off not in at or off + n not in at:
            raise _MisalignedError
        return range(at[off], at[off + n])

    held = [[frozenset([r])] * runs for r in range(nranks)]
    exprs: list[list] = [[r] * runs for r in range(nranks)]
    queues: dict[tuple[int, int], deque] = {}
    row_of = [0] * nranks
    posted = [False] * nranks
    sent = Simulated([0] * nranks, [0] * nranks, [0] * nranks)
    while True:
        moved = False
        for r in range(nranks):
            table = plans[r].table
            if row_of[r] == len(table):
                continue
            row = table[row_of[r]]
            if not posted[r]:
                if row[SEND_TO] >= 0:
                    ks = span(int(row[SEND_OFF]), int(row[SEND_LEN]))
                    data = [(length[k], held[r][k], exprs[r][k]) for k in ks]
                    queues.setdefault((r, int(row[SEND_TO])), deque()).append(data)
                    sent.bytes_sent[r] += int(row[SEND_LEN]) * itemsize
                    sent.messages[r] += 1
                    sent.steps[r] += 1
                posted[r] = True
                moved = True
            if row[RECV_FROM] >= 0:
                q = queues.get((int(row[RECV_FROM]), r))
                if not q:
                    continue
                data = q.popleft()
                got_n = sum(n for n, _, _ in data)
                assert got_n == row[RECV_LEN], (
                    f"rank {r} row {row_of[r]}: got {got_n} elements, expects {row[RECV_LEN]}"
                )
                ks = span(int(row[RECV_OFF]), int(row[RECV_LEN]))
                if [length[k] for k in ks] != [n for n, _, _ in data]:
                    raise _MisalignedError
                for k, (_, got, expr) in zip(ks, data, strict=True):
                    if row[ACTION] & REDUCE:
                        if row[ACTION] & OWN_FROM_INPUT:  # the input, whatever work holds
                            held[r][k], exprs[r][k] = frozenset([r]), r
                        assert not (held[r][k] & got), f"rank {r}: element {bounds[k]} twice"
                        held[r][k] = held[r][k] | got
                        mine = exprs[r][k]
                        theirs_first = row[ACTION] & THEIRS_FIRST
                        exprs[r][k] = (expr, mine) if theirs_first else (mine, expr)
                    else:
                        held[r][k] = got
                        exprs[r][k] = expr
                if row[SEND_TO] < 0:
                    sent.steps[r] += 1
            row_of[r] += 1
            posted[r] = False
            moved = True
        if all(row_of[r] == len(plans[r].table) for r in range(nranks)):
            break
        assert moved, f"the plans deadlock at rows {row_of}"
    everyone = frozenset(range(nranks))
    for r in range(nranks if complete else 0):
        missing = [bounds[k] for k in range(runs) if length[k] and held[r][k] != everyone]
        assert not missing, f"rank {r} ends without every contribution in elements {missing[:5]}"
    assert all(not q for q in queues.values()), "messages left unreceived"

    def per_element(values: list) -> list:
        return [v for k, v in enumerate(values) for _ in range(length[k])]

    sent.results = [per_element(e) for e in exprs]
    sent.held = [per_element(h) for h in held]
    return sent


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
