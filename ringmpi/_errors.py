"""The error ringmpi raises for what goes wrong during communication, and the hook
that turns an uncaught error on one rank into the end of the whole job."""

from __future__ import annotations

import sys
import time
import traceback
from typing import Any

from mpi4py import MPI

from ._segments import release_mapped

__all__ = ["RingMPIError", "UnsupportedError", "abort_on_error"]


class RingMPIError(RuntimeError):
    """An error found while communicating: ranks that disagree, a message that does not
    fit, a rank that made no progress within the timeout."""


class UnsupportedError(TypeError):
    """A call ringmpi cannot carry out itself but the MPI library may: a dtype or op
    it does not implement, memory it cannot read (a GPU's), a datatype with no NumPy
    equivalent, an inter-communicator. ``algorithm="auto"`` and ``"mpi"`` hand such a
    call to the library's own collective, with the arguments as given; a named
    algorithm raises this."""


# Shown in tracebacks as the API names them: ringmpi.RingMPIError.
RingMPIError.__module__ = UnsupportedError.__module__ = "ringmpi"


def abort_on_error(comm: Any = None, code: int = 1, grace: float = 0.5) -> None:
    """Make an uncaught exception on this rank end the whole job: print it (one write,
    naming this rank) and call MPI_Abort on ``comm`` (default: COMM_WORLD).

    Without it, a rank that raises leaves the interpreter through MPI_Finalize while
    the other ranks wait for it in their next collective: the job hangs. ``python -m
    mpi4py script.py`` installs the same behaviour for a whole script; this is the
    call for a program that cannot change how it is started. Call it once, early, on
    every rank; it replaces ``sys.excepthook``.

    It waits ``grace`` seconds between printing and aborting, so that the other
    ranks that fail at about the same time (after a timeout, every rank that
    waited) print theirs too: the first rank to give up is not always one that
    waited for the culprit itself. Before aborting it removes the MPI library's
    segments in ``/dev/shm`` that this rank maps, which ``MPI_Abort`` would leave.
    """
    target = MPI.COMM_WORLD if comm is None else comm

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        text = "".join(traceback.format_exception(kind, value, tb))
        # One write, so that another rank's abort cannot cut the message short.
        sys.stderr.write(
            f"ringmpi: rank {MPI.COMM_WORLD.Get_rank()} failed, aborting the job:\n{text}"
        )
        sys.stderr.flush()
        time.sleep(grace)
        release_mapped()  # MPI_Abort skips the library's removal of its segments
        target.Abort(code)

    sys.excepthook = hook
