"""Fused buckets: ``allreduce_many`` reduces many arrays in a few collectives.

A training step all-reduces one gradient per parameter: 200 arrays of a few
KiB each. One collective per array pays the latency (alpha in the cost model)
200 times for very little data. Like Horovod's tensor fusion and PyTorch DDP's
buckets, ``allreduce_many`` packs the arrays into a few contiguous *buckets*
of at most ``bucket_bytes`` each, reduces each bucket with one ringmpi
all-reduce, and copies the results back::

    arrays       a0 (f4, 3 KiB)  a1 (f8, 8 KiB)  a2 (f4, 40 KiB)  a3 (f4, 9 MiB)  a4 (f4, 1 KiB)
    collectives  a3 (float32, in place)  [a0 a2 a4] (float32, packed)  [a1] (float64, packed)

The layout -- the *plan* -- is a pure function of the call's signature (the
arrays' shapes and dtypes in list order, the op, ``bucket_bytes``, the
algorithm, reproducible mode):

- dtypes in order of first appearance in the list;
- within a dtype, first each array of ``bucket_bytes`` or more, alone and in
  place (no copy), in list order; then the others, packed in list order into
  a bucket until the next one would not fit, when a new bucket starts;
- empty arrays take no part.

Every rank therefore runs the same collectives in the same order, provided
every rank passed the same signature. That is checked before anything is
sent, by one small all-reduce (ringmpi's own) of a 64-bit digest of the signature
(its maximum and the maximum of its negation, which differ exactly when the
ranks disagree) together with a flag for a rank that found a local mistake
(a read-only array, an op its dtype does not take): then every rank raises,
after one all-gather that lets each name what differs -- none hangs, none
reduces a mismatched bucket.

Plans are kept (the last few signatures), and with them the pack buffers: a
training loop that calls with the same arrays every step allocates nothing
after the first, and the per-bucket all-reduces take ringmpi's repeat path
(same buffer objects each time). One pack buffer per dtype, as large as that
dtype's largest bucket, is shared by its buckets in turn (they are reduced one
after another), so it stays in cache between packing, reducing and unpacking.

``python -m ringmpi buckets`` benchmarks fused buckets against one ringmpi
call per array and one ``MPI_Allreduce`` per array (docs/performance.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _settings, algorithms, kernels
from ._api import Allreduce, _as_array
from ._cache import Bounded
from ._comm import Context, check_comm, context
from ._errors import RingMPIError

__all__ = ["BUCKET_BYTES", "allreduce_many"]

# The fastest fused size measured (docs/performance.md): smaller buckets pay the
# per-collective latency again, larger ones no longer stay in cache between packing,
# reducing and unpacking. (PyTorch DDP's 25 MiB and Horovod's 64 MiB are sized to
# overlap a GPU's backward pass; these calls are synchronous, with nothing to overlap.)
BUCKET_BYTES = 4 << 20

_PLANS_KEPT = 4  # signatures whose plans (and pack buffers) are kept


def allreduce_many(
    arrays: Sequence[Any],
    op: Any = MPI.SUM,
    comm: MPI.Intracomm | None = None,
    *,
    bucket_bytes: int = BUCKET_BYTES,
    algorithm: str = "auto",
    timeout: float | None = None,
    reproducible: bool | None = None,
) -> None:
    """All-reduce every array of ``arrays`` in place, in a few fused buckets.

    ``arrays``: NumPy arrays (any shapes, dtypes and strides) or anything else
    ``ringmpi.Allreduce`` takes as a receive buffer (buffer objects, DLPack
    producers in CPU memory); each must be writeable, and no two may share memory
    (the same array twice, or overlapping views of one: ValueError on every rank).
    Every rank must pass arrays of the same shapes and dtypes in the same order,
    the same ``op``, ``bucket_bytes``, ``algorithm`` and reproducible mode: that
    is checked first (one small collective), and every rank raises when they do
    not. ``op``, ``comm``, ``algorithm``, ``timeout`` and ``reproducible`` mean
    what they mean for ``ringmpi.Allreduce``: every rank ends with the same bits,
    and with ``reproducible`` they are the left fold in rank order, whatever the
    packing. Non-contiguous arrays cost nothing extra: every packed array is
    copied into its bucket and back anyway.
    """
    comm = check_comm(comm)  # no collective can tell the others about a bad comm
    settings = _settings.current()
    waits = settings.timeout if timeout is None else _settings.parse_seconds(timeout, "timeout")
    ordered = settings.reproducible if reproducible is None else bool(reproducible)
    plan = problem = None
    views: list[np.ndarray] = []
    try:
        views, plan = _prepare(arrays, op, bucket_bytes, algorithm, ordered)
    except (TypeError, ValueError) as exc:
        problem = exc
    _agree(comm, waits, plan, problem)
    assert plan is not None  # _agree raised unless every rank made its plan
    for bucket in plan.buckets:
        work = bucket.work
        if work is None:  # a large array, reduced where it is
            index = bucket.members[0][0]
            Allreduce(MPI.IN_PLACE, views[index], op, comm, algorithm=algorithm,
                      timeout=timeout, reproducible=ordered)  # fmt: skip
            continue
        for index, packed in bucket.members:
            assert packed is not None  # a packed bucket's members are views of it
            np.copyto(packed, views[index])
        Allreduce(MPI.IN_PLACE, work, op, comm, algorithm=algorithm, timeout=timeout,
                  reproducible=ordered)  # fmt: skip
        for index, packed in bucket.members:
            assert packed is not None
            np.copyto(views[index], packed)


# --- the plan --------------------------------------------------------------------


@dataclass
class _Bucket:
    # The packed buffer (a view of its dtype's pack buffer), or None: the one member
    # is reduced in place.
    work: np.ndarray | None
    # (index in the list, view of `work` shaped like that array); for work None, the
    # view is None.
    members: list[tuple[int, np.ndarray | None]]


@dataclass
class _Plan:
    digest: int  # 63 bits of the signature's hash: what the ranks compare
    signature: tuple  # what the ranks compare, in words, when the digests differ
    buckets: list[_Bucket]
    # The arrays of the last call found apart (no two sharing memory), by weak
    # reference: a loop that passes the same arrays again is not checked again.
    apart: list[weakref.ref] | None = None


_plans: Bounded[tuple, _Plan] = Bounded(_PLANS_KEPT)


def _prepare(
    arrays: Sequence[Any], op: Any, bucket_bytes: int, algorithm: str, ordered: bool
) -> tuple[list[np.ndarray], _Plan]:
    """The arrays' NumPy views and the call's plan; TypeError or ValueError for a
    mistake this rank can see."""
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
        raise TypeError(f"arrays must be a list or tuple of arrays, not {type(arrays).__name__}")
    if not isinstance(bucket_bytes, (int, np.integer)) or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be a positive int, not {bucket_bytes!r}")
    algorithms.lookup(algorithm)
    views = [_as_array(a, f"arrays[{i}]") for i, a in enumerate(arrays)]
    for i, v in enumerate(views):
        if not v.flags.writeable:
            raise ValueError(f"arrays[{i}] is read-only ({type(arrays[i]).__name__})")
    op_key = MPI._handleof(op) if isinstance(op, MPI.Op) else id(op)
    key = (tuple((v.shape, v.dtype) for v in views), op_key, int(bucket_bytes), algorithm,
           ordered)  # fmt: skip
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.put(key, _make_plan(views, op, int(bucket_bytes), algorithm, ordered))
    apart = plan.apart
    if apart is None or not all(r() is a for r, a in zip(apart, arrays, strict=True)):
        plan.apart = None
        _check_apart(arrays, views)
        with contextlib.suppress(TypeError):  # no weak reference to a bytearray: every call
            plan.apart = [weakref.ref(a) for a in arrays]
    return views, plan


def _check_apart(arrays: Sequence[Any], views: list[np.ndarray]) -> None:
    """ValueError naming two arrays that share memory: the same one twice, or views of
    one (each is reduced and written back on its own, so an overlap would be summed
    twice or not, depending on the packing)."""
    first: dict[int, int] = {}
    for j, a in enumerate(arrays):
        i = first.setdefault(id(a), j)
        if i != j:
            raise ValueError(f"arrays[{i}] and arrays[{j}] are the same array: pass it once "
                             "(a tied weight's gradient is one array)")  # fmt: skip
    # Arrays that own their memory share none with one another: only views of the same
    # array, or of memory NumPy does not own (DLPack, buffer objects), are compared.
    groups: dict[int, list[int]] = {}
    for j, v in enumerate(views):
        if v.size == 0:
            continue
        root = v
        while isinstance(root.base, np.ndarray):
            root = root.base
        groups.setdefault(0 if root.base is not None else id(root), []).append(j)
    for members in groups.values():
        if len(members) > 1:
            _check_views(views, members)


def _check_views(views: list[np.ndarray], members: list[int]) -> None:
    """The views' byte ranges, in address order; where two ranges meet, whether the
    arrays really share a byte (strided views may interleave without one)."""
    spans = []
    for j in members:
        v = views[j]
        low = high = MPI.Get_address(v) if v.flags.c_contiguous else _address(v)
        for n, stride in zip(v.shape, v.strides, strict=True):
            reach = stride * (n - 1)
            low, high = (low + reach, high) if reach < 0 else (low, high + reach)
        spans.append((low, high + v.itemsize, j))
    spans.sort()
    open_spans: list[tuple[int, int]] = []  # (end, index) of the spans that may still meet
    for low, high, j in spans:
        open_spans = [(end, i) for end, i in open_spans if end > low]
        for _, i in open_spans:
            shared = np.shares_memory(views[i], views[j])  # exact: strides solved
            if shared:
                first, second = sorted((i, j))
                raise ValueError(f"arrays[{first}] and arrays[{second}] overlap in memory: "
                                 "each array is reduced and written back on its own, so no two "
                                 "may share memory")  # fmt: skip
        open_spans.append((high, j))


def _address(v: np.ndarray) -> int:
    return int(v.__array_interface__["data"][0])


def _make_plan(
    views: list[np.ndarray], op: Any, bucket_bytes: int, algorithm: str, ordered: bool
) -> _Plan:
    groups: dict[np.dtype, list[int]] = {}
    for i, v in enumerate(views):
        groups.setdefault(v.dtype, []).append(i)
    for dt in groups:
        kernels.reduction(op, dt)  # TypeError/ValueError before any message
    op_name = kernels._spec_of(op).name
    buckets: list[_Bucket] = []
    for dt, members in groups.items():
        # Packed buckets as (start, stop, members) in elements of one pack buffer,
        # which is then allocated once, as large as the largest bucket.
        packed: list[tuple[int, list[tuple[int, int]]]] = []
        size = 0
        current: list[tuple[int, int]] = []
        for i in members:
            n = views[i].size
            if n == 0:
                continue
            if n * dt.itemsize >= bucket_bytes:
                buckets.append(_Bucket(None, [(i, None)]))
                continue
            if (size + n) * dt.itemsize > bucket_bytes:
                packed.append((size, current))
                size, current = 0, []
            current.append((i, size))
            size += n
        if current:
            packed.append((size, current))
        if not packed:
            continue
        buffer = np.empty(max(s for s, _ in packed), dt)
        for size, current in packed:
            work = buffer[:size]
            buckets.append(
                _Bucket(
                    work,
                    [
                        (i, work[at : at + views[i].size].reshape(views[i].shape))
                        for i, at in current
                    ],
                )
            )
    signature = (
        tuple((v.shape, f"{v.dtype.name}") for v in views),
        op_name,
        bucket_bytes,
        algorithm,
        ordered,
    )
    digest = hashlib.blake2b(repr(signature).encode(), digest_size=8).digest()
    return _Plan(int.from_bytes(digest, "little") >> 1, signature, buckets)


# --- every rank agrees, or every rank raises ----------------------------------------


def _agree(comm: MPI.Intracomm, waits: float, plan: _Plan | None, problem: Exception | None):
    """One small all-reduce: the digests' maximum and the maximum of their negation
    (equal up to sign exactly when every rank has the same digest), and whether
    any rank found a mistake. Otherwise every rank raises, naming what differs.

    It is ringmpi's own all-reduce (``auto``: on one node the shared-memory one),
    not MPI's: a rank that never calls, or calls something else, then makes the
    others raise after the timeout naming the rank each waited for, where an
    MPI_Iallreduce can only say that somebody is missing."""
    digest = 0 if plan is None else plan.digest
    ctx = context(comm, waits)
    # The same two arrays every call on a communicator: ringmpi's repeat path.
    arrays = _checks.get(ctx)
    if arrays is None:
        arrays = _checks[ctx] = (np.zeros(3, np.int64), np.zeros(3, np.int64))
    mine, them = arrays
    mine[:] = (digest, -digest, problem is not None)
    try:
        Allreduce(mine, them, MPI.MAX, comm, timeout=waits, validate=False, reproducible=False)
    except RingMPIError as exc:
        raise RingMPIError(f"allreduce_many's check of the ranks' signatures: {exc}") from None
    if them[0] == -them[1] and not them[2]:
        return
    said = ctx.comm.allgather(
        (None if plan is None else plan.signature, None if problem is None else repr(problem))
    )
    if problem is not None:
        raise problem
    raise RingMPIError("allreduce_many: " + _differences(said))


# The check's two int64 triples, per communicator (they go with its context).
_checks: weakref.WeakKeyDictionary[Context, tuple[np.ndarray, np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


_FIELDS = ("arrays", "op", "bucket_bytes", "algorithm", "reproducible")


def _differences(said: list[tuple]) -> str:
    """The same words on every rank: which ranks raised, or what the signatures differ in."""
    raised = [f"rank {r} raised {p}" for r, (_, p) in enumerate(said) if p is not None]
    if raised:
        return "; ".join(raised[:4]) + " (no rank sent anything)"
    signatures = [s for s, _ in said]
    for field, i in zip(_FIELDS, range(5), strict=True):
        values = [s[i] for s in signatures]
        if len(set(values)) == 1:
            continue
        if field != "arrays":
            return "ranks disagree on " + field + ": " + _by_rank(values)
        counts = [len(v) for v in values]
        if len(set(counts)) > 1:
            return "ranks disagree on the number of arrays: " + _by_rank(counts)
        for k in range(counts[0]):
            at = [v[k] for v in values]
            if len(set(at)) > 1:
                return f"ranks disagree on arrays[{k}] (shape, dtype): " + _by_rank(at)
    return "ranks disagree on the call"  # a digest collision's other face: never seen


def _by_rank(values: list) -> str:
    groups: dict[Any, list[int]] = {}
    for rank, v in enumerate(values):
        groups.setdefault(v, []).append(rank)
    return "; ".join(
        f"rank{'s' if len(r) > 1 else ''} {','.join(map(str, r[:6]))}"
        + ("..." if len(r) > 6 else "")
        + f" {v!r}"
        for v, r in groups.items()
    )


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("buckets")
