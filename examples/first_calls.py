"""A program's first calls on an untuned machine: auto against the library and each algorithm.

    RINGMPI_TUNER=memory mpirun -n 2 python examples/first_calls.py [--calls 50]
        [--sizes 8,64K,1M,16M,64M] [--against ring,...] [--off-cache-from 16M]

Each size (float32 SUM, in place) and each form of call on a new communicator of
its own: auto (``ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm)``), its
nonblocking call (``ringmpi.Iallreduce(...).Wait()``), the library's
(``comm.Allreduce``, as a program calls it) and each named algorithm
(``algorithm=name``). The forms take turns call by call, the order turning with
each round, so that each form's k-th call meets the machine as the others' k-th
calls do. Every call comes after a barrier and is timed on the slowest rank. A
new communicator starts with no tuned choice and no window, as a program's first
calls do; with ``RINGMPI_TUNER=memory`` no tuner file from an earlier run is read.
The kernels are loaded first (``ringmpi.warm``) and ringmpi's modules imported, as
they are once per machine and program. From ``--off-cache-from`` on, the calls take
turns on as many buffers as make the ranks touch twice the last-level cache before
one comes back (in place, never reset: each call doubles what the last left,
exactly).

Prints, per size and form: the first call (a communicator's first: its one-time
costs), the sums of the next 10 and of the next ``--calls``, for auto and its
nonblocking call those sums over the library's and over the best form's, and the
nonblocking call's over auto's blocking call's. Every
form's results must agree bit for bit, on every rank (at 2 ranks every algorithm
adds one pair an element: the same bits).
"""

from __future__ import annotations

import argparse
import hashlib
import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi import _host, kernels
from ringmpi.tools._units import parse_size

AGAINST = ["ring", "recursive_doubling", "rabenseifner", "rabenseifner_hybrid", "chain",
           "shared_memory", "hierarchical", "mpi"]  # fmt: skip


def call(form: str, x: np.ndarray, comm: MPI.Intracomm) -> None:
    if form == "auto":
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm)
    elif form == "Iallreduce":
        ringmpi.Iallreduce(MPI.IN_PLACE, x, MPI.SUM, comm).Wait()
    elif form == "library":
        comm.Allreduce(MPI.IN_PLACE, x)
    else:
        ringmpi.Allreduce(MPI.IN_PLACE, x, MPI.SUM, comm, algorithm=form)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="calls after the first (50)")
    parser.add_argument("--sizes", default="8,64K,1M,16M,64M", help="bytes, comma list")
    parser.add_argument("--against", default=",".join(AGAINST),
                        help="named algorithms to time beside auto and the library")  # fmt: skip
    parser.add_argument("--off-cache-from", default="16M", help="rotate buffers from here")
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    ringmpi.warm(kernels.reduction(MPI.SUM, np.float32))
    assert ringmpi.Iallreduce  # its module imported, as a program's imports do
    forms = ["auto", "Iallreduce", "library"] + [a for a in args.against.split(",") if a]
    cache = _host.last_level_cache()
    per_node = world.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
    if world.rank == 0:
        print(
            f"# {world.size} ranks; first call, then sums of the next 10 and {args.calls} "
            "calls, ms (slowest rank); auto's ratios to the library's and to the best form"
        )
    for s, size in enumerate(parse_size(t) for t in args.sizes.split(",")):
        rng = np.random.default_rng(world.rank)
        data = rng.standard_normal(size // 4).astype(np.float32)
        sets = 1
        if size >= parse_size(args.off_cache_from) and cache:
            sets = max(2, -(-2 * cache // (size * per_node)))
        comms = {form: world.Dup() for form in forms}
        xs = {form: [data.copy() for _ in range(sets)] for form in forms}
        took: dict[str, list[float]] = {form: [] for form in forms}
        for i in range(1 + args.calls):
            turn = (s + i) % len(forms)
            for form in forms[turn:] + forms[:turn]:
                comm, x = comms[form], xs[form][i % sets]
                comm.Barrier()
                t0 = time.perf_counter()
                call(form, x, comm)
                took[form].append(time.perf_counter() - t0)
        bits: dict[str, bytes] = {}
        for form in forms:
            slowest = np.empty(1 + args.calls)
            world.Allreduce(np.array(took[form]), slowest, op=MPI.MAX)
            took[form] = slowest.tolist()
            digest = hashlib.blake2b()  # of the buffers reduced
            for x in xs[form][: 1 + args.calls]:
                digest.update(x)
            bits[form] = digest.digest()
            comms[form].Free()
        del xs
        order = forms[s % len(forms) :] + forms[: s % len(forms)]
        same = len(set(bits.values())) == 1 and len(set(world.allgather(bits["auto"]))) == 1
        if world.rank != 0:
            continue
        tens = {f: sum(t[1:11]) * 1e3 for f, t in took.items()}
        alls = {f: sum(t[1:]) * 1e3 for f, t in took.items()}
        best = min(alls, key=lambda f: alls[f] if f not in ("auto", "Iallreduce") else 1e300)
        best10 = min(tens, key=lambda f: tens[f] if f not in ("auto", "Iallreduce") else 1e300)
        print(
            f"# {size} B{f', {sets} buffers in turn' if sets > 1 else ''}; "
            f"same bits everywhere: {same}"
        )
        for f in order:
            print(
                f"{size:>10} {f:<20} first {took[f][0] * 1e3:9.3f}  10: {tens[f]:10.3f}  "
                f"{args.calls}: {alls[f]:10.3f}"
            )
        for f in ("auto", "Iallreduce"):
            print(
                f"{size:>10} {f:<20} over library {tens[f] / tens['library']:.2f} "
                f"(10), {alls[f] / alls['library']:.2f} ({args.calls}); over best "
                f"{tens[f] / tens[best10]:.2f} (10, {best10}), "
                f"{alls[f] / alls[best]:.2f} ({args.calls}, {best}); first call "
                f"{took[f][0] * 1e3:.3f} ms against the library's "
                f"{took['library'][0] * 1e3:.3f}"
            )
        print(
            f"{size:>10} {'Iallreduce':<20} over auto's blocking call "
            f"{tens['Iallreduce'] / tens['auto']:.2f} (10), "
            f"{alls['Iallreduce'] / alls['auto']:.2f} ({args.calls})"
        )


if __name__ == "__main__":
    main()
