"""ringmpi: a bandwidth-optimal ring all-reduce for mpi4py programs.

::

    from mpi4py import MPI
    import ringmpi

    ringmpi.Allreduce(MPI.IN_PLACE, grads, op=ringmpi.AVG)   # like comm.Allreduce
    total = ringmpi.allreduce(x)                              # a new array
    comm = ringmpi.Comm(MPI.COMM_WORLD)                       # or wrap the communicator
"""

from __future__ import annotations

import sys
import types

from ._api import Allreduce, Comm, allreduce
from ._errors import RingMPIError
from .kernels import AVG
from ._trace import Trace, trace

__all__ = [
    "AVG",
    "Allreduce",
    "Comm",
    "RingMPIError",
    "Trace",
    "allreduce",
    "trace",
]

__version__ = "0.1.0"


class _Package(types.ModuleType):
    # `python -m ringmpi.allreduce` is the CLI module, while `ringmpi.allreduce` is
    # the function. Importing a submodule binds it as an attribute of its package,
    # which would hide the function; keep the function bound instead.
    def __setattr__(self, name: str, value: object) -> None:
        if name == "allreduce" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
