"""The commands of ``python -m ringmpi``, one function each, and the dispatcher.

A command is registered by :func:`_register` under its own name, its docstring
the line ``python -m ringmpi --help`` lists; it imports its tool's module only
when it runs, so that listing them imports none (nor MPI, nor Numba). The
functions live here, not in the package, so that ``from ringmpi.tools import
report`` is the module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from types import ModuleType

from ._args import ArgumentParser, quiet_compiles

__all__ = ["command_parser", "main", "prog"]

_Command = Callable[[list[str]], int]
_registry: dict[str, _Command] = {}
_offline: set[str] = set()


def _register(command: _Command) -> _Command:
    _registry[command.__name__] = command
    return command


def _register_offline(command: _Command) -> _Command:
    """Register a command that does not communicate. Run as the program, it loads
    the MPI library (the compiled loops link against it) but does not start MPI:
    it needs no launcher, and leaves nothing in /dev/shm (Open MPI 5 leaves the
    segment of a process that started MPI without one)."""
    _offline.add(command.__name__)
    return _register(command)


def prog(command: str) -> str:
    """How ``command`` is typed: the ``prog`` of its argument parser."""
    return f"python -m ringmpi {command}"


def command_parser(command: str, doc: str | None = None) -> ArgumentParser:
    """The argument parser of ``command``: its summary (the line ``python -m ringmpi
    --help`` lists) as the description, the rest of its module's docstring ``doc``
    (past the first paragraph) as the epilog."""
    epilog = doc.split("\n\n", 1)[1] if doc and "\n\n" in doc else None
    return ArgumentParser(
        prog=prog(command), description=_summary(_registry[command]), epilog=epilog
    )


def _tool(name: str) -> ModuleType:
    return importlib.import_module(f"ringmpi.tools.{name}")


@_register
def allreduce(argv: list[str]) -> int:
    """Benchmark and verify all-reduce algorithms (under mpirun)."""
    return _tool("allreduce").main(argv)


@_register
def reduce_scatter(argv: list[str]) -> int:
    """Benchmark and verify the ring's reduce-scatter against the library's (under mpirun)."""
    return _tool("halves").main(argv, "reduce_scatter")


@_register
def allgather(argv: list[str]) -> int:
    """Benchmark and verify the ring's all-gather against the library's (under mpirun)."""
    return _tool("halves").main(argv, "allgather")


@_register_offline
def schedule(argv: list[str]) -> int:
    """Print the ring's step table and counted cost, or the hierarchical plan."""
    return _tool("schedule").main(argv)


@_register
def tune(argv: list[str]) -> int:
    """Measure the cost model's constants here, for RINGMPI_TUNING (under mpirun)."""
    return _tool("tune").main(argv)


@_register
def scaling(argv: list[str]) -> int:
    """Predict and check the cost model beyond one machine; measure the fabric."""
    return _tool("scaling").main(argv)


@_register_offline
def choices(argv: list[str]) -> int:
    """Print (and draw) auto's cost-model pick by buffer size and layout."""
    return _tool("choices").main(argv)


@_register
def trace(argv: list[str]) -> int:
    """Draw one call's schedule as it ran, rank by rank in time (under mpirun)."""
    return _tool("timeline").main(argv)


@_register_offline
def shm(argv: list[str]) -> int:
    """List or remove stale MPI shared-memory segments in /dev/shm."""
    return _tool("shm").main(argv)


@_register_offline
def report(argv: list[str]) -> int:
    """Merge allreduce --json results into one table (and a plot)."""
    return _tool("report").main(argv)


@_register_offline
def reliability(argv: list[str]) -> int:
    """Run the fault and stress cases under mpirun; print docs/reliability.md's tables."""
    return _tool("reliability").main(argv)


@_register
def buckets(argv: list[str]) -> int:
    """Benchmark fused buckets (allreduce_many) against one call per array (under mpirun)."""
    return _tool("buckets").main(argv)


@_register_offline
def kernels(argv: list[str]) -> int:
    """Warm Numba's cache for every (op, dtype), or benchmark the kernels."""
    return _tool("kernels").main(argv)


def _summary(command: _Command) -> str:
    return (command.__doc__ or "").strip().splitlines()[0]


def main(argv: list[str] | None = None) -> int:
    """Run one command: ``python -m ringmpi <command> [args]``."""
    width = max(map(len, _registry))
    parser = ArgumentParser(
        prog="python -m ringmpi",
        usage="%(prog)s <command> [args]",
        description="ringmpi's tools. `python -m ringmpi <command> --help` gives a command's "
        "own options.",
        epilog="commands:\n"
        + "\n".join(f"  {name:<{width}}  {_summary(c)}" for name, c in _registry.items()),
    )
    parser.add_argument("command", metavar="<command>", choices=_registry,
                        help="one of the commands below")  # fmt: skip
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="[args]",
                        help="the command's arguments")  # fmt: skip
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help(sys.stderr)
        parser.exit(
            2,
            "\nno command given: name one of the commands above, e.g. "
            "`python -m ringmpi schedule 4`\n",
        )
    args = parser.parse_args(argv)
    quiet_compiles()
    if argv is None and args.command in _offline and "mpi4py.MPI" not in sys.modules:
        import mpi4py  # noqa: PLC0415 (listing the commands imports no MPI)

        mpi4py.rc.initialize = mpi4py.rc.finalize = False
    return _registry[args.command](args.args)
