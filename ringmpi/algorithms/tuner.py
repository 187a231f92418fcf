"""Auto's online tuner: a size class's first calls time the candidates between the
calls of the one that leads, and every call after them runs the winner.

Auto's cost model ranks ringmpi's own algorithms; it cannot know what the MPI
library's own MPI_Allreduce costs on this machine, nor how far the model is off
here. So for each size class (the powers of two: a call of n bytes is in class
``n.bit_length()``), the model's best algorithm, the best of the other kind
(messages or the node's shared memory), the model's next
(:func:`ringmpi.algorithms.shortlist_of`) and the library's MPI_Allreduce (where it
gives ringmpi's answer: :func:`ringmpi.algorithms.library_agrees`; the others are
tuned apart, as class ``-n.bit_length()``) each make trial calls, once untimed and
then :func:`timed_calls` times (30 up to 64 KiB, 10 up to 4 MiB, 5 above), each call
timed on the path a repeated call takes. The class's incumbent (the model's best, a
near class's winner or the host's measured fastest) leads: the calls between the
trials run it, from compiled code, as many as keep what the trials cost beyond it
within a budget of its own time (below). Every trial is a real call, with its true
result.
After the last trial the ranks agree on the timings in one collective (the slowest
rank's median per candidate, an MPI_MAX), so that every rank keeps the same winner;
where one of ringmpi's own beat the library's call by less than SECOND_ROUND_MARGIN,
the two are timed again first (a second round), and the ranks decide on both rounds'
calls. From then on auto's choice for the class is one lookup, as it was before
tuning.

Trials time the node as it is. Where other work kept the node busy while they ran
(more threads runnable than the node has cores and ranks take, and one more, at
most of every fourth trial call: :func:`ringmpi._host.busy`, agreed in the same
collective), the winner holds for this run but is not written to the
file: the next run, on a quieter node, tries the class again. The
``oversubscribed`` setting, ``yes`` or ``no``, says the node's state is known:
then every winner is written.

The winners go to a cache file per machine, MPI library and layout (rank 0
writes it, atomically), so that the next run starts tuned; the layout names the
host (CPU model, last-level cache, cores: a machine name that moved to other
hardware, as a virtual machine may, is tuned again); rank 0 reads it at the
first auto call on a communicator and broadcasts what it holds. An entry older
than the ``retune_days`` setting, or made by another ringmpi version, is tried
again. The ``tuner`` setting (``RINGMPI_TUNER``): ``auto`` (the default: the
cache file in ``$XDG_CACHE_HOME/ringmpi``, else ``~/.cache/ringmpi``), a
directory to keep the file in, ``memory`` (tune, keep no file) or ``off`` (the
cost model alone, as :func:`ringmpi.algorithms.choose` ranks it).
"""

from __future__ import annotations

import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .. import __version__, _direct, _host, _progress, _settings, _trace, tuning
from .._comm import Context, library_allreduce
from .registry import STALE, Call, fits, get, names, prepared, repeats

__all__ = ["BUDGET_AHEAD", "CALIBRATED_FROM", "DROP", "GAP_MOST", "GAP_S", "LIBRARY_MARGIN",
           "NEAR", "ONE_TIME_S", "REMEMBERED_BELOW", "SECOND_ROUND_MARGIN", "SHORTLIST",
           "TIMED", "TRIAL_BUDGET", "TRIAL_S", "Lead", "Trial", "cache_file", "calibrate",
           "counted", "gap_most", "measured", "most_trial_calls", "timed_calls",
           "tuner"]  # fmt: skip

# Timed calls per candidate (after one untimed), by call size: small calls are
# cheap and noisy, so they take more samples. A function of the size alone, so
# that every rank runs the same number.
_TIMED = ((64 << 10, 30), (4 << 20, 10))
TIMED = 5  # above the last of _TIMED


def timed_calls(nbytes: int) -> int:
    """How many timed calls each candidate gets for a call of ``nbytes``."""
    return next((calls for upto, calls in _TIMED if nbytes <= upto), TIMED)


def most_trial_calls(nbytes: int, candidates: int | None = None) -> int:
    """The most trial calls a class makes (``candidates``, SHORTLIST and the library's
    call where None): each candidate's untimed call and :func:`timed_calls`, and a
    second round of two candidates' timed calls. The lead's calls between them come
    on top (:func:`gap_most` at most before each)."""
    timed = timed_calls(nbytes)
    candidates = SHORTLIST + 1 if candidates is None else candidates
    return candidates * (1 + timed) + 2 * timed


# A class's key: the all-reduce's size class, or "collective:class" for a half's.
Key = int | str


def _size_class(key: Key) -> int:
    return key if isinstance(key, int) else int(key.rsplit(":", 1)[1])


def _collective(key: Key) -> str:
    return "allreduce" if isinstance(key, int) else key.rsplit(":", 1)[0]


# A class's first calls run the winner of a class settled at most this many classes
# (powers of two) from it, where that is one of its candidates: the evidence of this
# host, nearer than the model's.
NEAR = 2


SHORTLIST = 3  # how many of ringmpi's own algorithms are tried (shortlist_of)
# The library's call stays unless one of ringmpi's own is at least this much faster
# in the trials: medians of a few calls differ by as much from run to run at large
# sizes, and a near tie lost to the noise should cost the library's time, not more.
LIBRARY_MARGIN = 0.05
# One of ringmpi's own that beat the library by less than this in the trials is
# timed against it once more (as many calls again) before the class is settled: a
# thin lead from one round's few calls is as likely noise as speed, and a choice
# slower than the library's call costs every call after.
SECOND_ROUND_MARGIN = 0.25
_VERSION = 1  # of the cache file's layout
# A class's trials start at its first call, with the incumbent (the model's best, a
# near class's winner or the host's measured fastest: Tuner._ordered): its first
# call is the lead's (it pays the one-time costs: the untimed call each candidate
# makes first), then after the lead's calls comes its first timed trial, then the
# candidates take turns, the one with the fewest trial calls first, the lead's own
# among them. The lead (the incumbent, until a candidate that made all its
# timed calls has a faster agreed median: then that one; a median of fewer calls
# is as likely noise as speed) runs the calls between the trials, counted down on
# the trials' cell ``left`` (below REMEMBERED_BELOW from compiled code: counted).
# What a trial costs beyond the lead's median (the whole trial as each rank saw it:
# its Python, its barrier or copies, the collective that agrees on it; agreed,
# summed) stays within TRIAL_BUDGET of the lead's time over the class's calls so
# far and BUDGET_AHEAD more: each trial comes after as many of the lead's calls as
# keep the sum in bounds (none before one that costs less than the lead; at most
# gap_most), and a budget left unspent carries over no more than BUDGET_AHEAD
# calls' worth, so that the trials never crowd together. Until the lead's timed
# trial the model's least predicted time among the candidates stands in for the
# lead's (the least: a slower lead leaves the trials a smaller share), and TRIAL_S
# and two calls for what that trial costs beyond a call (its Python and agreement,
# and the copies it times: 150-225 us at 8 B, 2 ranks on a 2-core host). A
# candidate's cost before its first trial: what the costliest first trial so far
# took, else the lead's time again and ONE_TIME_S more (a window, its compiled
# code loaded: 3-6 ms there). A candidate whose median took DROP times the lead's
# is tried no more. The
# ``spacing`` setting gives the lead's calls between trials instead (0: the trials
# back to back).
TRIAL_BUDGET = 0.1
BUDGET_AHEAD = 20
GAP_MOST = 64
GAP_S = 0.05
DROP = 1.5
ONE_TIME_S = 5e-3
TRIAL_S = 200e-6
# Below this size the lead's calls are remembered (counted from compiled code), and
# a nonblocking call's job runs the lead uncounted, never a trial: a job may start
# in C from a remembered call on one rank and in Python on another, and both must
# run the same. From it a call takes a millisecond or more and its Python costs
# little beside it: the lead's calls are counted in Python, never remembered, and
# a job takes its turn in the trials as a blocking call does.
REMEMBERED_BELOW = 4 << 20


def gap_most(lead_s: float) -> int:
    """The most of the lead's calls (``lead_s`` seconds each) between two trials:
    GAP_MOST calls or GAP_S seconds of them, the more."""
    return max(GAP_MOST, math.ceil(GAP_S / lead_s)) if lead_s > 0 else GAP_MOST


@dataclass
class _Trials:
    """One size class's trials on one communicator."""

    names: list[str]
    timed: int  # timed calls per candidate
    left: np.ndarray  # the lead's calls before the next trial (an int64 cell, counted)
    spacing: int | None  # the setting: the lead's calls between trials, None: the budget's
    expected: float = 0.0  # seconds a call of the lead, until its timed trial: the model's
    second: bool = False  # the second round: the best own candidate against the library
    calls: int = 0  # the class's calls: the trials and the lead's between them
    times: list[list[float]] = field(default_factory=list)
    copied: dict = field(default_factory=dict)  # the same and in place -> copies(...)
    # seconds added to each candidate's median: what a repeat of it pays in Python
    # (the API's Python repeat path) that its trials, which time `again`, do not
    charged: list[float] = field(default_factory=list)
    runnable: list[int] = field(default_factory=list)  # the node's load, sampled (_host.runnable)
    runs: list[int] = field(default_factory=list)  # trial calls made, per candidate
    # seconds a call, agreed: the median of its timed calls, before them its first
    # call's time (one-time costs included: at most what a call costs); 0: not yet
    agreed: list[float] = field(default_factory=list)
    cost: list[float] = field(default_factory=list)  # seconds its last trial took, all told, agreed
    spent: float = 0.0  # seconds the trials took beyond the lead's median, agreed
    first: float = 0.0  # seconds the costliest first trial of a candidate took, agreed
    agreeing: float = 0.0  # seconds this rank's last agreement took (agreed at the next)
    dropped: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.times = self.times or [[] for _ in self.names]
        self.charged = self.charged or [0.0 for _ in self.names]
        self.agreed = self.agreed or [0.0 for _ in self.names]
        self.cost = self.cost or [0.0 for _ in self.names]
        if not self.runs:  # the class's first call, the lead's, its untimed one
            self.runs = [1] + [0 for _ in self.names[1:]]
            self._space()
            self.left[0] += 1
            self.calls += 1

    def next(self) -> int:
        """The candidate this trial runs (an index of ``names``): the lead's first timed
        one, then the one with the fewest trial calls."""
        lead = self.lead
        if self.runs[lead] < 2 and not self.second:
            return lead
        left = [i for i in range(len(self.names)) if not self._done(i)]
        return min(left, key=lambda i: (self.runs[i], i))

    @property
    def lead(self) -> int:
        """The candidate the calls between the trials run: the incumbent (``names[0]``)
        until another, all its timed calls made, has a faster agreed median."""
        known = [i for i, t in enumerate(self.agreed)
                 if t and i not in self.dropped and (i == 0 or self._done(i))]  # fmt: skip
        return min(known, key=lambda i: (self.agreed[i], i)) if known else 0

    def samples(self, i: int) -> int:
        """How many timed calls a trial of candidate ``i`` makes on its copies: with the
        spacing auto, as many as take TRIAL_S at the lead's time (a trial's own cost
        spread over its calls), at most those it has left; else one."""
        inc = self.agreed[self.lead] or self.expected
        if self.spacing is not None or not inc:
            return 1
        return max(1, min(1 + self.timed - self.runs[i], math.ceil(TRIAL_S / inc)))

    def _done(self, i: int) -> bool:
        return i in self.dropped or self.runs[i] >= 1 + self.timed

    def ran(self, i: int, made: int, took: float, step: float, ctx: Context,
            timeout: float) -> None:  # fmt: skip
        """Count a trial of candidate ``i`` (``made`` calls of it, ``took`` seconds its
        last, ``step`` the whole trial, here), agree on both, its median and the lead's
        (one collective), and set the lead's calls before the next trial."""
        self.runs[i] += made
        self.calls += 1
        lead = self.lead
        median = [statistics.median(t) if t else 0.0 for t in (self.times[lead], self.times[i])]
        mine = np.array([*median, took, step + self.agreeing])
        agreed = np.empty_like(mine)
        t0 = time.perf_counter_ns()
        library_allreduce(ctx, mine, agreed, MPI.MAX, timeout,
                          f"rank {ctx.rank}: auto's tuner agreeing on a trial")  # fmt: skip
        self.agreeing = (time.perf_counter_ns() - t0) * 1e-9
        self.agreed[lead] = float(agreed[0])
        self.agreed[i] = float(agreed[1] if self.times[i] else agreed[2])
        self.cost[i] = float(agreed[3])
        self.spent += max(0.0, self.cost[i] - self.agreed[lead])
        if not self.times[i]:  # its first, untimed
            self.first = max(self.first, self.cost[i])
        if i != lead and self.times[i] and self.agreed[i] > DROP * self.agreed[lead]:
            self.dropped.add(i)
        if not self.finished:  # (a candidate faster than the lead leads from now on)
            self._space()

    def _space(self) -> None:
        """Set the lead's calls before the next trial."""
        gap = self._spacing(self.lead, self.next())
        self.left[0] = gap
        self.calls += gap

    def _spacing(self, lead: int, j: int) -> int:
        """The lead's calls before candidate ``j``'s next trial: the ``spacing``
        setting, or as many as keep what the trials cost beyond the lead's calls
        within TRIAL_BUDGET of its time over the calls made and BUDGET_AHEAD more
        (a budget left unspent, where a cost was guessed high, carries over no more
        than BUDGET_AHEAD calls' worth); none before one that costs less."""
        if self.spacing is not None:
            return self.spacing
        inc = self.agreed[lead] or self.expected
        if not inc:
            return GAP_MOST
        if self.cost[j]:
            beyond = self.cost[j] - inc
        elif j == lead:
            beyond = TRIAL_S + 2 * inc
        else:  # a first call: as the others' first calls cost, else ONE_TIME_S more
            beyond = self.first - inc if self.first else inc + ONE_TIME_S
        budget = TRIAL_BUDGET * inc  # what the trials may cost beyond the lead, a call
        credit = min(budget * (self.calls + BUDGET_AHEAD) - self.spent, budget * BUDGET_AHEAD)
        calls = (beyond - credit) / budget
        return min(gap_most(inc), max(0 if beyond < 0 else 1, math.ceil(calls)))

    @property
    def finished(self) -> bool:
        """Whether every candidate has had its trials."""
        return all(self._done(i) for i in range(len(self.names)))

    def copies(self, key: tuple, work: np.ndarray, source: np.ndarray | None) -> tuple:
        """(out, source) for a timed trial: copies of this rank's data, made once per
        candidate and call shape; one array for an in-place call."""
        key = (*key, source is None)
        made = self.copied.get(key)
        if made is None:
            out = np.empty_like(work)
            made = self.copied[key] = (out, out if source is None else np.empty_like(source))
        np.copyto(made[1], work if source is None else source)
        return made


class Trial:
    """What :func:`ringmpi.algorithms.choose` returns for a class's trial: ``run`` runs
    this call's candidate, timed, and settles the class after the last."""

    def __init__(self, tuner: Tuner, klass: Key, trials: _Trials, candidate, i: int) -> None:
        self.tuner, self.klass, self.trials, self.candidate = tuner, klass, trials, candidate
        self.name, self.i = candidate.name, i

    def run(self, work, red, ctx: Context, source=None, timeout: float = 0.0, *more) -> None:
        """The candidate's call (``more``: a half's counts), timed from its second."""
        start = time.perf_counter_ns()
        trials, i = self.trials, self.i
        timed = trials.runs[i] > 0  # its first call untimed (a second round has none)
        made = 1  # its calls timed, or its untimed one
        if sum(trials.runs) % 4 == 0:  # the node's load, outside the timed call
            trials.runnable.append(_host.runnable())
        if _trace._active or more:  # traced (the trace counts its sends), or a half
            if timed:
                _together(ctx, timeout)
            t0 = time.perf_counter_ns()
            self.candidate.run(work, red, ctx, source, timeout, *more)
            took = (time.perf_counter_ns() - t0) * 1e-9
        else:
            key = (self.name, red.name, red.dtype.str, work.size, timeout)
            call = prepared(self.candidate, red, ctx, work.size, timeout)
            again = call.again
            if call.cells is None and not trials.charged[i]:  # its repeats pay the API's
                from .. import _repeat  # noqa: PLC0415 -- (Python path) it imports this package

                trials.charged[i] = _repeat.python_seconds()
            if timed and work.nbytes <= _COPIED_BYTES:
                out, src = trials.copies(key, work, source)
                again(out, src)  # the ranks come out of it as out of the call before
                made = trials.samples(i)
                for _ in range(made - 1):  # calls after one of their own, as in a loop
                    t0 = time.perf_counter_ns()
                    again(out, src)
                    trials.times[i].append((time.perf_counter_ns() - t0) * 1e-9)
                t0 = time.perf_counter_ns()
                again(out, src)
                took = (time.perf_counter_ns() - t0) * 1e-9
                again(work, work if source is None else source)
            else:
                if timed:
                    _together(ctx, timeout)
                t0 = time.perf_counter_ns()
                again(work, work if source is None else source)
                took = (time.perf_counter_ns() - t0) * 1e-9
        if timed:
            trials.times[i].append(took)
        _trace.record_trial(_size_class(self.klass), self.name, took, timed)
        trials.ran(i, made, took, (time.perf_counter_ns() - start) * 1e-9, ctx, timeout)
        if trials.finished:
            self.tuner.settle(self.klass, trials, ctx, timeout)


# Up to this size a timed trial is the second of two calls in a row on a copy of the
# data, as a call in a loop follows the one before, and then the call itself runs,
# untimed; above, a barrier and the call. Between the tuner's calls the ranks drift
# apart by more than a small call takes (the Python of a trial), and a trial alone
# would time the drift; a barrier lets each rank out at its own time, which a small
# call's time would show too (more for some libraries' calls than for others').
_COPIED_BYTES = 4 << 20


def _together(ctx: Context, timeout: float) -> None:
    """Start a timed trial on every rank at once (a barrier): the time is then the
    call's own, not how much later than this rank another came."""
    if timeout:
        ctx.arrive(ctx.comm, "a barrier before a timed trial of auto's tuner", timeout)
    else:
        ctx.comm.Barrier()


class Tuner:
    """A communicator's tuned choices (``known``: size class -> algorithm name) and
    the classes being tried."""

    def __init__(self, ctx: Context, settings: _settings.Settings, layout: str) -> None:
        self.settings, self.layout = settings, layout
        self.trying: dict[Key, _Trials] = {}
        self.path = cache_file(settings)
        self.known: dict[Key, str] = _load(ctx, self.path, layout, settings.retune_days)
        self.busy: set[Key] = set()  # classes settled on a busy node: not in the file
        self.led: dict[tuple, tuple[Call, Call]] = {}  # the leads' calls: counted, plain
        self.order: dict[Key, list] = {}  # per class: its candidates, the incumbent first

    def choose(self, ctx: Context, nbytes: int, shortlist, library: bool = True,
               collective: str = "allreduce"):  # fmt: skip
        """The record a call of ``nbytes`` runs: the class's winner, its lead between
        trials (a :class:`Lead`), or its next trial. A class is tuned apart for
        reductions the library's call may not run (``library`` False: ringmpi's own
        candidates only); a half's classes are its own (``"reduce_scatter:17"``; in
        the file, under ``collectives``)."""
        klass = nbytes.bit_length() if library else -nbytes.bit_length()
        key: Key = klass if collective == "allreduce" else f"{collective}:{klass}"
        name = self.known.get(key)
        if name is not None:
            if name in names(collective) and fits(get(name, collective), ctx):
                return get(name, collective)
            del self.known[key]  # a file's algorithm that is not registered here: try again
        trials = self.trying.get(key)
        if trials is None:
            tried = [a.name for a in self._ordered(key, shortlist, ctx, nbytes)]
            trials = self.trying[key] = _Trials(tried, timed_calls(nbytes), np.zeros(1, np.int64),
                                                self.settings.spacing,
                                                _expected(shortlist, ctx, nbytes))  # fmt: skip
        kept = nbytes < REMEMBERED_BELOW
        job = bool(_progress.in_job[0]) and kept
        if trials.left[0] > 0 or job:
            record = get(trials.names[trials.lead], collective)
            return Lead(self, record, trials.left, counts=not job, kept=kept)
        i = trials.next()
        return Trial(self, key, trials, get(trials.names[i], collective), i)

    def _ordered(self, key: Key, shortlist: list, ctx: Context, nbytes: int) -> list:
        """The class's candidates, its incumbent first: the winner of the nearest class
        settled within NEAR classes of it (of its collective, and like it with the
        library's call among the candidates or not; the smaller on a tie) where that
        is one of them, else, for the all-reduce, the one this host measured fastest
        (:func:`measured`, where it was), else the model's best. Decided at the
        class's first call."""
        found = self.order.get(key)
        if found is None:
            klass, kind = _size_class(key), _collective(key)
            candidates = {a.name for a in shortlist}
            near = [(abs(c - klass), c, name) for c, name in
                    ((_size_class(k), name) for k, name in self.known.items()
                     if _collective(k) == kind and name in candidates)
                    if (c > 0) == (klass > 0) and 0 < abs(c - klass) <= NEAR]  # fmt: skip
            winner = min(near)[2] if near else None
            if winner is None and kind == "allreduce":
                seconds = measured(ctx, self.settings, [a.name for a in shortlist], nbytes)
                if seconds is not None:
                    winner = min(seconds, key=seconds.__getitem__)
            found = self.order[key] = sorted(shortlist, key=lambda a: a.name != winner)
        return found

    def settle(self, klass: Key, trials: _Trials, ctx: Context, timeout: float) -> None:
        """Agree on the trials' timings (one collective) and keep the winner; or, where
        one of ringmpi's own beat the library by less than SECOND_ROUND_MARGIN, time
        the two again first."""
        trials.runnable.append(_host.runnable())
        seen = self.settings.oversubscribed == "auto"  # yes or no: the node's state is known
        busy = seen and _host.busy(trials.runnable, ctx.node.Get_size())
        medians = [statistics.median(t) + c for t, c in zip(trials.times, trials.charged,
                                                          strict=True)]  # fmt: skip
        mine = np.array([*medians, busy])
        agreed = np.empty_like(mine)
        library_allreduce(ctx, mine, agreed, MPI.MAX, timeout,
                          f"rank {ctx.rank}: auto's tuner agreeing on its trials")  # fmt: skip
        slowest, busy = agreed[:-1], bool(agreed[-1])
        winner = trials.names[int(np.argmin(slowest))]
        if "mpi" in trials.names:  # the library's call, unless clearly beaten
            library = slowest[trials.names.index("mpi")]
            if slowest.min() > library * (1 - LIBRARY_MARGIN):
                winner = "mpi"
            elif not trials.second and slowest.min() > library * (1 - SECOND_ROUND_MARGIN):
                self.trying[klass] = _second_round(trials, winner)
                return
        self.known[klass] = winner
        del self.trying[klass]
        times = dict(zip(trials.names, slowest.tolist(), strict=True))
        _trace.record_tuned(_size_class(klass), winner, times)
        if busy:
            self.busy.add(klass)
        elif ctx.rank == 0 and self.path is not None:
            _store(self.path, self.layout, klass, winner, times)


def _expected(shortlist: list, ctx: Context, nbytes: int) -> float:
    """The model's least predicted seconds of a call of ``nbytes`` among ``shortlist``
    (its modelled records)."""
    nodes, per_node = ctx.nodes(_settings.current())
    costs = tuning.load(per_node)
    return min((tuning.predict(costs, a, nbytes, ctx.size, nodes, per_node)
                for a in shortlist if a.terms is not None), default=0.0)  # fmt: skip


def _second_round(trials: _Trials, winner: str) -> _Trials:
    """The winner against the library, as many timed calls each again, their first
    round's times kept: every rank decides on both rounds' calls."""
    pair = [trials.names.index(winner), trials.names.index("mpi")]

    def kept(values: list) -> list:
        return [values[i] for i in pair]

    return _Trials(kept(trials.names), trials.timed, trials.left, trials.spacing, second=True,
                   calls=trials.calls, copied=trials.copied,
                   times=[list(t) for t in kept(trials.times)], charged=kept(trials.charged),
                   runnable=trials.runnable, runs=[1, 1], agreed=kept(trials.agreed),
                   cost=kept(trials.cost), spent=trials.spent)  # fmt: skip


def tuner(ctx: Context, settings: _settings.Settings, nodes: int, per_node: int) -> Tuner:
    """The communicator's tuner (made, and the cache file read, on first use)."""
    found = ctx.tuner
    if found is None or found.settings is not settings:
        # (the layout names the file's entries: none to name without a file)
        layout = _layout(ctx, settings, nodes, per_node) if cache_file(settings) else ""
        found = ctx.tuner = Tuner(ctx, settings, layout)
    return found


def cache_file(settings: _settings.Settings) -> str | None:
    """The tuner's cache file for this machine, or None (``memory`` and ``off``)."""
    where = settings.tuner
    if where in ("off", "memory"):
        return None
    if where == "auto":
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        where = os.path.join(base, "ringmpi")
    return os.path.join(where, f"allreduce-{socket.gethostname()}.json")


def _layout(ctx: Context, settings: _settings.Settings, nodes: int, per_node: int) -> str:
    """What the tuned choices hold for: the MPI library, the ranks and nodes, how
    ranks wait, ringmpi's version, the settings that change how algorithms run, and
    the host (rank 0's, whose file it is)."""
    library = MPI.Get_library_version().strip().splitlines()[0].strip()
    knobs = (settings.segment_bytes, settings.window_stores, settings.piece_bytes,
             settings.ranks_per_node, settings.node_placement, settings.tuning)  # fmt: skip
    digest = zlib.crc32(repr(knobs).encode()) & 0xFFFFFFFF
    wait = "sleep" if ctx.sleepy else "spin"
    return (f"{library} | ringmpi {__version__} | {ctx.size} ranks, {nodes} node(s) of up to "
            f"{per_node} | {wait} | settings {digest:08x} | {_host.describe()}")  # fmt: skip


def _load(ctx: Context, path: str | None, layout: str, retune_days: float) -> dict[Key, str]:
    """The cache file's choices for ``layout`` that are not due a re-check: read by
    rank 0, broadcast (every rank must make the same choice)."""
    known: dict[Key, str] = {}
    if ctx.rank == 0 and path is not None:
        data = _read(path)
        oldest = time.time() - retune_days * 86400.0
        tables: list[tuple[str, dict]] = [("allreduce", data.get("layouts", {}))]
        tables += list(data.get("collectives", {}).items())
        for collective, layouts in tables:
            for k, v in layouts.get(layout, {}).items():
                if not (k.lstrip("-").isdigit() and isinstance(v, dict)):
                    continue  # not a size class: a file from another version
                if v.get("tuned_at", 0.0) >= oldest:
                    known[int(k) if collective == "allreduce" else f"{collective}:{k}"] = v[
                        "algorithm"
                    ]
    # (without a file every rank knows it knows nothing: no message)
    return ctx.comm.bcast(known, root=0) if ctx.size > 1 and path is not None else known


def _read(path: str) -> dict:
    """The cache file's contents; a missing file is empty, a damaged one is reported
    once on stderr and then rewritten."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        print(f"ringmpi: ignoring the tuner's cache file {path}: {exc}", file=sys.stderr)
        return {}
    if not isinstance(data, dict) or data.get("version") != _VERSION:
        return {}
    return data


def _store(path: str, layout: str, key: Key, winner: str, times: dict[str, float]) -> None:
    """Add one class's winner to the cache file (read, merge, write aside, rename)."""
    data = _read(path) or {"version": _VERSION, "layouts": {}}
    klass = _size_class(key)
    entry = {
        "algorithm": winner,
        "bytes": f"{1 << (abs(klass) - 1) if klass else 0}-{(1 << abs(klass)) - 1}",
        "library": klass >= 0,  # False: the class of reductions the library may not run
        "seconds": {k: float(f"{v:.3g}") for k, v in times.items()},
        "tuned_at": time.time(),
    }
    # The all-reduce's classes under "layouts"; a half's under "collectives", by name.
    if isinstance(key, int):
        table = data.setdefault("layouts", {})
    else:
        table = data.setdefault("collectives", {}).setdefault(key.rsplit(":", 1)[0], {})
    table.setdefault(layout, {})[str(klass)] = entry
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, aside = tempfile.mkstemp(prefix=".allreduce-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
            os.replace(aside, path)
        finally:
            if os.path.exists(aside):
                os.unlink(aside)
    except OSError as exc:
        print(f"ringmpi: cannot write the tuner's cache file {path}: {exc}", file=sys.stderr)


# --- the host's evidence: the candidates timed once on large buffers ----------
#
# From CALIBRATED_FROM a call streams its buffer from memory, and the model's
# constants, fitted on other hosts, can rank the candidates wrong by twice (the
# node's shared-memory copies against a library's single-copy messages): a class's
# first calls would run the slower, and try the slowest among the first ten.
# ringmpi.warm times every candidate of auto, and the library's call, once per
# process and layout, on buffers of CALIBRATED_FROM bytes taken in turn (twice
# the last-level cache between a buffer's uses, where eight buffers span that):
# in turn, a call each for its one-time costs, then twice; the best of its timed
# calls, the slowest rank's. From that size the fastest leads a class's calls;
# its trials still try every candidate: a measurement at one size and moment is
# no verdict on another, and what a trial costs is bounded against the lead.
CALIBRATED_FROM = 16 << 20
# (ranks, nodes, ranks of the largest node) -> candidate -> seconds per byte
_measured: dict[tuple[int, int, int], dict[str, float]] = {}


def calibrate(ctx: Context, red, candidates: list, timeout: float) -> None:
    """Time ``candidates`` (records of the all-reduce) on ``ctx``'s layout, once per
    process (collective over ``ctx``)."""
    layout = (ctx.size, *ctx.nodes(_settings.current()))
    if layout in _measured or ctx.size == 1:
        return
    count = CALIBRATED_FROM // red.dtype.itemsize
    # twice the cache between a buffer's uses (at most eight buffers)
    sets = min(8, 2 + 2 * _host.last_level_cache() // CALIBRATED_FROM)
    buffers = [np.ones(count, red.dtype) for _ in range(sets)]  # (written: no page faults)
    calls = [prepared(record, red, ctx, count, timeout).again for record in candidates]
    took = np.full(len(candidates), math.inf)
    for k in range(3):  # in turn, as a program's other work comes between its calls
        for j, again in enumerate(calls):  # one for its one-time costs, then two timed
            work = buffers[(k * len(calls) + j) % sets]
            _together(ctx, timeout)
            t0 = time.perf_counter_ns()
            again(work, work)
            if k:
                took[j] = min(took[j], (time.perf_counter_ns() - t0) * 1e-9)
    agreed = np.empty_like(took)
    library_allreduce(ctx, took, agreed, MPI.MAX, timeout,
                      f"rank {ctx.rank}: auto's tuner agreeing on the host's evidence")  # fmt: skip
    _measured[layout] = {a.name: t / CALIBRATED_FROM for a, t in zip(candidates, agreed.tolist(),
                                                                     strict=True)}  # fmt: skip


def measured(ctx: Context, settings: _settings.Settings, names: list[str],
             nbytes: int) -> dict[str, float] | None:  # fmt: skip
    """The seconds a call of ``nbytes`` took each of ``names`` on this host and layout
    (:func:`calibrate`), by name, or None: below CALIBRATED_FROM, or not all measured."""
    if nbytes < CALIBRATED_FROM:
        return None
    found = _measured.get((ctx.size, *ctx.nodes(settings)))
    if found is None or not all(name in found for name in names):
        return None
    return {name: found[name] * nbytes for name in names}


# --- the lead: the calls between a class's trials -------------------------------


class Lead:
    """What :func:`ringmpi.algorithms.choose` returns for a call of an untuned class
    between its trials: the lead's (``record``), counted off ``left`` (the trials'
    int64 cell of the lead's calls before the next trial) where it ``counts`` (a
    nonblocking call's job below REMEMBERED_BELOW does not). Where ``kept`` (below
    REMEMBERED_BELOW) the call is made ready counted, to be remembered
    (:func:`counted`: its repeats count the cell down from compiled code); else
    ``run`` counts in Python."""

    def __init__(self, tuner: Tuner, record, left: np.ndarray, counts: bool,
                 kept: bool) -> None:  # fmt: skip
        self.tuner, self.record, self.left, self.counts = tuner, record, left, counts
        self.name, self.own, self.kept = record.name, record.own, kept

    def _calls(self, red, ctx: Context, count: int, timeout: float) -> tuple[Call, Call]:
        """(the lead's call counted off ``left``, the same uncounted), made once."""
        key = (self.name, red.tag, count, timeout, id(self.left))
        found = self.tuner.led.get(key)
        if found is None:
            plain = prepared(self.record, red, ctx, count, timeout)
            found = (counted(plain, self.left, red.dtype, count), plain)
            self.tuner.led[key] = found
        return found

    def call(self, red, ctx: Context, count: int, timeout: float) -> Call:
        """The lead's call of ``count`` elements of ``red``, counted, made once."""
        return self._calls(red, ctx, count, timeout)[0]

    def run(self, work, red, ctx: Context, source=None, timeout: float = 0.0, *more) -> None:
        """The lead's call, counted off ``left`` where it counts (``more``: a half's
        counts)."""
        if more or not self.kept:
            if self.counts:
                self.left[0] -= 1
            if more:
                self.record.run(work, red, ctx, source, timeout, *more)
                return
        call = self._calls(red, ctx, work.size, timeout)[0 if self.counts and self.kept else 1]
        call.again(work, work if source is None else source)


def counted(call: Call, left: np.ndarray, dtype: np.dtype, count: int) -> Call:
    """``call`` (of ``count`` elements of ``dtype``) counted off ``left`` (an int64
    cell of calls left): each call, from Python or from compiled code, takes one;
    once none is left its repeats (``in_place``, ``from_``, ``cells``) send nothing
    and return STALE, so that the API takes the full path, where auto's tuner goes
    on. ``again`` always makes the call."""
    plain = call.again
    if call.cells is None:

        def again_counted(work: np.ndarray, source: np.ndarray) -> int:
            if left[0] <= 0:
                return STALE
            left[0] -= 1
            plain(work, source)
            return 0

        again_counted.kept = (left, plain)  # type: ignore[attr-defined]
        in_place, from_ = repeats(again_counted, dtype, count)

        def always(work: np.ndarray, source: np.ndarray) -> None:
            if again_counted(work, source) == STALE:
                plain(work, source)

        return Call(always, in_place, from_, None, call.step)
    cells = _direct.counted(call.cells, left)
    in_place, from_ = call.in_place, call.from_

    def again(work: np.ndarray, source: np.ndarray) -> None:
        err = in_place(work, cells) if source is work else from_(work, source, cells)
        if err == STALE:  # none left, or arrays the cells do not take: the call itself
            plain(work, source)
        elif err:
            raise MPI.Exception(err)

    again.kept = (left, call)  # type: ignore[attr-defined]  # their addresses are in the cells
    return Call(again, in_place, from_, cells, call.step)


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program()
