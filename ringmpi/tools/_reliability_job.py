"""The MPI side of :mod:`ringmpi.tools.reliability`, run under mpirun:

- ``python -m ringmpi.tools._reliability_job fault ALGORITHM FAULT CULPRIT``: one fault job;
- ``python -m ringmpi.tools._reliability_job measure``: the mismatch, stress and overhead
  cases, measured; rank 0 prints one ``RESULT {json}`` line per case.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import cast

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import algorithms

_COUNT = 1 << 20  # float64 elements per call: 8 MiB, long enough to be killed inside
_LIMIT = 120.0  # seconds the other ranks go on calling after the fault

WORLD = MPI.COMM_WORLD


def fault(algorithm: str, kind: str, culprit: int) -> None:
    """One rank of a fault job (see :mod:`ringmpi.tools.reliability`)."""
    ringmpi.abort_on_error()
    print(f"rank {WORLD.rank} pid {os.getpid()}", flush=True)
    x = np.ones(_COUNT)
    if algorithm == "allreduce_many":  # the same bytes as 64 arrays in 4 MiB buckets
        parts = np.split(np.ones(_COUNT), 64)

        def call() -> None:
            ringmpi.allreduce_many(parts)
    else:

        def call() -> None:
            ringmpi.allreduce(x, algorithm=algorithm)

    call()  # set-up done, caches warm
    WORLD.Barrier()
    if WORLD.rank == culprit:
        print(f"fault {kind} at {time.time():.3f}", flush=True)
        if kind == "kill":
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
        elif kind == "raise":
            raise RuntimeError(f"rank {WORLD.rank} raises on purpose")
        elif kind == "sleep":
            time.sleep(_LIMIT + 60)
    start = time.monotonic()
    while time.monotonic() - start < _LIMIT:
        call()
    print(f"rank {WORLD.rank}: the job outlived the fault", flush=True)


def _result(**row: object) -> None:
    if WORLD.rank == 0:
        print("RESULT " + json.dumps(row), flush=True)


def _own() -> list[str]:
    """Every registered algorithm, ringmpi's own first (the MPI baseline last)."""
    return [a for a in algorithms.names() if a not in ("auto", "mpi")] + ["mpi"]


# --- ranks that disagree ---------------------------------------------------------------

# What rank 1 passes differently (the others pass count 1000, MPI.SUM, int32).
_ODD = {
    "count": (1003, MPI.SUM, np.int32),
    "op": (1000, MPI.MAX, np.int32),
    "dtype": (1000, MPI.SUM, np.float32),
}
_SENTINEL = -99


def _disagree(algorithm: str, field: str, validate: bool, timeout: float) -> dict:
    """One call where rank 1 differs on ``field``: what every rank did."""
    count, op, dt = _ODD[field] if WORLD.rank == 1 else (1000, MPI.SUM, np.int32)
    comm = WORLD.Dup()
    ringmpi.allreduce(np.ones(16), comm=comm, algorithm=algorithm)  # set up first
    memory = np.full(count + 64, _SENTINEL, dt)
    recv = memory[:count]
    recv[...] = 1
    started = time.monotonic()
    try:
        ringmpi.Allreduce(np.ones(count, dt), recv, op, comm, algorithm=algorithm,
                          validate=validate, timeout=timeout)  # fmt: skip
        what = "returned"
    except ringmpi.RingMPIError as exc:
        text = str(exc)
        what = "timeout" if "(timeout)" in text else "disagreement" if "disagree" in text else text
    took = time.monotonic() - started
    intact = bool((memory[count:] == _SENTINEL).all())
    comm.Free()
    rows = WORLD.gather((what, intact, took), root=0)
    if WORLD.rank != 0:
        return {}
    assert rows is not None  # the root's list
    kinds = [r[0] for r in rows]
    return {
        "returned": kinds.count("returned"),
        "disagreement": kinds.count("disagreement"),
        "timeout": kinds.count("timeout"),
        "other": [k for k in kinds if k not in ("returned", "disagreement", "timeout")],
        "intact": all(r[1] for r in rows),
        "seconds": max(r[2] for r in rows),
    }


def mismatches(timeout: float) -> None:
    for algorithm in _own():
        for field in _ODD:
            for validate in (True, False):
                if not validate and algorithm == "mpi":
                    continue  # an erroneous MPI program: what MPI_Allreduce does is MPI's
                row = _disagree(algorithm, field, validate, timeout)
                _result(family="mismatch", algorithm=algorithm, field=field,
                        validate=validate, ranks=WORLD.size, **row)  # fmt: skip


# --- many tiny calls, and what a timeout costs --------------------------------------------


def _rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def tiny_calls(calls: int) -> None:
    """MPICH's allredmany: ``calls`` 8-byte all-reduces back to back, per algorithm;
    resident memory before and after (the largest growth over the ranks)."""
    for algorithm in _own():
        x = np.ones(1)
        out = np.empty(1)
        for _ in range(1000):  # warm: caches, plans, the repeat path
            ringmpi.Allreduce(x, out, algorithm=algorithm)
        before = _rss_kib()
        started = time.perf_counter()
        for _ in range(calls):
            ringmpi.Allreduce(x, out, algorithm=algorithm)
        took = time.perf_counter() - started
        grew = WORLD.allreduce(_rss_kib() - before, op=MPI.MAX)
        right = WORLD.allreduce(int(out[0] == WORLD.size), op=MPI.LAND)
        _result(family="tiny", algorithm=algorithm, calls=calls, ranks=WORLD.size,
                rss_growth_kib=grew, us_per_call=took / calls * 1e6, right=bool(right))  # fmt: skip


def overhead(rounds: int, calls: int) -> None:
    """An 8-byte call's time without and with a timeout, interleaved in rounds: the
    median over rounds of each round's mean."""
    x, out = np.ones(1), np.empty(1)
    for algorithm in ("auto", "ring"):
        times: dict[str, list[float]] = {"none": [], "timeout": []}
        for _ in range(rounds):
            for label, timeout in (("none", None), ("timeout", 60.0)):
                for _ in range(calls // 10):
                    ringmpi.Allreduce(x, out, algorithm=algorithm, timeout=timeout)
                WORLD.Barrier()
                started = time.perf_counter()
                for _ in range(calls):
                    ringmpi.Allreduce(x, out, algorithm=algorithm, timeout=timeout)
                took = WORLD.allreduce(time.perf_counter() - started, op=MPI.MAX)
                times[label].append(took / calls * 1e6)
        none, timed = float(np.median(times["none"])), float(np.median(times["timeout"]))
        _result(family="overhead", algorithm=algorithm, ranks=WORLD.size, us_none=none,
                us_timeout=timed, rounds=rounds, calls=calls)  # fmt: skip


def interleaved(rounds: int) -> None:
    """Two communicators (a duplicate of WORLD and a split of it in halves), called in
    turn; every result checked."""
    # (mpi4py's stub types Split as Comm's: an Intracomm's split is an Intracomm)
    halves = cast(MPI.Intracomm, WORLD.Split(WORLD.rank % 2, WORLD.rank))
    both = WORLD.Dup()
    wrong = 0
    for i in range(rounds):
        for comm in (both, halves) if i % 2 else (halves, both):
            got = ringmpi.allreduce(np.full(257, WORLD.rank + 1, np.int64), comm=comm)
            members = comm.allgather(WORLD.rank + 1)
            wrong += int((got != sum(members)).sum())
    both.Free()
    halves.Free()
    _result(family="interleaved", rounds=rounds, ranks=WORLD.size,
            wrong=WORLD.allreduce(wrong))  # fmt: skip


def user_messages() -> None:
    """A receive the user posted with ANY_SOURCE and ANY_TAG on the communicator,
    across each algorithm's call: it must get the user's message, never ringmpi's."""
    for algorithm in _own():
        got = np.full(1, -1, np.int64)
        req = WORLD.Irecv(got, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
        result = ringmpi.allreduce(np.ones(4099), algorithm=algorithm)
        WORLD.Send(np.array([1000 + WORLD.rank], np.int64), dest=(WORLD.rank + 1) % WORLD.size,
                   tag=7)  # fmt: skip
        status = MPI.Status()
        req.Wait(status)
        left = (WORLD.rank - 1) % WORLD.size
        fine = got[0] == 1000 + left and status.Get_tag() == 7 and (result == WORLD.size).all()
        _result(family="user", algorithm=algorithm, ranks=WORLD.size,
                right=bool(WORLD.allreduce(int(fine), op=MPI.LAND)))  # fmt: skip


# --- special values ---------------------------------------------------------------------


def _inputs_special() -> np.ndarray:
    """Rank r's float64 row: NaN, infinities of both signs, signed zeros, in a pattern
    that differs by rank, such that SUM and PROD give the same IEEE result in every
    order (column 5 mixes -0.0 and 0.0: MAX and MIN of those depend on the order)."""
    rows = [
        [np.nan, np.inf, -np.inf, np.inf, -0.0, -0.0, 1.0],
        [1.0, -np.inf, 1.0, np.inf, -0.0, 0.0, 1.0],
        [2.0, 1.0, -np.inf, 1.0, -0.0, -0.0, 1.0],
    ]
    return np.array(rows[WORLD.rank % len(rows)])


_MIXED_ZEROS = 5


def _left_fold(rows: list[np.ndarray], fn) -> np.ndarray:
    acc = rows[0].copy()
    for row in rows[1:]:
        acc = fn(acc, row)
    return acc


def special_values() -> None:
    """NaN, infinities and signed zeros (float64) and integer overflow (int8, int32)
    per algorithm, bitwise against NumPy's IEEE (or wrapping) arithmetic on the same
    inputs and against comm.Allreduce."""
    mine = _inputs_special()
    rows = WORLD.allgather(mine)
    ops = {"sum": (MPI.SUM, np.add), "prod": (MPI.PROD, np.multiply),
           "max": (MPI.MAX, np.maximum), "min": (MPI.MIN, np.minimum)}  # fmt: skip
    for name, (op, fn) in ops.items():
        with np.errstate(all="ignore"):
            want = _left_fold(rows, fn)
        theirs = np.empty_like(mine)
        WORLD.Allreduce(mine, theirs, op=op)
        keep = np.ones(mine.size, bool)
        if name in ("max", "min"):
            keep[_MIXED_ZEROS] = False
        for algorithm in _own():
            with np.errstate(all="ignore"):
                got = ringmpi.allreduce(mine, op, algorithm=algorithm)
            ieee = got[keep].tobytes() == want[keep].tobytes()
            like_mpi = got.tobytes() == theirs.tobytes()
            _result(family="special", algorithm=algorithm, op=name, ranks=WORLD.size,
                    ieee=bool(WORLD.allreduce(int(ieee), op=MPI.LAND)),
                    like_mpi=bool(WORLD.allreduce(int(like_mpi), op=MPI.LAND)),
                    got=" ".join(map(str, got.tolist())),
                    mpi=" ".join(map(str, theirs.tolist())))  # fmt: skip
    for dt in (np.int8, np.int32):
        info = np.iinfo(dt)
        x = np.array([info.max, info.min, info.max // 2 + 7, -3], dt)
        with np.errstate(all="ignore"):
            want = _left_fold(WORLD.allgather(x), np.add)
        for algorithm in _own():
            got = ringmpi.allreduce(x, algorithm=algorithm)
            same = bool(WORLD.allreduce(int(np.array_equal(got, want)), op=MPI.LAND))
            _result(family="overflow", algorithm=algorithm, dtype=np.dtype(dt).name,
                    ranks=WORLD.size, wraps=same, got=got.tolist())  # fmt: skip


# --- bad input ---------------------------------------------------------------------------


def bad_input() -> None:
    """Each mistake a caller can make, on every rank at once: the error it gets (before
    any communication: no rank waits for another)."""
    f8 = np.ones(4)
    cases = {
        "recvbuf smaller than sendbuf": lambda: ringmpi.Allreduce(f8, np.empty(3)),
        "recvbuf of another dtype": lambda: ringmpi.Allreduce(f8, np.empty(4, np.float32)),
        "read-only recvbuf": lambda: ringmpi.Allreduce(f8, np.frombuffer(bytes(32))),
        "sendbuf and recvbuf overlap": lambda: ringmpi.Allreduce(f8[:2], f8[1:3]),
        "an op ringmpi does not know (MPI.MAXLOC)": lambda: ringmpi.allreduce(f8, MPI.MAXLOC),
        "an op MPI does not define for the dtype (MAX on complex)": lambda: ringmpi.allreduce(
            np.ones(4, np.complex64), MPI.MAX),
        "a dtype ringmpi does not reduce (datetime64)": lambda: ringmpi.allreduce(
            np.zeros(4, "datetime64[s]")),
        "a half type with an algorithm that would round it per step (float16, rabenseifner)": (
            lambda: ringmpi.allreduce(np.ones(4, np.float16), algorithm="rabenseifner")),
        # (a str on purpose: the error for it is what is checked)
        "not an intracommunicator": lambda: ringmpi.allreduce(f8, comm="world"),  # type: ignore[arg-type]
        "an unknown algorithm": lambda: ringmpi.allreduce(f8, algorithm="tree"),
        "a negative timeout": lambda: ringmpi.allreduce(f8, timeout=-1),
        "reproducible=True with an algorithm that cannot keep the order": lambda: (
            ringmpi.allreduce(f8, algorithm="ring", reproducible=True)),
    }  # fmt: skip
    for case, call in cases.items():
        try:
            call()
            said = "no error"
        except Exception as exc:
            said = f"{type(exc).__name__}: {exc}"
        _result(family="bad", case=case, error=said)


# --- counts above 2^31 -------------------------------------------------------------------


def big(nbytes: int) -> None:
    """``nbytes`` of int8 in place per algorithm (2.5 GiB: past 2^31 elements and
    bytes); every element checked against the wrapped sum."""
    period = 251
    pattern = (np.arange(period) * (7 + 2 * WORLD.rank) + 3 * WORLD.rank) % 256 - 128
    total = sum(WORLD.allgather(pattern.astype(np.int64)))
    want = ((total + 128) % 256 - 128).astype(np.int8)
    buf = np.empty(nbytes, np.int8)
    whole = nbytes - nbytes % period
    for algorithm in _own():
        buf[:whole].reshape(-1, period)[...] = pattern.astype(np.int8)
        buf[whole:] = pattern[: nbytes - whole].astype(np.int8)
        WORLD.Barrier()
        started = time.perf_counter()
        ringmpi.Allreduce(MPI.IN_PLACE, buf, algorithm=algorithm)
        took = WORLD.allreduce(time.perf_counter() - started, op=MPI.MAX)
        wrong = int((buf[:whole].reshape(-1, period) != want).sum())
        wrong += int((buf[whole:] != want[: nbytes - whole]).sum())
        _result(family="big", algorithm=algorithm, nbytes=nbytes, ranks=WORLD.size,
                seconds=took, wrong=WORLD.allreduce(wrong))  # fmt: skip


def measure() -> None:
    bad_input()
    mismatches(timeout=2.0)
    special_values()
    tiny_calls(10_000)
    overhead(rounds=7, calls=2000)
    interleaved(rounds=200)
    user_messages()


if __name__ == "__main__":
    if sys.argv[1] == "fault":
        fault(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "measure":
        measure()
    elif sys.argv[1] == "big":
        big(int(sys.argv[2]))
    else:
        raise SystemExit(f"unknown job {sys.argv[1]!r}")
