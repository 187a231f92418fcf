"""ringmpi.Comm: an mpi4py communicator whose collectives go through ringmpi."""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from . import _direct, _halves, _requests
from ._api import Allreduce, allreduce
from ._comm import check_comm
from .kernels import reduction

__all__ = ["Comm"]


class Comm(MPI.Intracomm):
    """An mpi4py intracommunicator whose ``Allreduce``, ``Reduce_scatter_block``,
    ``Reduce_scatter``, ``Allgather``, their nonblocking (``Iallreduce`` ...) and
    persistent (``Allreduce_init`` ...) forms, and ``allreduce`` go through ringmpi.

    It is the same MPI communicator (a new Python handle to it), so every other
    method and attribute is the wrapped communicator's own (the ``info`` of the
    ``..._init`` methods is taken and not used: ringmpi reads no hints)::

        comm = ringmpi.Comm(MPI.COMM_WORLD)   # the one-line change
    """

    def __new__(cls, comm: MPI.Intracomm | None = None) -> Comm:
        return super().__new__(cls, check_comm(comm))

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        Allreduce(sendbuf, recvbuf, op, self)

    # Its repeats run from C, as the function's do, whatever the call's form.
    Allreduce = _direct.method(Allreduce)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> None:
        if _TO_LIBRARY(self, "Reduce_scatter_block", sendbuf, recvbuf, op):
            return _LIBRARY_RSB(self, sendbuf, recvbuf, op)  # as auto would, in one test
        _halves.Reduce_scatter_block(sendbuf, recvbuf, op, self)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                       op: Any = MPI.SUM) -> None:  # fmt: skip
        if _TO_LIBRARY(self, "Reduce_scatter", sendbuf, recvbuf, op):
            return _LIBRARY_RS(self, sendbuf, recvbuf, recvcounts, op)  # as auto would
        _halves.Reduce_scatter(sendbuf, recvbuf, recvcounts, op, self)

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        if _TO_LIBRARY(self, "Allgather", None, recvbuf):
            return _LIBRARY_ALLGATHER(self, sendbuf, recvbuf)  # as auto would, in one test
        _halves.Allgather(sendbuf, recvbuf, self)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> MPI.Request:
        return _requests.Iallreduce(sendbuf, recvbuf, op, self)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM) -> MPI.Request:
        return _requests.Ireduce_scatter_block(sendbuf, recvbuf, op, self)

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                        op: Any = MPI.SUM) -> MPI.Request:  # fmt: skip
        return _requests.Ireduce_scatter(sendbuf, recvbuf, recvcounts, op, self)

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> MPI.Request:
        return _requests.Iallgather(sendbuf, recvbuf, self)

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                       info: MPI.Info = MPI.INFO_NULL) -> MPI.Prequest:  # fmt: skip
        return _requests.Allreduce_init(sendbuf, recvbuf, op, self)

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = MPI.SUM,
                                  info: MPI.Info = MPI.INFO_NULL) -> MPI.Prequest:  # fmt: skip
        return _requests.Reduce_scatter_block_init(sendbuf, recvbuf, op, self)

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None,
                            op: Any = MPI.SUM, info: MPI.Info = MPI.INFO_NULL
                            ) -> MPI.Prequest:  # fmt: skip
        return _requests.Reduce_scatter_init(sendbuf, recvbuf, recvcounts, op, self)

    def Allgather_init(self, sendbuf: Any, recvbuf: Any,
                       info: MPI.Info = MPI.INFO_NULL) -> MPI.Prequest:  # fmt: skip
        return _requests.Allgather_init(sendbuf, recvbuf, self)

    def allreduce(self, sendobj: Any, op: Any = MPI.SUM) -> Any:
        """A NumPy array that ringmpi reduces goes through ringmpi; any other object (and
        an op or dtype it does not reduce) through mpi4py's pickle path."""
        if isinstance(sendobj, np.ndarray) and _reduces(op, sendobj.dtype):
            return allreduce(sendobj, op, self)
        return super().allreduce(sendobj, op)


def _reduces(op: Any, dtype: np.dtype) -> bool:
    """Whether ringmpi reduces ``op`` on ``dtype`` itself."""
    try:
        reduction(op, dtype)
    except (TypeError, ValueError):
        return False
    return True


_LIBRARY_ALLGATHER = MPI.Intracomm.Allgather
_LIBRARY_RSB, _LIBRARY_RS = MPI.Intracomm.Reduce_scatter_block, MPI.Intracomm.Reduce_scatter
# Whether auto hands a reduce-scatter or all-gather straight to the library: the
# wrapper's methods ask first, so that what they add to such a call is one test.
_TO_LIBRARY = _halves._to_library
