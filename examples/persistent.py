"""Persistent collectives: ringmpi.Comm's ``*_init`` against the library's own, Start + Wait.

    mpirun -n 2 python examples/persistent.py

For each collective and size, one persistent request of each kind is made
(``ringmpi.Comm(comm).Allreduce_init(...)`` and mpi4py's
``comm.Allreduce_init(...)``, likewise the halves), started and completed
until auto's tuner has settled (untimed), then timed in 9 rounds in which the
two take turns with ringmpi's blocking call of the same collective, each round
a barrier and a loop of Start + Wait (of the call); a round's time is the
slowest rank's. Prints the median µs a start of each, the requests' ratio,
what ringmpi ran, and whether the last result was exact on every rank (exits 1
if one was not).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

import ringmpi

ROUNDS = 9


def _cases(n: int):
    """(collective, bytes, sendbuf, recvbuf, expected): float32 SUM of small integers."""
    for nbytes in (8, 64 << 10, 1 << 20, 4 << 20):
        count = nbytes // 4
        yield "Allreduce_init", nbytes, count, count, count * n
    for name in ("Reduce_scatter_block_init", "Allgather_init"):
        block = (1 << 20) // 4 // n
        if name == "Reduce_scatter_block_init":
            yield name, 1 << 20, block * n, block, block * n
        else:
            yield name, 1 << 20, block, block * n, block * n


def _request(comm, name: str, send: np.ndarray, recv: np.ndarray):
    if name == "Allgather_init":
        return getattr(comm, name)(send, recv)
    return getattr(comm, name)(send, recv, MPI.SUM)


class _Blocking:
    """The same collective as ringmpi's blocking call, made by ``Start`` (for the
    request's own cost: the difference)."""

    def __init__(self, comm, name: str, send: np.ndarray, recv: np.ndarray) -> None:
        call = getattr(comm, name.removesuffix("_init"))
        args = (send, recv) if name == "Allgather_init" else (send, recv, MPI.SUM)
        self.Start = lambda: call(*args)

    def Wait(self) -> None:
        pass

    def Free(self) -> None:
        pass


def main() -> None:
    world = MPI.COMM_WORLD
    wrapped, n, rank = ringmpi.Comm(world), world.size, world.rank
    all_exact = True
    if rank == 0:
        print(f"# {MPI.Get_library_version().splitlines()[0].strip()}, {n} ranks")
        print(f"{'collective':<26} {'bytes':>8} {'ringmpi us':>11} {'library us':>11} "
              f"{'ratio':>6} {'blocking us':>12}  ran  exact")  # fmt: skip
    for name, nbytes, scount, rcount, _ in _cases(n):
        send = (np.arange(scount) % 7 + rank).astype(np.float32)
        bufs = {k: np.zeros(rcount, np.float32) for k in ("ringmpi", "library", "blocking")}
        with ringmpi.trace() as seen:
            ours = _request(wrapped, name, send, bufs["ringmpi"])
            for _ in range(40):  # auto's tuner settles the size class
                ours.Start()
                ours.Wait()
        ran = seen.ran[-1] if seen.ran else "?"
        requests = {
            "ringmpi": ours,
            "library": _request(world, name, send, bufs["library"]),
            "blocking": _Blocking(wrapped, name, send, bufs["blocking"]),
        }
        calls = max(5, min(2000, (100 << 20) // nbytes // 4))
        times: dict[str, list[float]] = {k: [] for k in requests}
        for _ in range(ROUNDS):
            for kind, req in requests.items():
                world.Barrier()
                t0 = time.perf_counter()
                for _ in range(calls):
                    req.Start()
                    req.Wait()
                times[kind].append(world.allreduce((time.perf_counter() - t0) / calls, MPI.MAX))
        exact = np.array_equal(bufs["ringmpi"], bufs["library"])  # integers: exact in any order
        exact = exact and np.array_equal(bufs["blocking"], bufs["library"])
        exact = world.allreduce(exact, op=MPI.LAND)
        all_exact = all_exact and exact
        for req in requests.values():
            req.Free()
        if rank == 0:
            us = {k: float(np.median(t)) * 1e6 for k, t in times.items()}
            print(f"{name:<26} {nbytes:>8} {us['ringmpi']:>11.2f} {us['library']:>11.2f} "
                  f"{us['ringmpi'] / us['library']:>6.2f} {us['blocking']:>12.2f}  {ran:<4} "
                  f"{exact}")  # fmt: skip
    if not all_exact:
        sys.exit(1)


if __name__ == "__main__":
    main()
