"""Shared test set-up.

Under ``mpirun ... pytest --with-mpi`` every rank runs the same tests. Rank 0
reports to the terminal; the other ranks write their report to
``tests/.logs/rank-R-of-N.log``, so the output reads as one run. Tests check
their outcome collectively (:func:`agree`), so every rank passes or fails the
same test and no rank runs ahead into the next collective.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from pathlib import Path

import numpy as np
import pytest

LOGS = Path(__file__).parent / ".logs"

# Tests assert auto's cost-model choice, which must not depend on this machine's
# timings: auto's online tuner is off (here and in every mpirun a test starts)
# except in the tests of the tuner, which turn it on with a directory of their own.
os.environ.setdefault("RINGMPI_TUNER", "off")
# Where they turn it on, its trials come back to back: none of the lead's calls
# between them (tests/test_mpi_lead.py tests the spacing).
os.environ.setdefault("RINGMPI_SPACING", "0")


def _swept(linger: float, own: bool = False):
    """Remove, as the block ends, the MPI segments that appeared in /dev/shm during
    it and no live process uses (under --with-mpi the ranks' own are in use)."""
    if "--with-mpi" in sys.argv:
        return contextlib.nullcontext()
    from ringmpi.tools import shm

    return shm.swept(linger=linger, own=own)


@pytest.fixture(autouse=True)
def _no_stale_segments():
    """A job a test starts (and maybe kills) must not leave its segments behind."""
    with _swept(linger=1.0):
        yield


_session_sweep = contextlib.ExitStack()


def pytest_sessionstart(session: pytest.Session) -> None:
    """What the per-test sweep could not take yet (a killed job's rank still
    exiting when its test ended) goes when the session ends; so does this
    process's own segment, where it started MPI without mpirun (Open MPI 5
    leaves a singleton's behind). From before collection, which may start MPI."""
    _session_sweep.enter_context(_swept(linger=5.0, own=True))


def pytest_sessionfinish(session: pytest.Session) -> None:
    _session_sweep.close()
    running = _running_file()
    if running is not None:  # the run ended: no test to name as the one it hung in
        running.unlink(missing_ok=True)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if "--with-mpi" not in sys.argv:
        return
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        return
    reporter = config.pluginmanager.getplugin("terminalreporter")
    if reporter is None:
        return
    LOGS.mkdir(exist_ok=True)
    log = open(LOGS / f"rank-{world.Get_rank()}-of-{world.Get_size()}.log", "w")  # noqa: SIM115
    config.add_cleanup(log.close)
    # The reporter's writer is private API, stable across pytest releases: swap its file.
    reporter._tw = _writer(config, log)


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    """Under --with-mpi each rank keeps the test it is in in
    ``tests/.logs/running-R-of-N`` (removed when the run ends): where a run is killed
    (a test that hangs), make prints which test each rank was in."""
    running = _running_file()
    if running is not None:
        LOGS.mkdir(exist_ok=True)
        running.write_text(nodeid + "\n")


def _running_file() -> Path | None:
    """``tests/.logs/running-R-of-N`` under --with-mpi, else None."""
    if "--with-mpi" not in sys.argv:
        return None
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    return LOGS / f"running-{world.Get_rank()}-of-{world.Get_size()}"


def _writer(config: pytest.Config, file):
    from _pytest.config import create_terminal_writer

    return create_terminal_writer(config, file)


class _Environ:
    """RINGMPI_* variables set for one test, read again at the next call as a new run
    reads them at its first (ringmpi reads the environment once)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._mp = monkeypatch

    def set(self, name: str, value: str) -> None:
        self._mp.setenv(name, value)
        _reread()

    def unset(self, name: str) -> None:
        self._mp.delenv(name, raising=False)
        _reread()


def _reread() -> None:
    from ringmpi import _settings

    _settings.reset()


@pytest.fixture
def environ(monkeypatch):
    """Set ``RINGMPI_*`` variables for one test (undone after it)."""
    yield _Environ(monkeypatch)
    monkeypatch.undo()
    _reread()


@pytest.fixture
def settings():
    """``ringmpi.configure`` for one test: the settings before it come back after."""
    import ringmpi

    with ringmpi.configured():
        yield ringmpi.configure


def auto_choice(costs, n, p, nodes, per_node, names=None) -> str:
    """What the cost model chooses among ``names`` (default: auto's candidates)."""
    from ringmpi import algorithms, tuning

    pool = [algorithms.get(a) for a in (names or algorithms.candidates())]
    return tuning.choose(costs, n, p, nodes, per_node, pool).name


def agree(comm, problems: list[str]) -> None:
    """Fail on every rank if any rank found a problem, listing them all by rank."""
    everyone = comm.allgather(problems)
    found = [f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps]
    assert not found, "\n".join(found[:20]) + (
        f"\n... {len(found)} in all" if len(found) > 20 else ""
    )


# --- where the MPI families differ -------------------------------------------------
# The tests compare ringmpi with comm.Allreduce. Where MPICH and Open MPI give different
# answers themselves, the expectation depends on the library mpi4py loaded, probed or
# read at run time (mpi4py is imported only when called: the MPI-free tests never load it).


def mpi_family() -> str:
    """The MPI family mpi4py loaded: MPICH, Open MPI, Intel(R) MPI, or the library's own
    name for another."""
    from mpi4py import MPI

    version = MPI.Get_library_version()
    known = [f for f in ("MPICH", "Open MPI", "Intel(R) MPI") if version.startswith(f)]
    return known[0] if known else version.split(",")[0].split("\n")[0].strip()


@functools.cache
def sum_saturates(dtype: str) -> bool:
    """Whether the loaded MPI's SUM clamps ``dtype`` at its bounds instead of wrapping
    modulo 2^bits as C and NumPy do. Open MPI's vector reductions (its op/avx component,
    chosen on CPUs with AVX2 or AVX-512) saturate 8- and 16-bit integers (Open MPI issue
    8045, closed as won't fix); MPICH wraps. Probed with one local reduction, long
    enough for vector code."""
    from mpi4py import MPI

    dt = np.dtype(dtype)
    if dt.kind not in "iu":
        return False
    top = np.full(256, np.iinfo(dt).max, dt)
    out = top.copy()
    MPI.SUM.Reduce_local(top, out)  # wrapped: -2 or max - 1; saturated: max
    return bool(out[0] == top[0])


def wrapped_sum(comm, x: np.ndarray) -> np.ndarray:
    """comm.Allreduce's SUM of integers ``x`` taken in int64 and wrapped back to their
    dtype: what a wrapping MPI gives, from a library that saturates the narrow one."""
    wide = np.ascontiguousarray(x).reshape(-1).astype(np.int64)
    out = np.empty_like(wide)
    comm.Allreduce(wide, out)
    return out.astype(x.dtype)  # NumPy keeps the low bits: modulo 2^bits


def half_contract(parts: list, name: str, dt):
    """The half types' contract in NumPy (docs/api.md): widen to float32, fold in rank
    order, AVG's division in float32, one rounding to ``dt``."""
    import numpy as np

    acc = parts[0].astype(np.float32)
    for x in parts[1:]:
        y = x.astype(np.float32)
        if name in ("sum", "avg"):
            with np.errstate(invalid="ignore"):  # inf - inf
                acc = acc + y
        elif name == "max":
            acc = np.where((y > acc) | np.isnan(y), y, acc)
        else:
            acc = np.where((y < acc) | np.isnan(y), y, acc)
    if name == "avg" and len(parts) > 1:
        acc = acc / np.float32(len(parts))
    with np.errstate(all="ignore"):
        return acc.astype(dt)
