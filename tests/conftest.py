"""Shared test set-up.

Under ``mpirun ... pytest --with-mpi`` every rank runs the same tests. Rank 0
reports to the terminal; the other ranks write their report to
``tests/.logs/rank-R-of-N.log`` (printed by the Makefile target on failure), so
the output reads as one run. Tests check their outcome collectively
(:func:`agree`), so every rank passes or fails the same test and no rank runs
ahead into the next collective.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if "--with-mpi" in sys.argv:
    from mpi4py import MPI

    _world = MPI.COMM_WORLD
    if _world.Get_rank() > 0:
        _logs = Path(__file__).parent / ".logs"
        _logs.mkdir(exist_ok=True)
        _log = _logs / f"rank-{_world.Get_rank()}-of-{_world.Get_size()}.log"
        _fd = os.open(_log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(_fd, 1)
        os.close(_fd)


def agree(comm, problems: list[str]) -> None:
    """Fail on every rank if any rank found a problem, listing them all by rank."""
    everyone = comm.allgather(problems)
    found = [f"rank {r}: {p}" for r, ps in enumerate(everyone) for p in ps]
    assert not found, "\n".join(found[:20]) + (
        f"\n... {len(found)} in all" if len(found) > 20 else ""
    )
