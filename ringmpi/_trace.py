"""Counted traffic: what this rank really sent, recorded where the sends happen."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["Event", "Span", "Trace", "TrialCall", "Tuned", "open_here", "recording_for", "trace"]


@dataclass(frozen=True)
class Event:
    """What this rank sent in one step to one peer."""

    call: int  # which call inside the trace block, from 0
    algorithm: str
    phase: str
    step: int
    peer: int  # the destination rank in the communicator the call was given
    nbytes: int
    messages: int = 1  # MPI messages it took (a step sends its chunk in segments)


@dataclass(frozen=True)
class Span:
    """When one step ran on this rank: a row of a plan (its send, its receive and the
    reduce of what arrived), or a phase through the node's shared memory.

    ``start`` and ``end`` are this rank's monotonic clock in nanoseconds (on one host
    the ranks share it); ``reducing`` is the part of it spent reducing (the sum over
    the step's segments, which overlap its messages); a peer of -1: none."""

    call: int
    algorithm: str
    phase: str
    step: int
    start: int
    end: int
    sent_to: int = -1
    nbytes: int = 0
    received_from: int = -1
    reducing: int = 0
    shared: bool = False  # through the node's shared memory, not a message


@dataclass(frozen=True)
class TrialCall:
    """One call that auto's tuner ran as a trial (:mod:`ringmpi._tuner`)."""

    call: int
    # bytes in [2**(|size_class|-1), 2**|size_class|); negative: the reductions the
    # library's call may not run (ringmpi.algorithms.library_agrees), tuned apart
    size_class: int
    algorithm: str
    seconds: float  # this rank's time of the call
    timed: bool  # False: the candidate's untimed first call


@dataclass(frozen=True)
class Tuned:
    """A size class the tuner settled: the winner and the agreed (slowest rank's
    median) seconds of every candidate."""

    call: int
    size_class: int
    algorithm: str
    seconds: dict[str, float]


@dataclass
class Trace:
    """The sends of every ringmpi call made inside a :func:`trace` block, on this rank."""

    events: list[Event] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)  # when each step ran
    calls: int = 0
    # What each call ran, in call order: an algorithm's name, "mpi" for the library's
    # own collective (whose traffic ringmpi cannot see).
    ran: list[str] = field(default_factory=list)
    # The hierarchical algorithm's shared-memory phase: bytes this rank stored to
    # and loaded from the node's window (no messages there).
    shared_written: int = 0
    shared_read: int = 0
    # Auto's tuner: the calls it ran as trials, and the classes it settled.
    trials: list[TrialCall] = field(default_factory=list)
    tuned: list[Tuned] = field(default_factory=list)

    @property
    def bytes_sent(self) -> int:
        return sum(e.nbytes for e in self.events)

    @property
    def messages(self) -> int:
        return sum(e.messages for e in self.events)

    @property
    def steps(self) -> int:
        """Serial steps: the distinct (call, phase, step) in which this rank sent."""
        return len({(e.call, e.phase, e.step) for e in self.events})


# The traces open on this rank, in any thread: empty almost always, so the hot path
# pays one truth test per step. What a thread records goes to its own (_mine): the
# traces it opened, or, on a progress thread, those open where its call started.
_active: list[Trace] = []
_local = threading.local()


def _mine() -> list[Trace]:
    found = getattr(_local, "traces", None)
    if found is None:
        found = _local.traces = []
    return found


def record(
    algorithm: str, phase: str, step: int, peer: int, nbytes: int, messages: int = 1
) -> None:
    """Record what one step sent to one peer (called by the algorithms)."""
    for t in _mine():
        t.events.append(Event(t.calls - 1, algorithm, phase, step, peer, nbytes, messages))


def record_span(algorithm: str, phase: str, step: int, start: int, end: int, *,
                sent_to: int = -1, nbytes: int = 0, received_from: int = -1,
                reducing: int = 0, shared: bool = False) -> None:  # fmt: skip
    """Record when one step ran (monotonic ns; an end before the start, as a failed
    step leaves it, is taken as the start)."""
    for t in _mine():
        t.spans.append(Span(t.calls - 1, algorithm, phase, step, start, max(start, end), sent_to,
                            nbytes, received_from, reducing, shared))  # fmt: skip


def record_shared(written: int, read: int) -> None:
    """Record one call's traffic through node shared memory (stores and loads, bytes)."""
    for t in _mine():
        t.shared_written += written
        t.shared_read += read


def record_trial(size_class: int, algorithm: str, seconds: float, timed: bool) -> None:
    """Record one trial call of auto's tuner."""
    for t in _mine():
        t.trials.append(TrialCall(t.calls - 1, size_class, algorithm, seconds, timed))


def record_tuned(size_class: int, algorithm: str, seconds: dict[str, float]) -> None:
    """Record a size class the tuner settled."""
    for t in _mine():
        t.tuned.append(Tuned(t.calls - 1, size_class, algorithm, dict(seconds)))


def record_call(algorithm: str) -> None:
    """Mark the start of a call that runs ``algorithm`` (the API does this once per
    collective, for what it really runs)."""
    for t in _mine():
        t.calls += 1
        t.ran.append(algorithm)


@contextmanager
def trace() -> Iterator[Trace]:
    """Count the messages, bytes and steps of the ringmpi calls made inside the block.

    >>> with ringmpi.trace() as t:
    ...     ringmpi.Allreduce(MPI.IN_PLACE, x)
    >>> t.bytes_sent, t.messages, t.steps
    """
    t = Trace()
    _active.append(t)
    _mine().append(t)
    try:
        yield t
    finally:
        _mine().remove(t)
        _active.remove(t)


def open_here() -> list[Trace]:
    """The traces open in this thread (a nonblocking call records into these)."""
    return list(_mine()) if _active else []


@contextmanager
def recording_for(traces: Sequence[Trace]) -> Iterator[None]:
    """Record this thread's calls into ``traces`` (those open where a nonblocking call
    started), and into no other, for the block."""
    before = _mine()
    if not traces and not before:
        yield
        return  # this thread's own (the caller's, where no thread carries it out)
    _local.traces = list(traces)
    _active.extend(traces)
    try:
        yield
    finally:
        for t in traces:
            _active.remove(t)
        _local.traces = before
