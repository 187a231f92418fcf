"""What a module run as a program says, and which rank of a job says it."""

from __future__ import annotations

import os
import shlex
import sys
from typing import NoReturn

__all__ = ["launcher_rank", "not_a_program"]

# Where launchers put a process's rank: Open MPI's mpirun, PMIx, MPICH's and
# Intel MPI's Hydra, Slurm's srun.
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    """This process's rank in its job, found without starting MPI: COMM_WORLD's where
    MPI runs, else the launcher's variable, else 0 (not launched)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def not_a_program(*commands: str) -> NoReturn:
    """Exit 2 saying that the module run as ``__main__`` is not a program and which
    ``python -m ringmpi`` commands are its tool (or where they are listed, for none).

    The one tail of every module a user may run by mistake; rank 0 alone says it."""
    spec = sys.modules["__main__"].__spec__
    module = spec.name if spec is not None else sys.argv[0]
    args = "".join(" " + shlex.quote(a) for a in sys.argv[1:])
    tools = " and ".join(f"`python -m ringmpi {c}{args}`" for c in commands)
    if len(commands) > 1:
        where = f"the tools are {tools}"
    elif commands:
        where = f"the tool is {tools}"
    else:
        where = "`python -m ringmpi --help` lists the tools"
    if launcher_rank() == 0:
        print(f"{module} is a module of ringmpi, not a program: {where}", file=sys.stderr)
    raise SystemExit(2)
