"""ringmpi: a bandwidth-optimal ring all-reduce for mpi4py programs.

::

    from mpi4py import MPI
    import ringmpi

    ringmpi.Allreduce(MPI.IN_PLACE, grads, op=ringmpi.AVG)   # like comm.Allreduce
    req = ringmpi.Iallreduce(MPI.IN_PLACE, grads); req.Wait() # like comm.Iallreduce
    ringmpi.Reduce_scatter_block(x, mine); ringmpi.Allgather(mine, x)  # the ring's halves
    total = ringmpi.allreduce(x)                              # a new array
    ringmpi.allreduce_many(grads_list, op=ringmpi.AVG)        # many arrays, few collectives
    x = ringmpi.zeros(n); ringmpi.Allreduce(MPI.IN_PLACE, x)  # in the node's window: one copy
    comm = ringmpi.Comm(MPI.COMM_WORLD)                       # or wrap the communicator
    ringmpi.configure(timeout=30)                             # settings, as RINGMPI_TIMEOUT
    ringmpi.warm(np.float32)                                  # compile before timing starts

The tools: ``python -m ringmpi <command>`` (``python -m ringmpi --help`` lists them).
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING

__all__ = [
    "AVG",
    "Allgather",
    "Allgather_init",
    "Allreduce",
    "Allreduce_init",
    "Comm",
    "CompileWarning",
    "Iallgather",
    "Iallreduce",
    "Ireduce_scatter",
    "Ireduce_scatter_block",
    "Prequest",
    "Reduce_scatter",
    "Reduce_scatter_block",
    "Reduce_scatter_block_init",
    "Reduce_scatter_init",
    "RingMPIError",
    "Trace",
    "UnsupportedError",
    "abort_on_error",
    "allreduce",
    "allreduce_many",
    "configure",
    "configured",
    "empty",
    "trace",
    "warm",
    "zeros",
]

__version__ = "0.1.0"

# The API loads on first use: `import ringmpi` alone loads neither MPI nor Numba.
_WHERE = {
    "AVG": "kernels",
    "Allgather": "_halves",
    "Allgather_init": "_requests",
    "Allreduce": "_api",
    "Allreduce_init": "_requests",
    "Comm": "_wrapper",
    "CompileWarning": "_numba_cache",
    "Iallgather": "_requests",
    "Iallreduce": "_requests",
    "Ireduce_scatter": "_requests",
    "Ireduce_scatter_block": "_requests",
    "Prequest": "_requests",
    "Reduce_scatter": "_halves",
    "Reduce_scatter_block": "_halves",
    "Reduce_scatter_block_init": "_requests",
    "Reduce_scatter_init": "_requests",
    "RingMPIError": "_errors",
    "Trace": "_trace",
    "UnsupportedError": "_errors",
    "abort_on_error": "_errors",
    "allreduce": "_api",
    "allreduce_many": "buckets",
    "configure": "_api",  # which loads the registry, whose names configure checks
    "configured": "_api",
    "empty": "algorithms.symmetric",
    "trace": "_trace",
    "warm": "_api",
    "zeros": "algorithms.symmetric",
}

if TYPE_CHECKING:
    from ._api import Allreduce, allreduce, configure, configured, warm
    from ._errors import RingMPIError, UnsupportedError, abort_on_error
    from ._halves import Allgather, Reduce_scatter, Reduce_scatter_block
    from ._numba_cache import CompileWarning
    from ._requests import (
        Allgather_init,
        Allreduce_init,
        Iallgather,
        Iallreduce,
        Ireduce_scatter,
        Ireduce_scatter_block,
        Prequest,
        Reduce_scatter_block_init,  # fmt: skip
        Reduce_scatter_init,
    )
    from ._trace import Trace, trace
    from ._wrapper import Comm
    from .algorithms.symmetric import empty, zeros
    from .buckets import allreduce_many
    from .kernels import AVG


def __getattr__(name: str) -> object:
    if name in _WHERE:
        value = getattr(_importlib.import_module(f".{_WHERE[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ringmpi' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API, the loaded submodules and the module's own dunder names, each once."""
    here = (n for n, v in globals().items() if not n.startswith("_") and n not in _HIDDEN)
    return sorted({*__all__, *here, *(n for n in globals() if n.startswith("__"))})


# Names of this module's own machinery, not of the API.
_HIDDEN = {"TYPE_CHECKING", "annotations"}
