"""Each way of writing one 8-byte in-place float32 SUM, timed against mpi4py's own call.

    mpirun -n 2 python examples/call_forms.py [CALLS]

The forms are the ones users write: all four arguments positional, ``comm=``
as a keyword, the README's ``op=``/``comm=`` form, and ``ringmpi.Comm``'s
method (positional and ``op=``); then ``comm.Allreduce`` through mpi4py. Each
is a plain loop of CALLS calls (default 20,000) written out as its own
statement; 9 rounds in which the forms take turns, each after a barrier. A
round's time is the slowest rank's; prints the median µs a call, and its
difference from the positional form's. Exits 1 unless every form gave the exact
sum on every rank. The algorithm is auto (at 8 B it runs
the library's call, from C, once the call repeats).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

import ringmpi

ROUNDS = 9
FORMS = {
    "positional": "ringmpi.Allreduce(IN_PLACE, a, SUM, comm)",
    "comm=": "ringmpi.Allreduce(IN_PLACE, a, comm=comm)",
    "op=, comm=": "ringmpi.Allreduce(IN_PLACE, a, op=SUM, comm=comm)",
    "Comm method": "wrapped.Allreduce(IN_PLACE, a)",
    "Comm method op=": "wrapped.Allreduce(IN_PLACE, a, op=SUM)",
    "mpi4py": "comm.Allreduce(IN_PLACE, a)",
}


def _loop(statement: str):
    """A function that makes ``statement`` n times, its names bound as locals."""
    source = (
        "def loop(n, ringmpi, IN_PLACE, SUM, comm, wrapped, a):\n"
        f"    for _ in range(n):\n        {statement}\n"
    )
    space: dict = {}
    exec(source, space)
    return space["loop"]


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    comm = MPI.COMM_WORLD
    wrapped = ringmpi.Comm(comm)
    # Each form its own array: ringmpi remembers one call per array (the form that
    # comes back on it with another communicator or op takes the slower path).
    arrays = {name: np.ones(2, np.float32) for name in FORMS}
    loops = {name: _loop(statement) for name, statement in FORMS.items()}
    args = {name: (ringmpi, MPI.IN_PLACE, MPI.SUM, comm, wrapped, arrays[name]) for name in FORMS}
    for name, loop in loops.items():  # first calls: checked, remembered
        loop(100, *args[name])
    times: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(ROUNDS):
        for name, loop in loops.items():
            comm.Barrier()
            t0 = time.perf_counter()
            loop(calls, *args[name])
            took = (time.perf_counter() - t0) / calls
            times[name].append(comm.allreduce(took, op=MPI.MAX))
    right = []
    for name, loop in loops.items():  # each form's result, on ones: the rank count
        a = arrays[name]
        a[...] = 1
        loop(1, *args[name])
        right.append(bool((a == comm.size).all()))
    exact = comm.allreduce(all(right), op=MPI.LAND)
    if comm.rank == 0:
        median = {name: float(np.median(t)) * 1e6 for name, t in times.items()}
        print(f"# {MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"# {comm.size} ranks, {calls} calls x {ROUNDS} rounds; exact: {exact}")
        print(f"{'form':<16} {'us/call':>8} {'- positional':>13}")
        for name, us in median.items():
            print(f"{name:<16} {us:>8.3f} {us - median['positional']:>+13.3f}")
    if not exact:
        sys.exit(1)


if __name__ == "__main__":
    main()
