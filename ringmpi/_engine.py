"""The step engine: one compiled loop carries out any plan, calling MPI's C functions.

A plan (:mod:`ringmpi.plans`) says per step what to send where and what to
receive from whom, and whether to store or reduce it. :func:`run` hands the
plan, the buffer and the communicator's C handle to :func:`_execute`, a
Numba-compiled loop that calls MPI_Isend, MPI_Irecv and MPI_Wait through the C
ABI (:mod:`ringmpi._capi`) and reduces with the op's compiled kernel: no
interpreter between steps, so a step costs what it costs in C. It is compiled
once per dtype (the op is a number) and cached on disk. (Numba's cache checks
only this file's time stamp: a change to the ops in :mod:`ringmpi.kernels`
needs this file touched, or its cache cleared, to reach the engine.)

Every message is sent in **segments** of at most ``RINGMPI_SEGMENT_BYTES``
(both sides cut a message of the same length alike). A reduce receives
segments into two scratch buffers in turn, and reduces segment k while segment
k + 1 is arriving: the reduce overlaps the transfer, as in Gloo's and NCCL's
pipelined rings. A store receives every segment straight into place.

While waiting, a rank spins in MPI_Wait, or, on a node with many more ranks
than cores (``Context.sleepy``), polls MPI_Test and yields the core between
polls (sched_yield), so that the rank it waits for can run. With a timeout
(the call's) it polls MPI_Test too, reading the clock every 256
polls, and gives up on a request that has not completed in that time; the
single-segment shortcut through the blocking MPI_Sendrecv is then not taken.

What goes wrong is returned, not raised, from compiled code (the step, the MPI
error code, or the byte count or tag that did not match); :func:`run` turns it
into a RingMPIError naming this rank, the peer, the algorithm, phase and step.
Before returning after an error the loop cancels the receives it posted and
releases its sends, so no late message lands in memory after the call.
"""

from __future__ import annotations

import time

import numba
import numpy as np
from mpi4py import MPI

from . import _trace
from ._cache import Bounded
from ._capi import (
    abi,
    handle,
    monotonic_ns,
    mpi_cancel,
    mpi_get_count,
    mpi_irecv,
    mpi_isend,
    mpi_request_free,
    mpi_sendrecv,
    mpi_test,
    mpi_wait,
    sched_yield,
)
from ._comm import timed_out
from ._errors import RingMPIError
from ._half import fold_parts
from ._ops import combine_by_code, divide_by
from ._settings import current
from .kernels import DTYPES, Reduction
from .plans import (
    ACTION,
    FINAL,
    PHASE,
    RECV_FROM,
    RECV_LEN,
    RECV_OFF,
    REDUCE,
    SEND_LEN,
    SEND_OFF,
    SEND_TO,
    STEP,
    THEIRS_FIRST,
    Plan,
)

__all__ = ["SEGMENT_BYTES", "prepare", "run", "run_half", "segment_bytes"]

# Segment of every message, bytes (RINGMPI_SEGMENT_BYTES); docs/performance.md
# has the measurement behind the default.
SEGMENT_BYTES = 1 << 20
_MAX_SEGMENT = 1 << 30  # MPI counts are C ints

# What _execute reports in `err`: [what, row, detail, detail].
_OK, _MPI_ERROR, _WRONG_COUNT, _WRONG_TAG, _TIMED_OUT = 0, 1, 2, 3, 4
# What _wait returns for a request that did not complete in time (MPI error
# codes are >= 0).
_LATE = -1
# Polls of MPI_Test before a waiting rank yields its core between polls (as the
# node's flag waits do: ringmpi._shm).
_SPINS = 100

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@_jit
def _wait(request, status, flag, sleepy, timeout):
    """Complete ``request``: its MPI error code, or _LATE after ``timeout`` ns
    without completing (0: no limit)."""
    if not sleepy and timeout == 0:
        return mpi_wait(request, status)
    start = monotonic_ns() if timeout > 0 else 0
    polls = 0
    while True:
        e = mpi_test(request, flag.ctypes.data, status)
        if e != 0 or flag[0] != 0:
            return e
        polls += 1
        # Polling never gives the core away as MPI_Wait's spin may: after a few
        # microseconds, yield between polls, so that the rank waited for can run
        # where ranks outnumber cores.
        if sleepy or polls > _SPINS:
            sched_yield()
        if timeout > 0 and (polls & 255) == 0 and monotonic_ns() - start > timeout:
            return _LATE


@_jit
def _abandon(requests, rsize, live, nrecv_slots, status):
    """After an error: cancel the receives still posted, release the sends."""
    for i in range(live.size):
        if live[i]:
            slot = requests.ctypes.data + i * rsize
            if i < nrecv_slots:
                mpi_cancel(slot)
                mpi_wait(slot, status.ctypes.data)
            else:
                mpi_request_free(slot)
            live[i] = 0


@_jit
def _arrived(status, tag_at, count, byte, nbytes, tag, err, row):
    """Whether the receive ``status`` describes brought ``nbytes`` with ``tag``; if
    not, ``err`` says which differs."""
    mpi_get_count(status.ctypes.data, byte, count.ctypes.data)
    if count[0] != nbytes:
        err[0], err[1], err[2], err[3] = _WRONG_COUNT, row, count[0], nbytes
        return False
    if status[tag_at] != tag:
        err[0], err[1], err[2] = _WRONG_TAG, row, status[tag_at]
        return False
    return True


@_jit
def _reduce(acc, inp, code, reverse, action, divisor):
    """``acc (op) inp`` in the row's order; AVG divides the finished elements."""
    combine_by_code(acc, inp, code, reverse)
    if (action & FINAL) != 0 and divisor.size > 0:
        divide_by(acc, divisor)


# The fixed arguments of a call shape, packed into one int64 array (fewer
# arguments: Numba's dispatcher pays per argument, on every call).
_CODE, _COMM, _BYTE, _TAG, _ANY_TAG, _SEG, _RSIZE, _TAG_AT, _SLEEPY, _LANES, _TIMEOUT, _NPARAMS = (
    range(12)
)


@_jit
def _execute(work, source, table, scratch, divisor, state, requests, status):
    """Carry out ``table`` (a plan) on ``work``, which first gets a copy of ``source``
    (unless it is ``work``); the other arguments are fixed per call shape.

    ``state`` holds the parameters, then the report. The parameters (the _CODE ...
    names): the op's number, the communicator's and MPI_BYTE's handles, the tag,
    MPI_ANY_TAG, the segment in elements of ``work``, the size of an MPI_Request,
    where the tag sits in ``status`` (an MPI_Status seen as int32s, followed by two
    int32 cells for a count and a flag), whether to wait sleepily, the lanes
    per element of the plan's offsets, and the timeout in ns (0: none).
    ``scratch`` holds two segments.
    ``requests`` holds the request slots, then a live flag per slot: the
    receives' slots first (all of a store's segments, or two for a reduce), then
    one per segment sent. In the report, ``[2 row]`` and ``[2 row + 1]`` count the
    bytes and messages each row really sent, and the last 4 cells say what went
    wrong, if anything: [what, row, detail, detail].
    """
    params, report = state[:_NPARAMS], state[_NPARAMS:]
    code, comm, byte, tag = params[_CODE], params[_COMM], params[_BYTE], params[_TAG]
    any_tag, seg, rsize, tag_at = params[_ANY_TAG], params[_SEG], params[_RSIZE], params[_TAG_AT]
    sleepy, w, timeout = params[_SLEEPY] != 0, params[_LANES], params[_TIMEOUT]
    nstat = status.size - 2
    count = status[nstat:]  # count, then flag
    isz = work.itemsize
    base = work.ctypes.data
    nslots = requests.size // (rsize + 1)
    live = requests[nslots * rsize :]  # a flag per request slot, after the slots
    req = requests.ctypes.data
    st = status.ctypes.data
    err = report[report.size - 4 :]
    err[0] = _OK
    if source.ctypes.data != base:
        for i in range(work.size):
            work[i] = source[i]
    for row in range(table.shape[0]):
        report[2 * row] = 0
        report[2 * row + 1] = 0
        dest, src, action = table[row, SEND_TO], table[row, RECV_FROM], table[row, ACTION]
        soff, slen = table[row, SEND_OFF] * w, table[row, SEND_LEN] * w
        roff, rlen = table[row, RECV_OFF] * w, table[row, RECV_LEN] * w
        nsend = 0 if dest < 0 else max(1, (slen + seg - 1) // seg)
        nrecv = 0 if src < 0 else max(1, (rlen + seg - 1) // seg)
        reduce = (action & REDUCE) != 0
        reverse = (action & THEIRS_FIRST) != 0
        if nsend == 1 and nrecv == 1 and not sleepy and timeout == 0:
            # One segment each way: one MPI_Sendrecv (cheaper than two requests).
            at = scratch.ctypes.data if reduce else base + roff * isz
            e = mpi_sendrecv(base + soff * isz, slen * isz, byte, dest, tag, at, rlen * isz,
                             byte, src, any_tag, comm, st)  # fmt: skip
            if e != 0:
                err[0], err[1], err[2] = _MPI_ERROR, row, e
                return
            report[2 * row] = slen * isz
            report[2 * row + 1] = 1
            if not _arrived(status, tag_at, count, byte, rlen * isz, tag, err, row):
                return
            if reduce:
                _reduce(work[roff : roff + rlen], scratch[:rlen], code, reverse, action, divisor)
            continue
        # A reduce's segments land in the two scratch halves in turn; a store's in place.
        slots = min(2, nrecv) if reduce else nrecv
        e = 0
        for k in range(slots):
            a = k * seg
            n = min(seg, rlen - a)
            at = scratch.ctypes.data + (k % 2) * seg * isz if reduce else base + (roff + a) * isz
            e = mpi_irecv(at, n * isz, byte, src, any_tag, comm, req + k * rsize)
            if e != 0:
                break
            live[k] = 1
        for k in range(nsend if e == 0 else 0):
            a = k * seg
            n = min(seg, slen - a)
            e = mpi_isend(base + (soff + a) * isz, n * isz, byte, dest, tag, comm,
                          req + (slots + k) * rsize)  # fmt: skip
            if e != 0:
                break
            live[slots + k] = 1
        # A reduce whose sent elements are the ones it reduces (recursive doubling)
        # must not change a segment before its send is done.
        same = reduce and soff == roff and slen == rlen and nsend > 0
        overlap = reduce and nsend > 0 and soff < roff + rlen and roff < soff + slen
        waited = 0  # sends waited for, in order
        for k in range(nrecv if e == 0 else 0):
            slot = k % 2 if reduce else k
            e = _wait(req + slot * rsize, st, count[1:], sleepy, timeout)
            if e == _LATE:
                err[0], err[1], err[2], err[3] = _TIMED_OUT, row, src, 0
                break
            live[slot] = 0
            if e != 0:
                break
            a = k * seg
            n = min(seg, rlen - a)
            if not _arrived(status, tag_at, count, byte, n * isz, tag, err, row):
                break
            if reduce:
                upto = nsend if (overlap and not same) else (min(k + 1, nsend) if same else 0)
                while waited < upto and e == 0:
                    e = _wait(req + (slots + waited) * rsize, st, count[1:], sleepy, timeout)
                    if e == _LATE:
                        err[0], err[1], err[2], err[3] = _TIMED_OUT, row, dest, 1
                        break
                    live[slots + waited] = 0
                    report[2 * row] += min(seg, slen - waited * seg) * isz
                    report[2 * row + 1] += 1
                    waited += 1
                if e != 0:
                    break
                half = (k % 2) * seg
                acc = work[roff + a : roff + a + n]
                _reduce(acc, scratch[half : half + n], code, reverse, action, divisor)
                if k + 2 < nrecv:
                    a2 = (k + 2) * seg
                    n2 = min(seg, rlen - a2)
                    e = mpi_irecv(scratch.ctypes.data + half * isz, n2 * isz, byte, src, any_tag,
                                  comm, req + slot * rsize)  # fmt: skip
                    if e != 0:
                        break
                    live[slot] = 1
        while waited < nsend and e == 0 and err[0] == _OK:
            e = _wait(req + (slots + waited) * rsize, st, count[1:], sleepy, timeout)
            if e == _LATE:
                err[0], err[1], err[2], err[3] = _TIMED_OUT, row, dest, 1
                break
            live[slots + waited] = 0
            report[2 * row] += min(seg, slen - waited * seg) * isz
            report[2 * row + 1] += 1
            waited += 1
        if e != 0 and err[0] == _OK:
            err[0], err[1], err[2] = _MPI_ERROR, row, e
        if err[0] != _OK:
            _abandon(requests, rsize, live, slots, status)
            return


# What a half-type exchange folds with (see _exchange_half): [half kind, AVG's
# divisor (0: none), count, where this rank's chunk starts].
_KIND, _AVG_BY, _COUNT, _CHUNK = range(4)


@_jit
def _exchange_half(out, source, slots, table, starts, fold, state, requests, status):
    """Carry out a half type's direct exchange (:func:`ringmpi.plans.direct_exchange`)
    and fold this rank's chunk into ``out`` as it arrives.

    The plan's positions below the count are this rank's input, ``source``, which
    every send reads where it lies (no copy); those from the count on are the
    slots, ``slots``, which every receive fills in place. Each step is a row as in
    :func:`_execute` (segments, the same report). In the last step segment k
    completes every contribution to its elements of the chunk, so as soon as it
    has arrived they are folded (float32, in the rank order of ``starts``, one
    rounding: :func:`ringmpi.kernels.fold_parts`) into ``out`` while segment
    k + 1 arrives. ``fold`` holds the _KIND ... cells; the other arguments are
    :func:`_execute`'s.
    """
    params, report = state[:_NPARAMS], state[_NPARAMS:]
    code, comm, byte, tag = params[_CODE], params[_COMM], params[_BYTE], params[_TAG]
    any_tag, seg, rsize, tag_at = params[_ANY_TAG], params[_SEG], params[_RSIZE], params[_TAG_AT]
    sleepy, timeout = params[_SLEEPY] != 0, params[_TIMEOUT]
    kind, avg_by, count, chunk = fold[_KIND], fold[_AVG_BY], fold[_COUNT], fold[_CHUNK]
    nstat = status.size - 2
    cnt = status[nstat:]  # count, then flag
    isz = source.itemsize
    nslots = requests.size // (rsize + 1)
    live = requests[nslots * rsize :]
    req = requests.ctypes.data
    st = status.ctypes.data
    err = report[report.size - 4 :]
    err[0] = _OK
    last = table.shape[0] - 1
    for row in range(table.shape[0]):
        report[2 * row] = 0
        report[2 * row + 1] = 0
        dest, src = table[row, SEND_TO], table[row, RECV_FROM]
        soff, slen = table[row, SEND_OFF], table[row, SEND_LEN]
        roff, rlen = table[row, RECV_OFF] - count, table[row, RECV_LEN]
        nsend = 0 if dest < 0 else max(1, (slen + seg - 1) // seg)
        nrecv = 0 if src < 0 else max(1, (rlen + seg - 1) // seg)
        sfrom = source.ctypes.data + soff * isz
        rinto = slots.ctypes.data + roff * isz
        if nsend == 1 and nrecv == 1 and not sleepy and timeout == 0:
            e = mpi_sendrecv(sfrom, slen * isz, byte, dest, tag, rinto, rlen * isz, byte, src,
                             any_tag, comm, st)  # fmt: skip
            if e != 0:
                err[0], err[1], err[2] = _MPI_ERROR, row, e
                return
            report[2 * row] = slen * isz
            report[2 * row + 1] = 1
            if not _arrived(status, tag_at, cnt, byte, rlen * isz, tag, err, row):
                return
            if row == last:
                fold_parts(out[chunk : chunk + rlen], source, slots, count, starts, 0, code,
                           kind, avg_by)  # fmt: skip
            continue
        e = 0
        for k in range(nrecv):
            n = min(seg, rlen - k * seg)
            e = mpi_irecv(rinto + k * seg * isz, n * isz, byte, src, any_tag, comm, req + k * rsize)
            if e != 0:
                break
            live[k] = 1
        for k in range(nsend if e == 0 else 0):
            n = min(seg, slen - k * seg)
            e = mpi_isend(sfrom + k * seg * isz, n * isz, byte, dest, tag, comm,
                          req + (nrecv + k) * rsize)  # fmt: skip
            if e != 0:
                break
            live[nrecv + k] = 1
        for k in range(nrecv if e == 0 else 0):
            e = _wait(req + k * rsize, st, cnt[1:], sleepy, timeout)
            if e == _LATE:
                err[0], err[1], err[2], err[3] = _TIMED_OUT, row, src, 0
                break
            live[k] = 0
            if e != 0:
                break
            a = k * seg
            n = min(seg, rlen - a)
            if not _arrived(status, tag_at, cnt, byte, n * isz, tag, err, row):
                break
            if row == last:
                fold_parts(out[chunk + a : chunk + a + n], source, slots, count, starts, a, code,
                           kind, avg_by)  # fmt: skip
        for k in range(nsend if e == 0 and err[0] == _OK else 0):
            e = _wait(req + (nrecv + k) * rsize, st, cnt[1:], sleepy, timeout)
            if e == _LATE:
                err[0], err[1], err[2], err[3] = _TIMED_OUT, row, dest, 1
                break
            live[nrecv + k] = 0
            if e != 0:
                break
            report[2 * row] += min(seg, slen - k * seg) * isz
            report[2 * row + 1] += 1
        if e != 0 and err[0] == _OK:
            err[0], err[1], err[2] = _MPI_ERROR, row, e
        if err[0] != _OK:
            _abandon(requests, rsize, live, nrecv, status)
            return


def segment_bytes() -> int:
    """The segment size: the ``segment_bytes`` setting or the measured default."""
    return min(current().segment_bytes or SEGMENT_BYTES, _MAX_SEGMENT)


class _Shape:
    """What stays fixed between calls of one shape (plan, op and dtype, segment)."""

    def __init__(self, plan: Plan, red: Reduction, ctx, engine: _Engine, seg_bytes: int,
                 timeout: float) -> None:  # fmt: skip
        a = engine.abi
        lanes = red.lanes(np.zeros(0, red.dtype)).dtype
        w = red.lanes(np.zeros(1, red.dtype)).size
        seg = max(1, seg_bytes // lanes.itemsize)
        table = plan.table
        self.plan, self.red, self.seg_bytes, self.timeout = plan, red, seg_bytes, timeout
        self.tag = ctx.tag(red, plan.count)
        fixed = {_CODE: red.code, _COMM: engine.comm, _BYTE: a.byte, _TAG: self.tag,
                 _ANY_TAG: a.any_tag, _SEG: seg, _RSIZE: a.request_size,
                 _TAG_AT: a.tag_offset // 4, _SLEEPY: int(ctx.sleepy), _LANES: w,
                 _TIMEOUT: round(timeout * 1e9)}  # fmt: skip
        # The fixed arguments, then what each call reports (see _execute).
        self.state = np.zeros(_NPARAMS + 2 * len(table) + 4, np.int64)
        self.state[list(fixed)] = list(fixed.values())
        self.report = self.state[_NPARAMS:]  # fmt: skip
        self.divisor = red.divisor(ctx.size)
        # Two segments of scratch, or two of the longest message reduced if shorter.
        reduced = table[table[:, ACTION] & REDUCE != 0, RECV_LEN] * w
        longest = min(seg, int(reduced.max())) if len(reduced) else 0
        self.scratch = engine.scratch(2 * longest * lanes.itemsize).view(lanes)
        self.split = w != 1
        self.fold: np.ndarray | None = None  # a half-type exchange's (run_half)
        engine.slots(_slots(table, w, seg))


class _Engine:
    """One communicator's request and status memory, and its call shapes."""

    def __init__(self, ctx) -> None:
        a = abi()
        self.abi = a
        self.comm = handle(ctx.comm)
        self.requests = np.zeros(0, np.uint8)  # the request slots, then a live flag each
        self.nslots = 0
        self.status = np.zeros(max(a.status_size, 64) // 4 + 2, np.int32)
        self.shapes: Bounded[tuple, _Shape] = Bounded(_SHAPES_KEPT)
        self._scratch = np.zeros(0, np.uint8)

    def scratch(self, nbytes: int) -> np.ndarray:
        """``nbytes`` of receive buffer. A shape keeps its view: when a later shape
        needs more, the buffer is replaced and the older views keep the old one."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.zeros(nbytes, np.uint8)
        return self._scratch[:nbytes]

    def slots(self, n: int) -> None:
        if self.nslots < n:
            self.requests = np.zeros(n * (self.abi.request_size + 1), np.uint8)
            self.nslots = n

    def shape(self, plan: Plan, red: Reduction, ctx, timeout: float) -> _Shape:
        """The shape of a call: the plan, the reduction, the segment and the timeout."""
        seg = segment_bytes()
        key = (plan, red.tag, seg, timeout)
        found = self.shapes.get(key)
        if found is None:
            found = self.shapes.put(key, _Shape(plan, red, ctx, self, seg, timeout))
        return found

    def free(self) -> None:
        self.shapes.clear()


_SHAPES_KEPT = 64


def _slots(table: np.ndarray, w: int, seg: int) -> int:
    """Request slots the engine needs for ``table``: a row's receives plus its sends."""
    if len(table) == 0:
        return 0

    def parts(length: np.ndarray) -> np.ndarray:
        return np.maximum(1, -(-(length * w) // seg))

    sends = np.where(table[:, SEND_TO] >= 0, parts(table[:, SEND_LEN]), 0)
    recvs = np.where(table[:, RECV_FROM] >= 0, parts(table[:, RECV_LEN]), 0)
    recvs = np.where(table[:, ACTION] & REDUCE, np.minimum(2, recvs), recvs)
    return int((sends + recvs).max())


def run(
    plan: Plan,
    work: np.ndarray,
    red: Reduction,
    ctx,
    algorithm: str,
    timeout: float = 0.0,
    *,
    prefix: str = "",
    peers=None,
    source: np.ndarray | None = None,
) -> None:
    """Carry out ``plan`` on ``work`` (1-D, contiguous) over ``ctx``'s communicator;
    this rank's contribution is ``source`` (copied into ``work`` first) or ``work``;
    a wait without progress for ``timeout`` seconds raises (0: none).

    ``peers`` maps ranks of ``ctx`` to ranks the user knows (the caller's
    communicator), for the trace and the error messages.
    """
    if not len(plan.table):
        if source is not None:
            np.copyto(work, source)
        return
    shape = _engine_of(ctx).shape(plan, red, ctx, timeout)
    report = shape.report
    into, source = work, work if source is None else source
    if shape.split:
        into, source = red.lanes(into), red.lanes(source)
    engine = ctx.engine
    _execute(into, source, plan.table, shape.scratch, shape.divisor, shape.state,
             engine.requests, engine.status)  # fmt: skip
    failed = report.item(-4) != _OK
    if _trace._active:
        _record(plan, report, algorithm, prefix, peers or range(ctx.size))
    if failed:
        _raise(report[-4:], plan, work, ctx, shape, algorithm, prefix, peers or range(ctx.size))


def run_half(
    plan: Plan,
    out: np.ndarray,
    source: np.ndarray,
    slots: np.ndarray,
    starts: np.ndarray,
    chunk: int,
    red: Reduction,
    ctx,
    algorithm: str,
    timeout: float = 0.0,
) -> None:
    """Carry out a half type's direct exchange ``plan`` (16-bit patterns: ``out``,
    ``source`` and ``slots`` as uint16): sends read ``source``, receives fill
    ``slots``, and this rank's chunk (from ``chunk`` on) is folded into ``out`` from
    the contributions at ``starts`` as its segments arrive (:func:`_exchange_half`)."""
    engine = _engine_of(ctx)
    shape = engine.shape(plan, red, ctx, timeout)
    fold = shape.fold
    if fold is None:
        fold = shape.fold = np.zeros(4, np.int64)
        fold[[_KIND, _AVG_BY, _COUNT]] = red.half, red.avg_divisor(ctx.size), plan.count
    fold[_CHUNK] = chunk
    report = shape.report
    _exchange_half(out, source, slots, plan.table, starts, fold, shape.state, engine.requests,
                   engine.status)  # fmt: skip
    failed = report.item(-4) != _OK
    if _trace._active:
        _record(plan, report, algorithm, "", range(ctx.size))
    if failed:
        _raise(report[-4:], plan, out, ctx, shape, algorithm, "", range(ctx.size))


def prepare(plan: Plan, red: Reduction, ctx, algorithm: str, timeout: float = 0.0):
    """A function ``again(work, source)`` that carries out ``plan`` once more, on
    buffers of the same size and dtype, with the least Python (the API's path for
    a call that repeats the last one, on the same arrays; no trace). None when the
    plan is empty."""
    if not len(plan.table):
        return None
    engine = _engine_of(ctx)
    shape = engine.shape(plan, red, ctx, timeout)
    table, scratch, divisor, state, report = (
        plan.table, shape.scratch, shape.divisor, shape.state, shape.report,
    )  # fmt: skip
    lanes, split = red.lanes, shape.split
    entry = None  # the compiled loop's entry point for these arrays' types

    def again(work: np.ndarray, source: np.ndarray) -> None:
        nonlocal entry
        into, src = (lanes(work), lanes(source)) if split else (work, source)
        args = (into, src, table, scratch, divisor, state, engine.requests, engine.status)
        if entry is None:  # past Numba's dispatcher from now on: the types stay
            entry = _execute.compile(tuple(numba.typeof(a) for a in args))
        entry(*args)
        if report.item(-4) != _OK:
            _raise(report[-4:], plan, work, ctx, shape, algorithm, "", range(ctx.size))

    return again


def _engine_of(ctx) -> _Engine:
    """The communicator's engine state (made on first use)."""
    engine = ctx.engine
    if engine is None:
        engine = ctx.engine = _Engine(ctx)
    return engine


def _record(plan: Plan, report: np.ndarray, algorithm: str, prefix: str, peers) -> None:
    """Trace the sends the rows really made (up to a failed row)."""
    table = plan.table
    last = int(report[-3]) if report[-4] != _OK else len(table) - 1
    for row in range(last + 1):
        r = table[row]
        if r[SEND_TO] >= 0:
            _trace.record(algorithm, prefix + plan.phases[r[PHASE]], int(r[STEP]),
                          peers[int(r[SEND_TO])], int(report[2 * row]),
                          int(report[2 * row + 1]))  # fmt: skip


def _raise(
    err, plan: Plan, work: np.ndarray, ctx, shape: _Shape, algorithm: str, prefix: str, peers
) -> None:
    """Raise the RingMPIError ``err`` reports. The communicator is broken off first:
    the other ranks may still be sending this call's messages."""
    what, row = int(err[0]), int(err[1])
    r = plan.table[row]
    where = (
        f"rank {peers[ctx.rank]}: {algorithm} {prefix}{plan.phases[r[PHASE]]} step {int(r[STEP])}"
    )
    src = int(r[RECV_FROM])
    peer = peers[src] if src >= 0 else None
    expected = int(r[RECV_LEN]) * work.itemsize
    if what == _TIMED_OUT:
        other = peers[int(err[2])]
        raise timed_out(ctx, shape.timeout, where, f"rank {other} to take its message" if err[3]
                        else f"rank {other}'s message")  # fmt: skip
    if what == _WRONG_COUNT:
        said = (f"rank {peer} sent {int(err[2])} bytes in a segment of {int(err[3])}; "
                "ranks disagree on count or dtype")  # fmt: skip
    elif what == _WRONG_TAG:
        said = f"message from rank {peer}: " + ctx.disagreement(int(err[2]), shape.tag)
    elif MPI.Get_error_class(int(err[2])) in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS):
        said = (f"rank {peer} sent more than the {expected} bytes expected; "
                "ranks disagree on count or dtype")  # fmt: skip
    else:
        said = f"MPI error: {MPI.Get_error_string(int(err[2]))}"
    ctx.break_off(f"{where}: {said}")
    raise RingMPIError(f"{where}: {said}")


def lane_kinds(red: Reduction | None) -> set[np.dtype]:
    """The dtypes compiled loops see for ``red`` (the lanes it runs on), or for every
    reduction when None: every dtype, and the real lanes complex SUM and AVG run on."""
    if red is not None:
        return {red.lanes(np.zeros(1, red.dtype)).dtype}
    return set(DTYPES) | {np.dtype(np.float32), np.dtype(np.float64)}


def warm(red: Reduction | None = None) -> float:
    """Compile (or load from Numba's cache) the engine for ``red``'s dtype, or for
    every dtype when None; returns the seconds it took."""
    t0 = time.perf_counter()
    kinds = lane_kinds(red)
    table = np.zeros((0, 9), np.int64)
    i64, i32, u8 = np.zeros(1, np.int64), np.zeros(1, np.int32), np.zeros(1, np.uint8)
    for dt in kinds:
        arr = np.zeros(1, dt)
        _execute.compile(tuple(numba.typeof(a) for a in (arr, arr, table, arr, arr, i64, u8, i32)))
    if red is None or red.half:
        h = np.zeros(1, np.uint16)
        _exchange_half.compile(
            tuple(numba.typeof(a) for a in (h, h, h, table, i64, i64, i64, u8, i32))
        )
    return time.perf_counter() - t0
