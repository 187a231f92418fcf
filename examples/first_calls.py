"""The first calls on an untuned machine: auto's first 50 calls of a size against the library's.

    RINGMPI_TUNER=memory mpirun -n 2 python examples/first_calls.py [--calls 50]

Each size (float32 SUM, in place) on three new communicators, one for each
form: 50 calls of ``ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm)``, 50 of
``ringmpi.Iallreduce(MPI.IN_PLACE, x, MPI.SUM, comm).Wait()`` and 50 of
``comm.Allreduce(MPI.IN_PLACE, x)``, each call after a barrier, summed (each
call's time the slowest rank's). A new communicator starts with no tuned choice
and no window, as a program's first calls do; with ``RINGMPI_TUNER=memory`` no
tuner file from an earlier run is read (a run with the default setting reads
it, and starts tuned). The kernels are loaded first (``ringmpi.warm``), as
they are once per machine, and ringmpi's modules imported. Prints the totals in ms, auto's ratio to the
library, the nonblocking call's ratio to the blocking one, auto's first call
and slowest call, what auto runs at the next call (one more, traced, untimed),
and whether every call's result was the same on every rank, from call to call
and from one form to the next.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import kernels

SIZES = [8, 64 << 10, 1 << 20, 16 << 20]
FORMS = ["auto", "Iallreduce", "mpi4py"]


def call(form: str, x: np.ndarray, comm: MPI.Intracomm) -> None:
    if form == "auto":
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm)
    elif form == "Iallreduce":
        ringmpi.Iallreduce(MPI.IN_PLACE, x, MPI.SUM, comm).Wait()
    else:
        comm.Allreduce(MPI.IN_PLACE, x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="calls of each (50)")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    ringmpi.warm(kernels.reduction(MPI.SUM, np.float32))
    assert ringmpi.Iallreduce  # its module imported, as a program's imports do
    if world.rank == 0:
        print(f"{'bytes':>10} {'auto ms':>9} {'Iallreduce':>10} {'mpi4py ms':>10} "
              f"{'ratio':>6} {'I/auto':>6} {'first ms':>9} {'slowest':>8}  auto ran       "
              "same bits")  # fmt: skip
    for i, nbytes in enumerate(SIZES):
        rng = np.random.default_rng(world.rank)
        data = rng.standard_normal(nbytes // 4).astype(np.float32)
        # The forms in turn: which goes first changes with the size.
        order = FORMS[i % 3 :] + FORMS[: i % 3]
        took: dict[str, list[float]] = {}
        results: dict[str, bytes] = {}
        same = True
        for form in order:
            comm = world.Dup()
            x = np.empty_like(data)
            first = None
            times = []
            for _ in range(args.calls):
                x[...] = data
                comm.Barrier()
                t0 = time.perf_counter()
                call(form, x, comm)
                times.append(time.perf_counter() - t0)
                first = x.tobytes() if first is None else first
                same = same and x.tobytes() == first
            took[form] = [world.allreduce(s, op=MPI.MAX) for s in times]
            if form == "auto":  # one more call, traced (a trace takes the full path): untimed
                x[...] = data
                with ringmpi.trace() as t:
                    ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm)
                ran = t.ran[-1] if t.ran else "mpi"
                same = same and x.tobytes() == first
            same = same and len(set(world.allgather(first))) == 1
            results[form] = first or b""
            comm.Free()
        # ringmpi's two forms give the same bits (at 2 ranks every candidate does)
        same = world.allreduce(same and results["auto"] == results["Iallreduce"], op=MPI.LAND)
        if world.rank == 0:
            auto, nonblocking = sum(took["auto"]) * 1e3, sum(took["Iallreduce"]) * 1e3
            raw = sum(took["mpi4py"]) * 1e3
            print(f"{nbytes:>10} {auto:>9.2f} {nonblocking:>10.2f} {raw:>10.2f} "
                  f"{auto / raw:>6.2f} {nonblocking / auto:>6.2f} "
                  f"{took['auto'][0] * 1e3:>9.2f} {max(took['auto']) * 1e3:>8.2f}  "
                  f"{ran:<13} {same}")  # fmt: skip


if __name__ == "__main__":
    main()
