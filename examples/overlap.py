"""Computation overlapped with a nonblocking all-reduce, against the two in sequence.

    mpirun -n 2 python examples/overlap.py [--compute matmul|sleep] [--rounds 9]

Each size (float32 SUM, in place): the blocking all-reduce alone (``comm``), a
computation of about the same length alone (``compute``: NumPy matrix products,
which release the GIL but keep a core busy; or ``--compute sleep``, work that
leaves the cores free, as a GPU kernel or a disk read does), then the two in
sequence (``ringmpi.Allreduce`` then the computation) and overlapped
(``ringmpi.Iallreduce``, the computation, ``Wait``), and the library's own
``comm.Iallreduce`` overlapped the same way.
The rounds take turns; a round's time is the slowest rank's; medians of
``--rounds`` (9).
``hidden`` is the share of the shorter of the two that overlapping saved:
(sequence - overlapped) / min(comm, compute). ``start us`` is what the
overlapped rounds' ``Iallreduce`` call itself took, ringmpi's and mpi4py's
(the slowest rank's median). A last overlapped call on verifiable inputs must
give the exact sum on every rank.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import verify

SIZES = [64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compute", choices=["matmul", "sleep"], default="matmul")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of each (default 9)")
    args = parser.parse_args()
    sleep, rounds = args.compute == "sleep", max(1, args.rounds)
    comm = MPI.COMM_WORLD
    a = np.random.default_rng(comm.rank).random((192, 192))
    if comm.rank == 0:
        print(f"{'bytes':>10} {'comm ms':>8} {'compute':>8} {'sequence':>9} {'overlap':>8} "
              f"{'hidden':>7} {'mpi4py':>8} {'hidden':>7} {'start us':>8} {'mpi4py':>7}  "
              "exact")  # fmt: skip
    for nbytes in SIZES:
        x = np.ones(nbytes // 4, np.float32)
        for _ in range(5):  # auto's tuner settles the size (untimed)
            ringmpi.Allreduce(MPI.IN_PLACE, x)
        alone = _timed(comm, lambda x=x: ringmpi.Allreduce(MPI.IN_PLACE, x))
        reps = max(1, round(alone / _timed(comm, lambda: a @ a)))

        def compute(reps=reps, alone=alone) -> None:
            if sleep:
                time.sleep(alone)
                return
            for _ in range(reps):
                a @ a

        def sequence(x=x, compute=compute) -> None:
            ringmpi.Allreduce(MPI.IN_PLACE, x)
            compute()

        starts: dict[str, list[float]] = {"ringmpi": [], "mpi4py": []}

        def overlapped(x=x, compute=compute, took=starts["ringmpi"]) -> None:
            t0 = time.perf_counter()
            req = ringmpi.Iallreduce(MPI.IN_PLACE, x)
            took.append(time.perf_counter() - t0)
            compute()
            req.Wait()

        def library(x=x, compute=compute, took=starts["mpi4py"]) -> None:
            t0 = time.perf_counter()
            req = comm.Iallreduce(MPI.IN_PLACE, x)
            took.append(time.perf_counter() - t0)
            compute()
            req.Wait()

        paths = {"comm": lambda x=x: ringmpi.Allreduce(MPI.IN_PLACE, x), "compute": compute,
                 "sequence": sequence, "overlap": overlapped, "library": library}  # fmt: skip
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(rounds):
            for name, call in paths.items():
                times[name].append(_timed(comm, call, 1))
        x[...] = verify.verify_inputs(MPI.SUM, "float32", comm.rank, x.size)
        req = ringmpi.Iallreduce(MPI.IN_PLACE, x)
        compute()
        req.Wait()
        exact = verify.verify_expected(MPI.SUM, "float32", comm.size, x.size)
        ok = comm.allreduce(bool(np.array_equal(x, exact)), op=MPI.LAND)
        start = {k: comm.allreduce(float(np.median(v[:rounds])), op=MPI.MAX) * 1e6
                 for k, v in starts.items()}  # fmt: skip
        if comm.rank == 0:
            t = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
            shorter = min(t["comm"], t["compute"])
            hidden = (t["sequence"] - t["overlap"]) / shorter
            theirs = (t["sequence"] - t["library"]) / shorter
            print(f"{nbytes:>10} {t['comm']:>8.2f} {t['compute']:>8.2f} {t['sequence']:>9.2f} "
                  f"{t['overlap']:>8.2f} {hidden:>7.0%} {t['library']:>8.2f} {theirs:>7.0%} "
                  f"{start['ringmpi']:>8.1f} {start['mpi4py']:>7.1f}  {ok}")  # fmt: skip


def _timed(comm: MPI.Intracomm, call, repeats: int = 5) -> float:
    """The slowest rank's median seconds of ``call`` (after a barrier each)."""
    took = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        took.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return float(np.median(took))


if __name__ == "__main__":
    main()
