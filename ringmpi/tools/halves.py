"""``python -m ringmpi reduce_scatter`` and ``allgather``: the ring's halves, benchmarked.

Each row is one (size, algorithm): size is the whole buffer (N blocks), as in
nccl-tests; the median of ``-n`` rounds (each the slowest rank's mean call in a
loop of up to 1000 calls, 32 MiB moved at most),
algbw = size / time and busbw = algbw·(N-1)/N, the number of wrong elements
summed over ranks, and the bytes and steps one call's sends took on this rank,
from :func:`ringmpi.trace` (the library's call is not traced; shared_memory sends
nothing). ``mpi4py`` is
the library's own call through mpi4py, the baseline; ``-a all`` is auto, every
registered algorithm of the collective that can run here, and mpi4py. The
algorithms' calls take turns; auto's tuner settles each size during the
warm-up calls (up to 44 from 64 KiB to 4 MiB: 11 for each of 4 candidates).
Reduce_scatter_block of float32 SUM on verifiable inputs; Allgather of float32
blocks of rank-dependent integers: every expected value is exact.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

import ringmpi
from ringmpi.algorithms import registry
from ringmpi.verify import verify_expected, verify_inputs

from . import command_parser
from ._args import ArgumentParser
from ._units import format_size, whole

__all__ = ["main"]


def _parser(command: str) -> ArgumentParser:
    p = command_parser(command, __doc__)
    p.add_sweep(8, 64 << 20, 8)
    p.add_argument("-n", "--iters", type=whole(1), default=7, help="timed rounds per size")
    p.add_argument(
        "-w",
        "--warmup",
        type=whole(0),
        default=44,
        help="untimed calls first: auto's tuner settles in them",
    )
    p.add_argument(
        "-a",
        "--algorithm",
        default="auto,ring,mpi4py",
        help=f"comma-separated: {', '.join(registry.names(command))} (ringmpi handing the "
        "call to the library), mpi4py (the library's call itself), or all",
    )
    return p


def _algorithms(parser: ArgumentParser, given: str, command: str, comm: MPI.Intracomm):
    """The -a list: checked (exit 2 naming it), ``all`` expanded to what can run here."""
    known = [*registry.names(command), "mpi4py"]
    if given == "all":
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        one_node = node.Get_size() == comm.Get_size()
        node.Free()
        return ["auto", *(a.name for a in registry.records(command) if one_node or not a.one_node),
                "mpi4py"]  # fmt: skip
    names = given.split(",")
    unknown = [a for a in names if a not in known]
    if unknown:
        parser.error(f"-a/--algorithm: unknown {', '.join(map(repr, unknown))} "
                     f"(known: {', '.join(known)}, all)")  # fmt: skip
    return names


def main(argv: list[str], command: str) -> int:
    parser = _parser(command)
    args = parser.parse_args(argv)
    sizes = parser.sizes(args)
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    names = _algorithms(parser, args.algorithm, command, comm)
    if rank == 0:
        vendor, version = MPI.get_vendor()
        what = "Reduce_scatter_block, float32 sum" if command == "reduce_scatter" else "Allgather"
        print(f"# ringmpi {command} ({what}), {n} ranks, {vendor} "
              f"{'.'.join(map(str, version))}")  # fmt: skip
        print(f"# {'size':>9} {'count':>10} {'algorithm':>19} {'time(us)':>10} "
              f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6} {'sent(B)':>10} "
              f"{'steps':>5}")  # fmt: skip
    for size in sizes:
        count = max(n, size // 4 // n * n)  # whole blocks of float32
        block = count // n
        send, recv, want = _buffers(command, count, block, n, rank)
        calls = {a: _call(command, send, recv, a) for a in names}
        loop = max(1, min(1000, (32 << 20) // max(size, 1)))  # calls in one timed loop
        times: dict[str, list[float]] = {a: [] for a in names}
        for _ in range(args.warmup):
            for call in calls.values():
                call()
        for _ in range(args.iters):
            for a, call in calls.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(loop):
                    call()
                times[a].append(comm.allreduce((time.perf_counter() - t0) / loop, op=MPI.MAX))
        for a, call in calls.items():
            recv[...] = 0
            with ringmpi.trace() as t:
                call()
            wrong = comm.allreduce(int(np.count_nonzero(recv != want)), op=MPI.SUM)
            # What auto ran, as the trace saw it (mpi4py's own call is not ringmpi's).
            label = f"auto({','.join(t.ran)})" if a == "auto" else a
            if rank == 0:
                sec = float(np.median(times[a]))
                algbw = count * 4 / sec / 1e9
                print(f"  {format_size(count * 4):>9} {count:>10} {label:>19} {sec * 1e6:>10.2f} "
                      f"{algbw:>11.3f} {algbw * (n - 1) / n:>11.3f} {wrong:>6} "
                      f"{t.bytes_sent:>10} {t.steps:>5}")  # fmt: skip
    return 0


def _buffers(command: str, count: int, block: int, n: int, rank: int):
    """(send, recv, the exact result) of one call."""
    if command == "reduce_scatter":
        send = verify_inputs(MPI.SUM, "float32", rank, count)
        full = verify_expected(MPI.SUM, "float32", n, count)
        return send, np.empty(block, np.float32), full[rank * block : (rank + 1) * block]
    mine = (np.arange(block) % 97 + rank).astype(np.float32)
    want = np.concatenate([(np.arange(block) % 97 + r).astype(np.float32) for r in range(n)])
    return mine, np.empty(count, np.float32), want


def _call(command: str, send: np.ndarray, recv: np.ndarray, algorithm: str):
    comm = MPI.COMM_WORLD
    if algorithm == "mpi4py" and command == "reduce_scatter":
        return lambda: comm.Reduce_scatter_block(send, recv)
    if algorithm == "mpi4py":
        return lambda: comm.Allgather(send, recv)
    if command == "reduce_scatter":
        return lambda: ringmpi.Reduce_scatter_block(send, recv, algorithm=algorithm)
    return lambda: ringmpi.Allgather(send, recv, algorithm=algorithm)


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("reduce_scatter", "allgather")
