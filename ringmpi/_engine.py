"""The step engine: one compiled loop carries out any plan, calling MPI's C functions.

A plan (:mod:`ringmpi.plans`) says per step what to send where and what to
receive from whom, and whether to store or reduce it. :func:`run` hands the
plan, the buffer and the communicator's C handle to :func:`_execute`, a
Numba-compiled loop that calls MPI_Isend, MPI_Irecv and MPI_Wait through the C
ABI (:mod:`ringmpi._capi`) and reduces with the op's compiled kernel: no
interpreter between steps, so a step costs what it costs in C. It is compiled
once per dtype (the op is a number) and cached on disk. (Numba's cache checks
only this file's time stamp: a change to the ops in :mod:`ringmpi._ops` or
:mod:`ringmpi._half` needs this file touched, or its cache cleared, to reach
the engine.)

Every message is sent in **segments** of at most ``RINGMPI_SEGMENT_BYTES``
(both sides cut a message of the same length alike). A reduce receives
segments into two scratch buffers in turn, and reduces segment k while segment
k + 1 is arriving: the reduce overlaps the transfer, as in Gloo's and NCCL's
pipelined rings. A store receives every segment straight into place. The half
types' direct exchange is rows of its own kind (FROM_INPUT, TO_SLOTS, FOLD in
:mod:`ringmpi.plans`): sends read the input where it lies, receives land in
slots, and each segment of the last step is folded as soon as it arrives.

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
from ._half import fold_half_parts
from ._ops import combine_by_code, divide_by
from ._report import (
    CELLS,
    HEADER,
    MPI_ERROR,
    OK,
    TIMED_OUT,
    WRONG_COUNT,
    WRONG_TAG,
    header,
    parameters,
    raise_from,
)
from ._settings import current
from .kernels import DTYPES, Reduction
from .plans import (
    ACTION,
    FINAL,
    FOLD,
    FROM_INPUT,
    OWN_FROM_INPUT,
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
    TO_SLOTS,
    Plan,
)

__all__ = ["SEGMENT_BYTES", "prepare", "run", "segment_bytes"]

# Segment of every message, bytes (RINGMPI_SEGMENT_BYTES); docs/performance.md
# has the measurement behind the default.
SEGMENT_BYTES = 1 << 20
_MAX_SEGMENT = 1 << 30  # MPI counts are C ints

# What _wait returns for a request that did not complete in time, or (asked not to
# wait) has not completed yet (MPI error codes are >= 0).
_LATE, _NOT_YET = -1, -2
# Polls of MPI_Test before a waiting rank yields its core between polls (as the
# node's flag waits do: ringmpi._shm).
_SPINS = 100

_jit = numba.njit(cache=True, nogil=True, error_model="numpy")


@_jit
def _wait(request, status, flag, sleepy, timeout, nowait):
    """Complete ``request``: its MPI error code, or _LATE after ``timeout`` ns
    without completing (0: no limit), or, with ``nowait``, _NOT_YET where one
    MPI_Test does not complete it."""
    if nowait:
        e = mpi_test(request, flag.ctypes.data, status)
        return e if e != 0 or flag[0] != 0 else _NOT_YET
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
    not, ``err`` says which differs (its rank cell is the caller's)."""
    mpi_get_count(status.ctypes.data, byte, count.ctypes.data)
    if count[0] != nbytes:
        err[0], err[1], err[3], err[4] = WRONG_COUNT, row, count[0], nbytes
        return False
    if status[tag_at] != tag:
        err[0], err[1], err[3] = WRONG_TAG, row, status[tag_at]
        return False
    return True


@_jit
def _sent(upto, waited, req, slots, rsize, st, cnt, sleepy, timeout, nowait, live, cells, seg,
          slen, isz, err, row, dest):  # fmt: skip
    """Complete a row's sends ``waited`` .. ``upto`` - 1 in order, counting what each sent
    (a segment of the ``slen`` elements): (MPI's error code, _LATE or _NOT_YET, sends
    done)."""
    e = 0
    while waited < upto:
        e = _wait(req + (slots + waited) * rsize, st, cnt[1:], sleepy, timeout, nowait)
        if e == _NOT_YET:
            break
        if e == _LATE:
            err[0], err[1], err[2], err[3] = TIMED_OUT, row, dest, 1
            break
        live[slots + waited] = 0
        if e != 0:
            break
        cells[_SENT] += min(seg, slen - waited * seg) * isz
        cells[_MESSAGES] += 1
        waited += 1
    return e, waited


@_jit
def _reduce(acc, inp, code, reverse, action, divisor):
    """``acc (op) inp`` in the row's order; AVG divides the finished elements."""
    combine_by_code(acc, inp, code, reverse)
    if (action & FINAL) != 0 and divisor.size > 0:
        divide_by(acc, divisor)


# The fixed arguments of a call shape, packed into one int64 array (fewer
# arguments: Numba's dispatcher pays per argument, on every call): the one header
# (ringmpi._report), then the engine's own cells. A plan whose rows fold the half
# types (FOLD) adds its count (where the slots begin), where this rank's chunk
# starts, and how many contribution starts follow the parameters. A call asked not
# to wait (_NOWAIT) leaves where it returned: its row, the row's stage, the receive it
# waits for (or has just completed) and the sends it has waited for.
(_COMM, _BYTE, _ANY_TAG, _SEG, _RSIZE, _TAG_AT, _LANES, _COPY, _COUNT, _CHUNK, _NSTARTS, _TIMED,
 _AT_ROW, _AT_STAGE, _AT_K, _AT_WAITED, _NOWAIT, _NPARAMS) = range(HEADER, HEADER + 18)  # fmt: skip
# A row's stages: not begun; waiting for receive k; receive k in, its sends to wait
# for before reducing; every receive in, the last sends to wait for.
_NEW, _RECEIVING, _SENDS_FIRST, _SENDS_LAST = range(4)
# A row's cells in the report: bytes and messages sent, then (a traced call only)
# when it started and ended and the nanoseconds it spent reducing.
_SENT, _MESSAGES, _STARTED, _ENDED, _REDUCING, _ROW = range(6)


@_jit
def _execute(work, source, table, scratch, divisor, state, requests, status):
    """Carry out ``table`` (a plan) on ``work``, which first gets a copy of ``source``
    (where the plan's rows never read ``source`` themselves); the other arguments are
    fixed per call shape.

    ``state`` holds the parameters, then the contributions' starts of a FOLD plan,
    then the report. The parameters: the header (ringmpi._report: the op's number,
    the tag, whether to wait sleepily, the timeout in ns, the half type and AVG's
    divisor of a FOLD plan), then (the _COMM ... names) the communicator's and
    MPI_BYTE's handles, MPI_ANY_TAG, the segment in elements of ``work``, the size
    of an MPI_Request, where the tag sits in ``status`` (an MPI_Status seen as
    int32s, followed by two int32 cells for a count and a flag), the lanes per
    element of the plan's offsets, whether to copy ``source`` in first, a FOLD
    plan's cells, and whether to time the rows (a traced call).
    ``scratch`` holds two segments of a reduce, or a TO_SLOTS plan's slots.
    ``requests`` holds the request slots, then a live flag per slot: the
    receives' slots first (all of a store's segments, or two for a reduce), then
    one per segment sent. In the report, ``_ROW`` cells a row count the bytes and
    messages it really sent and, timed, its monotonic start and end and its time
    reducing, in ns; the last cells say what went wrong, if anything
    (:mod:`ringmpi._report`; the step is the row).

    Row flags beyond REDUCE: FROM_INPUT sends read ``source`` where it lies;
    OWN_FROM_INPUT reduces take this rank's operand from ``source``;
    TO_SLOTS receives land in ``scratch`` (offsets from the count on); FOLD folds
    each arrived segment's elements of this rank's chunk into ``work`` from every
    contribution (the half types' one rounding, :func:`ringmpi._half.fold_parts`),
    while the next segment arrives.

    With _NOWAIT set, a request that one MPI_Test does not complete ends the call
    where it stands (_AT_ROW ...); the next call on the same arrays goes on from
    there, so that a nonblocking call progresses in its tests. The blocking call is
    the same loop, waiting.
    """
    code, tag, sleepy, timeout, kind, avg_by, err = header(state)
    params = state[:_NPARAMS]
    starts = state[_NPARAMS : _NPARAMS + params[_NSTARTS]]
    report = state[_NPARAMS + params[_NSTARTS] :]  # the rows' cells, then the error's
    comm, byte, w, timed = params[_COMM], params[_BYTE], params[_LANES], params[_TIMED] != 0
    any_tag, seg, rsize, tag_at = params[_ANY_TAG], params[_SEG], params[_RSIZE], params[_TAG_AT]
    count, chunk = params[_COUNT], params[_CHUNK]
    nowait = params[_NOWAIT] != 0
    nstat = status.size - 2
    cnt = status[nstat:]  # count, then flag
    isz = work.itemsize
    base = work.ctypes.data
    nslots = requests.size // (rsize + 1)
    live = requests[nslots * rsize :]  # a flag per request slot, after the slots
    req = requests.ctypes.data
    st = status.ctypes.data
    err[0] = OK
    row, stage, k, waited = params[_AT_ROW], params[_AT_STAGE], params[_AT_K], params[_AT_WAITED]
    params[_AT_ROW] = params[_AT_STAGE] = 0  # unless it returns at a wait (below)
    if row == 0 and stage == _NEW and params[_COPY] != 0 and source.ctypes.data != base:
        for i in range(work.size):
            work[i] = source[i]
    while row < table.shape[0]:
        cells = report[row * _ROW : (row + 1) * _ROW]
        dest, src, action = table[row, SEND_TO], table[row, RECV_FROM], table[row, ACTION]
        err[2] = src if src >= 0 else dest  # the rank a report names, unless it says
        soff, slen = table[row, SEND_OFF] * w, table[row, SEND_LEN] * w
        roff, rlen = table[row, RECV_OFF] * w, table[row, RECV_LEN] * w
        nsend = 0 if dest < 0 else max(1, (slen + seg - 1) // seg)
        nrecv = 0 if src < 0 else max(1, (rlen + seg - 1) // seg)
        reduce = (action & REDUCE) != 0
        reverse = (action & THEIRS_FIRST) != 0
        fold = (action & FOLD) != 0
        own = (action & OWN_FROM_INPUT) != 0
        sbase = source.ctypes.data if (action & FROM_INPUT) != 0 else base
        rbase = base
        if (action & TO_SLOTS) != 0:
            rbase, roff = scratch.ctypes.data, roff - count * w
        # A reduce's segments land in the two scratch halves in turn; a store's in place.
        slots = min(2, nrecv) if reduce else nrecv
        # A reduce whose sent elements are the ones it reduces (recursive doubling)
        # must not change a segment before its send is done.
        same = reduce and soff == roff and slen == rlen and nsend > 0
        overlap = reduce and nsend > 0 and soff < roff + rlen and roff < soff + slen
        e = 0
        if stage == _NEW:
            cells[:] = 0
            if timed:
                cells[_STARTED] = monotonic_ns()
            if nsend == 1 and nrecv == 1 and not sleepy and timeout == 0 and not nowait:
                # One segment each way: one MPI_Sendrecv (cheaper than two requests).
                at = scratch.ctypes.data if reduce else rbase + roff * isz
                e = mpi_sendrecv(sbase + soff * isz, slen * isz, byte, dest, tag, at, rlen * isz,
                                 byte, src, any_tag, comm, st)  # fmt: skip
                if e != 0:
                    err[0], err[1], err[3], err[4] = MPI_ERROR, row, e, rlen * isz
                    return
                cells[_SENT] = slen * isz
                cells[_MESSAGES] = 1
                if not _arrived(status, tag_at, cnt, byte, rlen * isz, tag, err, row):
                    return
                t = monotonic_ns() if timed else 0
                if reduce:
                    if own:
                        work[roff : roff + rlen] = source[roff : roff + rlen]
                    _reduce(work[roff : roff + rlen], scratch[:rlen], code, reverse, action,
                            divisor)  # fmt: skip
                elif fold:
                    fold_half_parts(work[chunk : chunk + rlen], source, scratch, count, starts, 0,
                                    code, kind, avg_by)  # fmt: skip
                if timed:
                    cells[_ENDED] = monotonic_ns()
                    cells[_REDUCING] = cells[_ENDED] - t if reduce or fold else 0
                row += 1
                continue
            for j in range(slots):
                a = j * seg
                n = min(seg, rlen - a)
                at = (scratch.ctypes.data + (j % 2) * seg * isz if reduce
                      else rbase + (roff + a) * isz)  # fmt: skip
                e = mpi_irecv(at, n * isz, byte, src, any_tag, comm, req + j * rsize)
                if e != 0:
                    break
                live[j] = 1
            for j in range(nsend if e == 0 else 0):
                a = j * seg
                n = min(seg, slen - a)
                e = mpi_isend(sbase + (soff + a) * isz, n * isz, byte, dest, tag, comm,
                              req + (slots + j) * rsize)  # fmt: skip
                if e != 0:
                    break
                live[slots + j] = 1
            stage, k, waited = _RECEIVING, 0, 0  # sends waited for, in order
        while e == 0 and k < nrecv:
            slot = k % 2 if reduce else k
            a = k * seg
            n = min(seg, rlen - a)
            if stage == _RECEIVING:
                e = _wait(req + slot * rsize, st, cnt[1:], sleepy, timeout, nowait)
                if e == _NOT_YET:
                    break
                if e == _LATE:
                    err[0], err[1], err[2], err[3] = TIMED_OUT, row, src, 0
                    break
                live[slot] = 0
                if e != 0:
                    break
                if not _arrived(status, tag_at, cnt, byte, n * isz, tag, err, row):
                    break
                if fold:
                    t = monotonic_ns() if timed else 0
                    fold_half_parts(work[chunk + a : chunk + a + n], source, scratch, count,
                                    starts, a, code, kind, avg_by)  # fmt: skip
                    if timed:
                        cells[_REDUCING] += monotonic_ns() - t
                stage = _SENDS_FIRST
            if reduce:
                upto = nsend if (overlap and not same) else (min(k + 1, nsend) if same else 0)
                e, waited = _sent(upto, waited, req, slots, rsize, st, cnt, sleepy, timeout,
                                  nowait, live, cells, seg, slen, isz, err, row,
                                  dest)  # fmt: skip
                if e != 0:
                    break
                half = (k % 2) * seg
                acc = work[roff + a : roff + a + n]
                t = monotonic_ns() if timed else 0
                if own:
                    acc[:] = source[roff + a : roff + a + n]
                _reduce(acc, scratch[half : half + n], code, reverse, action, divisor)
                if timed:
                    cells[_REDUCING] += monotonic_ns() - t
                if k + 2 < nrecv:
                    a2 = (k + 2) * seg
                    n2 = min(seg, rlen - a2)
                    e = mpi_irecv(scratch.ctypes.data + half * isz, n2 * isz, byte, src, any_tag,
                                  comm, req + slot * rsize)  # fmt: skip
                    if e != 0:
                        break
                    live[slot] = 1
            k += 1
            stage = _RECEIVING
        if e == 0 and err[0] == OK:
            stage = _SENDS_LAST
            e, waited = _sent(nsend, waited, req, slots, rsize, st, cnt, sleepy, timeout, nowait,
                              live, cells, seg, slen, isz, err, row, dest)  # fmt: skip
        if e == _NOT_YET:  # asked not to wait: the next call goes on from here
            params[_AT_ROW], params[_AT_STAGE], params[_AT_K], params[_AT_WAITED] = (
                row, stage, k, waited)  # fmt: skip
            return
        if timed:
            cells[_ENDED] = monotonic_ns()
        if e != 0 and err[0] == OK:
            err[0], err[1], err[3], err[4] = MPI_ERROR, row, e, rlen * isz
        if err[0] != OK:
            _abandon(requests, rsize, live, slots, status)
            return
        row += 1
        stage = _NEW


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
        own = {_COMM: engine.comm, _BYTE: a.byte, _ANY_TAG: a.any_tag, _SEG: seg,
               _RSIZE: a.request_size, _TAG_AT: a.tag_offset // 4, _LANES: w,
               _COPY: int(not (table[:, ACTION] & (FROM_INPUT | OWN_FROM_INPUT)).any()),
               _COUNT: plan.count, _CHUNK: plan.chunk, _NSTARTS: len(plan.starts)}  # fmt: skip
        # The header and the engine's cells, the contributions' starts, then what each
        # call reports.
        params = _NPARAMS + len(plan.starts)
        self.state = parameters(params + _ROW * len(table), code=red.code, tag=self.tag,
                                sleepy=ctx.sleepy, timeout=timeout, half=red.half,
                                avg_by=red.avg_divisor(ctx.size) if red.half else 0)  # fmt: skip
        self.state[list(own)] = list(own.values())
        self.state[_NPARAMS:params] = plan.starts
        self.report = self.state[params:]
        self.divisor = red.divisor(ctx.size)
        # Two segments of scratch, or two of the longest message reduced if shorter;
        # or the slots of the receives that land there.
        reduced = table[table[:, ACTION] & REDUCE != 0, RECV_LEN] * w
        longest = min(seg, int(reduced.max())) if len(reduced) else 0
        into = table[table[:, ACTION] & TO_SLOTS != 0]
        held = int((into[:, RECV_OFF] + into[:, RECV_LEN]).max()) - plan.count if len(into) else 0
        self.scratch = engine.scratch(max(2 * longest, held * w) * lanes.itemsize).view(lanes)
        self.split = lanes != red.dtype  # complex SUM as reals, the half types as patterns
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
    traced = bool(_trace._active)
    if traced:  # the rows time themselves for this call only
        shape.state[_TIMED] = 1
    _execute(into, source, plan.table, shape.scratch, shape.divisor, shape.state,
             engine.requests, engine.status)  # fmt: skip
    failed = report.item(-CELLS) != OK
    if traced:
        shape.state[_TIMED] = 0
        _record(plan, report, algorithm, prefix, peers or range(ctx.size))
    if failed:
        _raise(report[-CELLS:], plan, ctx, shape, algorithm, prefix, peers or range(ctx.size))


def prepare(plan: Plan, red: Reduction, ctx, algorithm: str, timeout: float = 0.0, *,
            prefix: str = "", peers=None):  # fmt: skip
    """A function ``step(work, source, wait=True)`` that carries out ``plan`` once more
    on 1-D arrays of the plan's count and dtype (``source is work``: in place), with
    the least Python: to its end (the API's repeat of a call on the same arrays,
    checked by the caller; no trace), or, ``wait`` False, as far as it goes without
    waiting for another rank, the next call going on from there (a nonblocking
    call's tests, :mod:`ringmpi._progress`). Returns whether it is done (None, from
    a test's first step: not arrays of this call, nothing done). An empty plan (one
    rank) only copies the contribution in. ``prefix`` and ``peers``: as for :func:`run`."""
    count, dtype = plan.count, red.dtype
    if not len(plan.table):

        def copy(work: np.ndarray, source: np.ndarray, wait: bool = True) -> bool | None:
            if not wait and (work.dtype != dtype or work.size != count or source.size != count):
                return None
            _copy_in(work, source)
            return True

        return copy
    engine = _engine_of(ctx)
    shape = engine.shape(plan, red, ctx, timeout)
    table, scratch, divisor, state, report = (
        plan.table, shape.scratch, shape.divisor, shape.state, shape.report,
    )  # fmt: skip
    lanes, split = red.lanes, shape.split
    peers = peers or range(ctx.size)
    entry = None  # the compiled loop's entry point for these arrays' types

    def step(work: np.ndarray, source: np.ndarray, wait: bool = True) -> bool | None:
        nonlocal entry
        # A repeat's arrays were checked by its caller; a test's first step checks them.
        if (
            not wait
            and state[_AT_STAGE] == _NEW
            and (work.dtype != dtype or work.size != count or source.size != count)
        ):
            return None
        into, src = (lanes(work), lanes(source)) if split else (work, source)
        args = (into, src, table, scratch, divisor, state, engine.requests, engine.status)
        if entry is None:  # past Numba's dispatcher from now on: the types stay
            entry = _execute.compile(tuple(numba.typeof(a) for a in args))
        if wait:
            entry(*args)
        else:
            state[_NOWAIT] = 1
            entry(*args)
            state[_NOWAIT] = 0
        if report.item(-CELLS) != OK:
            _raise(report[-CELLS:], plan, ctx, shape, algorithm, prefix, peers)
        return state.item(_AT_STAGE) == _NEW

    return step


def _copy_in(work: np.ndarray, source: np.ndarray) -> None:
    if source is not work:
        np.copyto(work, source)


def _engine_of(ctx) -> _Engine:
    """The communicator's engine state (made on first use)."""
    engine = ctx.engine
    if engine is None:
        engine = ctx.engine = _Engine(ctx)
    return engine


def _record(plan: Plan, report: np.ndarray, algorithm: str, prefix: str, peers) -> None:
    """Trace the sends the rows really made (up to a failed row), and when each row
    ran."""
    table = plan.table
    last = int(report[1 - CELLS]) if report[-CELLS] != OK else len(table) - 1
    for row in range(last + 1):
        r = table[row]
        c = report[row * _ROW : (row + 1) * _ROW]
        phase, step = prefix + plan.phases[r[PHASE]], int(r[STEP])
        to = peers[int(r[SEND_TO])] if r[SEND_TO] >= 0 else -1
        if to >= 0:
            _trace.record(algorithm, phase, step, to, int(c[_SENT]), int(c[_MESSAGES]))
        frm = peers[int(r[RECV_FROM])] if r[RECV_FROM] >= 0 else -1
        _trace.record_span(algorithm, phase, step, int(c[_STARTED]), int(c[_ENDED]),
                           sent_to=to, nbytes=int(c[_SENT]), received_from=frm,
                           reducing=int(c[_REDUCING]))  # fmt: skip


def _raise(cells, plan: Plan, ctx, shape: _Shape, algorithm: str, prefix: str, peers) -> None:
    """Raise what a call's report says, in the plan's words (phase and step)."""

    def where(row: int) -> str:
        r = plan.table[row]
        return f"rank {peers[ctx.rank]}: {algorithm} {prefix}{plan.phases[r[PHASE]]} step {r[STEP]}"

    raise_from(cells, ctx, shape.timeout, where, lambda r: f"rank {peers[r]}", tag=shape.tag)


def lane_kinds(red: Reduction | None) -> set[np.dtype]:
    """The dtypes compiled loops see for ``red`` (the lanes it runs on), or for every
    reduction when None: every dtype, and the real lanes complex SUM and AVG run on."""
    if red is not None:
        return {red.lanes(np.zeros(1, red.dtype)).dtype}
    return set(DTYPES) | {np.dtype(np.float32), np.dtype(np.float64)}


def warm(kinds: set[np.dtype]) -> float:
    """Compile (or load from Numba's cache) the engine for the lanes dtypes ``kinds``
    (:func:`lane_kinds`), and where MPI runs, probe its C ABI (:func:`abi`, a message
    to self); returns the seconds it took."""
    t0 = time.perf_counter()
    if MPI.Is_initialized() and not MPI.Is_finalized():
        abi()
    table = np.zeros((0, 9), np.int64)
    i64, i32, u8 = np.zeros(1, np.int64), np.zeros(1, np.int32), np.zeros(1, np.uint8)
    for dt in kinds:
        arr = np.zeros(1, dt)
        _execute.compile(tuple(numba.typeof(a) for a in (arr, arr, table, arr, arr, i64, u8, i32)))
    return time.perf_counter() - t0
