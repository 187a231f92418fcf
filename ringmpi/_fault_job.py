"""One rank of a fault job of :mod:`ringmpi.reliability` (run under mpirun):
``python -m ringmpi._fault_job ALGORITHM FAULT CULPRIT``."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import ringmpi

_COUNT = 1 << 20  # float64 elements per call: 8 MiB, long enough to be killed inside
_LIMIT = 120.0  # seconds the other ranks go on calling after the fault


def job(algorithm: str, fault: str, culprit: int) -> None:
    """One rank of a fault job (see :mod:`ringmpi.reliability`)."""
    ringmpi.abort_on_error()
    comm = MPI.COMM_WORLD
    print(f"rank {comm.rank} pid {os.getpid()}", flush=True)
    x = np.ones(_COUNT)
    ringmpi.allreduce(x, algorithm=algorithm)  # set-up done, caches warm
    comm.Barrier()
    if comm.rank == culprit:
        print(f"fault {fault} at {time.time():.3f}", flush=True)
        if fault == "kill":
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
        elif fault == "raise":
            raise RuntimeError(f"rank {comm.rank} raises on purpose")
        elif fault == "sleep":
            time.sleep(_LIMIT + 60)
    start = time.monotonic()
    while time.monotonic() - start < _LIMIT:
        ringmpi.allreduce(x, algorithm=algorithm)
    print(f"rank {comm.rank}: the job outlived the fault", flush=True)


if __name__ == "__main__":
    job(sys.argv[1], sys.argv[2], int(sys.argv[3]))
