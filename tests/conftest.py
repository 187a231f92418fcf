"""Shared test set-up.

Under ``mpirun ... pytest --with-mpi`` every rank runs the same tests. Rank 0
reports to the terminal; the other ranks write their report to
``tests/.logs/rank-R-of-N.log``, so the output reads as one run. Tests check
their outcome collectively (:func:`agree`), so every rank passes or fails the
same test and no rank runs ahead into the next collective.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

LOGS = Path(__file__).parent / ".logs"


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


def _writer(config: pytest.Config, file):
    from _pytest.config import create_terminal_writer

    return create_terminal_writer(config, file)


def agree(comm, problems: list[str]) -> None:
    """Fail on every rank if any rank found a problem, listing them all by rank."""
    everyone = comm.allgather(problems)
    found = [f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps]
    assert not found, "\n".join(found[:20]) + (
        f"\n... {len(found)} in all" if len(found) > 20 else ""
    )
