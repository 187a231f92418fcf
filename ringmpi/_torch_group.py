"""The ``ringmpi`` backend of ``torch.distributed``: a process group whose collectives
run on an MPI communicator of the group's ranks.

``import ringmpi.torch`` registers it for CPU tensors::

    dist.init_process_group("ringmpi")        # under mpirun: torch's rank is MPI's

torch's default rendezvous (``env://``) takes from MPI what the environment does
not give (:func:`_env_or_mpi`): the rank and world size MPI's, torch's store
hosted by ``MPI.COMM_WORLD``'s rank 0 on a port it picks (:func:`mpi_store`).
Where torchrun or the user set ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, they are what torch reads, as without ringmpi.

Each torch group gets its communicator when torch makes it: the default group
``MPI.COMM_WORLD`` (torch's rank must be the MPI rank: each rank checks its own
and, before any collective, every rank learns whether one disagrees); a
``new_group`` the communicator of its global ranks, made by the group's members
alone (``MPI_Comm_create_group``). All-reduce, its coalesced form,
reduce-scatter and all-gather go through ringmpi (auto's choice, the node's
shared memory on one node); the others through the MPI library's own calls.
An all-reduce of one contiguous tensor (what DDP's buckets are) runs on
ringmpi's progress thread where the rank has a spare core, its ``Work`` done
when the thread is; every other call completes before it returns, its
``Work`` done. Either way ``wait()`` and ``get_future()`` behave as Gloo's.
Tensors that are not contiguous go through a contiguous copy. Before any
data moves, every collective checks that the group's ranks agree on the call,
its tensors' dtypes and sizes and its root (_Group._agree).
"""

from __future__ import annotations

import ctypes
import datetime
import importlib
import os
import socket
import struct
import urllib.parse
import weakref
import zlib
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed import ReduceOp

from . import _api, _halves, _progress, _requests
from ._comm import context, running, waited
from ._errors import RingMPIError
from .kernels import AVG, as_dtype

__all__ = ["BACKEND", "group_comm", "mpi_store"]

BACKEND = "ringmpi"

# torch's reduction (its number) -> the MPI op ringmpi takes (AVG: ringmpi's own)
_OPS = {int(cast(Any, k)): v for k, v in {
    ReduceOp.SUM: MPI.SUM, ReduceOp.AVG: AVG, ReduceOp.PRODUCT: MPI.PROD,
    ReduceOp.MIN: MPI.MIN, ReduceOp.MAX: MPI.MAX, ReduceOp.BAND: MPI.BAND,
    ReduceOp.BOR: MPI.BOR, ReduceOp.BXOR: MPI.BXOR}.items()}  # fmt: skip


_HALF = (torch.float16, torch.bfloat16)
_HALF_OPS = (MPI.SUM, MPI.MAX, MPI.MIN, AVG)  # what ringmpi reduces the half types with
# bool as bytes of 0 and 1 (torch's sum and max of bools are their or, product and min
# their and)
_BOOL_OPS = {int(cast(Any, k)): v for k, v in {
    ReduceOp.SUM: MPI.MAX, ReduceOp.MAX: MPI.MAX, ReduceOp.BOR: MPI.MAX,
    ReduceOp.PRODUCT: MPI.MIN, ReduceOp.MIN: MPI.MIN, ReduceOp.BAND: MPI.MIN,
    ReduceOp.BXOR: MPI.BXOR}.items()}  # fmt: skip


# What the check before each collective compares across the group's ranks, one _ROW a
# rank: the call, its first tensor's dtype, the elements of all its tensors, a digest of
# every tensor's dtype and size, and the root.
_ROW = struct.Struct("5q")
_CALLS = ("all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
          "reduce_scatter_tensor", "all_gather", "reduce_scatter", "broadcast", "barrier",
          "reduce", "gather", "scatter", "all_to_all_single", "all_to_all")  # fmt: skip
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8,
           torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64,
           torch.complex128)  # fmt: skip
_CHECK_TAG = 1


def _describe(row: tuple[int, ...]) -> str:
    call, kind, count, _, root = row
    what = f"{_CALLS[call]} of {count} {_DTYPES[kind] if kind < len(_DTYPES) else '?'} elements"
    return what + (f", root {root}" if root >= 0 else "")


def _how(dtype: torch.dtype, opts: Any) -> tuple[Any, bool]:
    """The MPI op ringmpi reduces ``dtype`` with, and whether the tensor goes through
    float32 first (an op ringmpi has no 16-bit path for: rounded once). bool reduces as
    bytes of 0 and 1 (or, and, xor)."""
    if dtype == torch.bool:
        return _op(opts, _BOOL_OPS), False
    op = _op(opts)
    return op, dtype in _HALF and op not in _HALF_OPS


def _op(opts: Any, ops: dict = _OPS) -> Any:
    op = opts.reduceOp
    found = ops.get(int(cast(Any, op if isinstance(op, ReduceOp.RedOpType) else op.op)))
    if found is None:
        raise ValueError(f"the ringmpi backend does not reduce with {op}")
    return found


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of a contiguous CPU tensor (bfloat16 as ml_dtypes' bfloat16)."""
    if tensor.device.type != "cpu":
        raise TypeError(f"the ringmpi backend takes CPU tensors, not {tensor.device.type} ones")
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(as_dtype("bfloat16"))
    return t.numpy()


def _raw(tensor: torch.Tensor) -> np.ndarray:
    """A flat NumPy view of a contiguous CPU tensor's memory that holds no reference to
    it (its holder must not outlive the tensor: see _Group._view)."""
    kind = _array(torch.empty(0, dtype=tensor.dtype)).dtype  # (not the tensor's own numpy())
    memory = (ctypes.c_char * (tensor.numel() * tensor.element_size())).from_address(
        tensor.data_ptr())  # fmt: skip
    return np.frombuffer(cast(Any, memory), kind)


class _Contiguous:
    """A contiguous stand-in for ``tensor`` (itself where it is one), written back
    into it on exit."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.work = tensor if tensor.is_contiguous() else tensor.contiguous()

    def __enter__(self) -> np.ndarray:
        return _array(self.work).reshape(-1)

    def __exit__(self, *exc: object) -> None:
        if self.work is not self.tensor and exc[0] is None:
            self.tensor.copy_(self.work)


# torch's own classes, as Any: the methods below take what torch's C++ passes them,
# which its type stubs (written for the Python API) do not describe.
_ProcessGroup: Any = dist.ProcessGroup
_WorkBase: Any = dist.Work


class _Work(_WorkBase):
    """A call's Work: done with its future; ``wait`` raises the call's error (torch's
    Work made from a future returns True whatever the future holds)."""

    def __init__(self, future: torch.futures.Future[Any]) -> None:
        super().__init__()
        self.future = future

    def wait(self, timeout: Any = None) -> bool:
        self.future.wait()
        return True

    def is_completed(self) -> bool:
        return self.future.done()

    def get_future(self) -> torch.futures.Future[Any]:
        return self.future


def _done(result: Any) -> _Work:
    future: torch.futures.Future[Any] = torch.futures.Future()
    future.set_result(result)
    return _Work(future)


class _Group(_ProcessGroup):
    """One torch group on one MPI communicator of the same ranks, in the same order."""

    def __init__(self, comm: MPI.Intracomm, timeout: datetime.timedelta) -> None:
        super().__init__(comm.Get_rank(), comm.Get_size())
        comm.Set_errhandler(MPI.ERRORS_RETURN)  # the library's errors raise, on that rank
        self.comm = comm
        self.timeout = timeout.total_seconds()
        self._name = self._desc = ""
        # One NumPy view per tensor, dropped with it: ringmpi's repeat path knows a call by
        # its array object, so the same tensor's next all-reduce (DDP's buckets, step
        # after step) runs from there, not through the full path a new view would take.
        self._views: dict[int, tuple] = {}  # id(tensor) -> (weak ref, memory, view)
        # the check's messages (see _agree): persistent requests on a communicator of
        # their own, which each check starts
        check, n, me = comm.Dup(), comm.Get_size(), comm.Get_rank()
        self._rows, self._mine = bytearray(n * _ROW.size), bytearray(_ROW.size)
        self._peers = [p for p in range(n) if p != me]
        self._reqs = [
            check.Recv_init(
                [memoryview(self._rows)[p * _ROW.size :][: _ROW.size], MPI.BYTE], p, _CHECK_TAG
            )
            for p in self._peers
        ]
        self._reqs += [check.Send_init([self._mine, MPI.BYTE], p, _CHECK_TAG)
                       for p in self._peers]  # fmt: skip
        self._check_comm = check
        self._broken = ""

    def shutdown(self) -> None:
        """torch's destroy_process_group (every member calls it, after the group's
        pending Works): the check's requests and both communicators freed, ringmpi's
        state for the group with them."""
        if self.comm == MPI.COMM_NULL or not running():
            return
        self._broken = "destroyed: the group's communicator is freed"
        for req in self._reqs:
            req.Free()
        self._check_comm.Free()
        self.comm.Free()

    def _agree(self, call: str, tensors: list[torch.Tensor], root: int = -1) -> None:
        """Before a collective moves any data: every rank of the group makes the same
        call with tensors of the same dtypes and elements, and the same root. Where one
        differs, every rank raises ValueError naming each rank's; a rank that does not
        come within the group's timeout is named (RingMPIError), and the group's later
        calls raise it too. One message to and from each other rank: a few
        microseconds at 2 ranks."""
        if self._broken:
            raise RingMPIError(self._broken)
        n, me = self.size(), self.rank()
        kind = tensors[0].dtype if tensors else torch.uint8
        digest = zlib.crc32(repr([(t.dtype, t.numel()) for t in tensors]).encode()) \
            if len(tensors) > 1 else 0  # fmt: skip
        _ROW.pack_into(self._mine, 0, _CALLS.index(call),
                       _DTYPES.index(kind) if kind in _DTYPES else len(_DTYPES),
                       sum(t.numel() for t in tensors), digest, root)  # fmt: skip
        if n == 1:
            return
        rows, mine, reqs = self._rows, self._mine, self._reqs
        rows[me * _ROW.size : (me + 1) * _ROW.size] = mine
        MPI.Prequest.Startall(reqs)
        if not MPI.Request.Testall(reqs) and not self._waited(lambda: MPI.Request.Testall(reqs)):
            missing = [p for p, r in zip(self._peers, reqs, strict=False) if not r.Test()]
            for req in reqs:
                req.Cancel()
            self._broken = self._late(call, missing)
            raise RingMPIError(self._broken)
        if rows == mine * n:
            return
        kinds: dict[str, list[int]] = {}
        for r in range(n):
            kinds.setdefault(_describe(_ROW.unpack_from(rows, r * _ROW.size)), []).append(r)
        if len(kinds) == 1:
            said = "the same elements in tensors of other sizes or dtypes"
        else:
            said = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {k}"
                             for k, rs in kinds.items())  # fmt: skip
        raise ValueError(f"the ringmpi backend: the group's ranks disagree on {call}: {said}")

    def _waited(self, done: Any) -> bool:
        """Whether ``done()`` came true within the group's timeout."""
        return waited(done, self.timeout or float("inf"))

    def _late(self, what: str, ranks: list[int]) -> str:
        return (f"rank {self.rank()}: {what}: waited {self.timeout:g} s for rank"
                f"{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} without "
                "progress (timeout: the group's)")  # fmt: skip

    def getBackendName(self) -> str:
        return BACKEND

    # torch names a group through its backends, which a Python group has none of
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    # --- through ringmpi ---------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        _op(opts)  # (a bad op raises before any message)
        self._agree("all_reduce", tensors)
        return self._allreduce(tensors, opts)

    def _allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        for tensor in tensors:
            op, widen = _how(tensor.dtype, opts)
            if widen:
                wide = tensor.to(torch.float32)
                self._allreduce([wide], opts).wait()
                tensor.copy_(wide)
            elif len(tensors) == 1 and tensor.is_contiguous() and tensor.dtype != torch.bool:
                return self._started(tensors, op)
            else:
                with _Contiguous(tensor) as a:
                    _api.Allreduce(MPI.IN_PLACE, _bytes(a) if tensor.dtype == torch.bool else a,
                                   op, self.comm, timeout=self.timeout)  # fmt: skip
        return _done(tensors)

    def _started(self, tensors: list[torch.Tensor], op: Any) -> Any:
        """The all-reduce of one contiguous tensor, on ringmpi's progress thread where a
        rank has a spare core (its Work done when the thread is), else at once."""
        if not _progress.threaded(context(self.comm)):  # at once: from the repeat path
            _api.Allreduce(MPI.IN_PLACE, self._view(tensors[0]), op, self.comm,
                           timeout=self.timeout)  # fmt: skip
            return _done(tensors)
        future: torch.futures.Future[Any] = torch.futures.Future()

        def then(error: BaseException | None) -> None:
            if error is None:
                future.set_result(tensors)
            else:
                future.set_exception(cast(Any, error))

        _requests.start(self._view(tensors[0]), op, self.comm, then, self.timeout)
        return _Work(future)

    def _view(self, tensor: torch.Tensor) -> np.ndarray:
        """``tensor``'s flat NumPy view, the same object while its memory is the same."""
        where = (tensor.data_ptr(), tensor.numel(), tensor.dtype)
        found = self._views.get(id(tensor))
        if found is None or found[0]() is not tensor or found[1] != where:
            if not tensor.numel():
                return _array(tensor).reshape(-1)
            views, key = self._views, id(tensor)
            ref = weakref.ref(tensor, lambda _: views.pop(key, None))
            found = views[key] = (ref, where, _raw(tensor))
        return found[2]

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        _op(opts)
        self._agree("all_reduce_coalesced", tensors)
        return self._allreduce_coalesced(tensors, opts)

    def _allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        kinds = {t.dtype for t in tensors}
        if len(kinds) != 1:  # one flat buffer a dtype
            for kind in kinds:
                self._allreduce_coalesced([t for t in tensors if t.dtype == kind], opts)
            return _done(tensors)
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self._allreduce([flat], opts).wait()
        at = 0
        for t in tensors:
            t.copy_(flat[at : at + t.numel()].view_as(t))
            at += t.numel()
        return _done(tensors)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> Any:  # fmt: skip
        self._agree("all_gather_into_tensor", [input, output])
        return self._all_gather_single(output, input)

    def _all_gather_single(self, output: torch.Tensor, input: torch.Tensor) -> Any:
        with _Contiguous(output) as out, _Contiguous(input) as inp:
            send: Any = _bytes(inp)  # bytes move (the library's call takes no bfloat16)
            at = inp.ctypes.data - out.ctypes.data  # FSDP gathers into its own block
            if 0 <= at < out.nbytes or 0 <= -at < inp.nbytes:  # the two overlap
                send = MPI.IN_PLACE if at == self.rank() * inp.nbytes else send.copy()
            _halves.Allgather(send, _bytes(out), self.comm, timeout=self.timeout)
        return _done(output)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> Any:  # fmt: skip
        _op(opts)  # (a bad op raises before any message)
        self._agree("reduce_scatter_tensor", [input, output])
        return self._reduce_scatter_single(output, input, opts)

    def _reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                               opts: Any) -> Any:  # fmt: skip
        op, widen = _how(input.dtype, opts)
        if widen:
            wide = output.to(torch.float32)
            self._reduce_scatter_single(wide, input.to(torch.float32), opts)
            output.copy_(wide)
            return _done(output)
        raw = _bytes if input.dtype == torch.bool else (lambda a: a)
        with _Contiguous(output) as out, _Contiguous(input) as inp:
            _halves.Reduce_scatter_block(raw(inp), raw(out), op, self.comm, timeout=self.timeout)
        return _done(output)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor],
                                    opts: Any = None) -> Any:  # fmt: skip
        """torch's functional all-gather (DTensor's, FSDP2's in torch.compile)."""
        self._agree("all_gather_into_tensor", [*inputs, *outputs])
        for output, input in zip(outputs, inputs, strict=True):
            self._all_gather_single(output, input)
        return _done(outputs)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor],
                                        opts: Any = None) -> Any:  # fmt: skip
        """torch's functional reduce-scatter."""
        _op(opts)
        self._agree("reduce_scatter_tensor", [*inputs, *outputs])
        for output, input in zip(outputs, inputs, strict=True):
            self._reduce_scatter_single(output, input, opts)
        return _done(outputs)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> Any:  # fmt: skip
        self._agree("all_gather", [*inputs, *(t for outs in outputs for t in outs)])
        for outs, tensor in zip(outputs, inputs, strict=True):
            whole = torch.empty((self.size(), *tensor.shape), dtype=tensor.dtype)
            self._all_gather_single(whole, tensor)
            for r, out in enumerate(outs):
                out.copy_(whole[r])
        return _done(outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> Any:  # fmt: skip
        _op(opts)
        self._agree("reduce_scatter", [*outputs, *(t for parts in inputs for t in parts)])
        for out, parts in zip(outputs, inputs, strict=True):
            self._reduce_scatter_single(out, torch.stack([p.reshape(out.shape) for p in parts]),
                                        opts)  # fmt: skip
        return _done(outputs)

    # --- through the MPI library ---------------------------------------------------------

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        self._agree("broadcast", tensors, opts.rootRank)
        for tensor in tensors:
            with _Contiguous(tensor) as a:
                self.comm.Bcast(_bytes(a), root=opts.rootRank)
        return _done(tensors)

    def barrier(self, opts: Any = None) -> Any:
        self._agree("barrier", [])  # every rank has heard from every other: a barrier
        return _done(None)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        # an all-reduce: ringmpi's, whose answer every rank has; the root keeps it
        root = opts.rootRank
        _op(opts)
        self._agree("reduce", tensors, root)
        for tensor in tensors:
            kept = tensor.clone() if self.rank() != root else tensor
            self._allreduce([kept], opts).wait()
        return _done(tensors)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> Any:  # fmt: skip
        root = opts.rootRank
        self._agree("gather", inputs, root)
        for i, tensor in enumerate(inputs):
            whole = torch.empty((self.size(), *tensor.shape), dtype=tensor.dtype)
            with _Contiguous(tensor) as inp:
                self.comm.Gather(_bytes(inp), _bytes(_array(whole)) if self.rank() == root
                                 else None, root=root)  # fmt: skip
            if self.rank() == root:
                for r, out in enumerate(outputs[i]):
                    out.copy_(whole[r])
        return _done(outputs)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any = None) -> Any:  # fmt: skip
        root = opts.rootRank
        self._agree("scatter", outputs, root)
        for i, tensor in enumerate(outputs):
            whole = torch.stack([p.reshape(tensor.shape) for p in inputs[i]]).contiguous() \
                if self.rank() == root else None  # fmt: skip
            with _Contiguous(tensor) as out:
                self.comm.Scatter(None if whole is None else _bytes(_array(whole)), _bytes(out),
                                  root=root)  # fmt: skip
        return _done(outputs)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor,
                      output_splits: list[int], input_splits: list[int],
                      opts: Any = None) -> Any:  # fmt: skip
        # the dtypes compared (each pair's counts are the library's to check: the
        # receiver of more than it expects raises)
        self._agree("all_to_all_single", [torch.empty(0, dtype=input.dtype)])
        n = self.size()
        with _Contiguous(output) as out, _Contiguous(input) as inp:
            rows_out = max(1, output.shape[0]) if output.dim() else 1
            rows_in = max(1, input.shape[0]) if input.dim() else 1
            per_out, per_in = out.nbytes // rows_out, inp.nbytes // rows_in
            o_counts = [per_out * c for c in (output_splits or [rows_out // n] * n)]
            i_counts = [per_in * c for c in (input_splits or [rows_in // n] * n)]
            self.comm.Alltoallv([_bytes(inp), (i_counts, _starts(i_counts))],
                                [_bytes(out), (o_counts, _starts(o_counts))])  # fmt: skip
        return _done(output)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> Any:  # fmt: skip
        self._agree("all_to_all", [torch.empty(0, dtype=inputs[0].dtype)])
        send = torch.cat([t.reshape(-1) for t in inputs])
        recv = torch.empty(sum(t.numel() for t in outputs), dtype=outputs[0].dtype)
        per = send.element_size()
        i_counts, o_counts = [t.numel() * per for t in inputs], [t.numel() * per for t in outputs]
        self.comm.Alltoallv([_bytes(_array(send)), (i_counts, _starts(i_counts))],
                            [_bytes(_array(recv)), (o_counts, _starts(o_counts))])  # fmt: skip
        at = 0
        for t in outputs:
            t.copy_(recv[at : at + t.numel()].view_as(t))
            at += t.numel()
        return _done(outputs)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        for tensor in tensors:
            with _Contiguous(tensor) as a:
                req = self.comm.Isend(_bytes(a), dest=dst, tag=tag)
                if not self._waited(req.Test):
                    req.Cancel()
                    raise RingMPIError(self._late(f"send to rank {dst}", [dst]))
        return _done(tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        """The message's size is checked against the tensor's (the sender is not told)."""
        status = MPI.Status()
        for tensor in tensors:
            message = self._probed(src, tag, status)
            with _Contiguous(tensor) as a:
                sent = status.Get_count(MPI.BYTE)
                if sent != a.nbytes:
                    message.Recv(bytearray(sent))
                    raise ValueError(f"the ringmpi backend: rank {self.rank()} receives "
                                     f"{tensor.numel()} {tensor.dtype} elements ({a.nbytes} "
                                     f"bytes) from rank {src}, which sent "
                                     f"{sent} bytes")  # fmt: skip
                message.Recv(_bytes(a))
        return _done(tensors)

    def _probed(self, src: int, tag: int, status: MPI.Status) -> MPI.Message:
        """The next message from ``src`` with ``tag``, matched (its size in ``status``)."""
        found: list[MPI.Message | None] = [None]

        def arrived() -> bool:
            found[0] = self.comm.improbe(src, tag, status)
            return found[0] is not None

        if not self._waited(arrived):
            raise RingMPIError(self._late(f"recv from rank {src}", [src]))
        return cast(MPI.Message, found[0])


def _starts(counts: list[int]) -> list[int]:
    return [sum(counts[:i]) for i in range(len(counts))]


def _bytes(array: np.ndarray) -> np.ndarray:
    """``array``'s bytes: what a copy (not a reduction) moves, for any dtype."""
    return array.view(np.uint8)


def group_comm(global_ranks: list[int], group_id: str) -> MPI.Intracomm:
    """The communicator of ``global_ranks`` (COMM_WORLD's ranks, in torch's order),
    made by those ranks alone."""
    world = MPI.COMM_WORLD
    if list(global_ranks) == list(range(world.Get_size())):
        return world.Dup()
    group = world.Get_group().Incl(list(global_ranks))
    try:
        tag = zlib.crc32(group_id.encode()) % max(1, world.Get_attr(MPI.TAG_UB) or 32767)
        return world.Create_group(group, tag)
    finally:
        group.Free()


def _create(common: Any, backend_opts: Any) -> _Group:
    """torch's creator of a ``ringmpi`` group (``register_backend``'s extended form)."""
    ranks = list(common.global_ranks_in_group) or list(range(common.group_size))
    world = MPI.COMM_WORLD
    if not MPI.Is_initialized() or MPI.Is_finalized():
        raise RuntimeError("the ringmpi backend needs MPI: start the job with mpirun or srun")
    if not common.global_ranks_in_group and common.group_size > world.Get_size():
        # (a default group of MPI's first ranks is one, but not of ranks MPI has not)
        raise RuntimeError(f"the ringmpi backend: torch's world size {common.group_size} is "
                           f"more than MPI's ({world.Get_size()} ranks in MPI.COMM_WORLD): "
                           "WORLD_SIZE in the environment or init_process_group's "
                           "world_size= (left unset, it is MPI's)")  # fmt: skip
    me = ranks[common.group_rank] if common.group_rank < len(ranks) else -1
    if len(ranks) == common.group_size == world.Get_size() and ranks == list(range(len(ranks))):
        # The default group: torch's ranks must be MPI's, checked on every rank at once.
        mine = common.group_rank
        theirs = world.allgather(mine)
        wrong = [(r, t) for r, t in enumerate(theirs) if r != t]
        if wrong:
            said = ", ".join(f"MPI rank {r} is torch rank {t}" for r, t in wrong[:4])
            raise RuntimeError(f"the ringmpi backend needs torch's ranks to be MPI's: {said} "
                               "(RANK in the environment, or init_process_group's rank=, "
                               "must be MPI.COMM_WORLD's rank: left unset, it is)")  # fmt: skip
    elif me != world.Get_rank():
        raise RuntimeError(f"the ringmpi backend: torch puts MPI rank {world.Get_rank()} at "
                           f"group rank {common.group_rank} of global ranks {ranks}")  # fmt: skip
    comm = group_comm(ranks, str(common.group_id))
    # ringmpi's state for it now, while every member is here: made at a first call
    # instead, its collectives could wait for a rank that never comes, past any timeout
    context(comm)
    return _Group(comm, common.timeout)


def mpi_store(comm: MPI.Intracomm, timeout: datetime.timedelta = dist.default_pg_timeout,
              host: str | None = None, port: int = 0) -> dist.TCPStore:  # fmt: skip
    """torch's store for ``comm``'s ranks (collective): a TCPStore that ``comm``'s
    rank 0 hosts at ``host`` (None: its own name) on ``port`` (0: a free one, which
    the store binds as it picks it), every other rank its client, told where over
    MPI."""
    where = None
    if comm.Get_rank() == 0:
        # multi-tenant as torch's env:// makes it; its clients connect after the
        # broadcast below, so it cannot wait for them here
        store = dist.TCPStore(host or socket.gethostname(), port, comm.Get_size(), True,
                              timeout, wait_for_workers=False, multi_tenant=True)  # fmt: skip
        where = (store.host, store.port)
    host, port = comm.bcast(where)
    if comm.Get_rank() != 0:
        store = dist.TCPStore(host, port, comm.Get_size(), False, timeout)
    # every client connected before rank 0 goes on: where it raises next (a world size
    # over MPI's), its store goes with it, and a client still connecting would wait out
    # the timeout
    comm.Barrier()
    return store


def _env_or_mpi(url: str, timeout: datetime.timedelta = dist.default_pg_timeout,
                **kwargs: Any) -> Iterator[tuple[Any, int, int]]:  # fmt: skip
    """torch's ``env://`` rendezvous, what the environment leaves out taken from MPI:
    the rank and the world size MPI's (given to torch's own as ``rank=`` and
    ``world_size=`` would be), and without both ``MASTER_ADDR`` and ``MASTER_PORT``
    a store that ``MPI.COMM_WORLD``'s rank 0 hosts, at ``MASTER_ADDR`` or its own
    name, on ``MASTER_PORT`` or a port it picks. A value the environment (or the
    call) gives is the one used: a ``RANK`` that is not MPI's reaches _create, which
    names it."""
    if not MPI.Is_initialized() or MPI.Is_finalized():  # no MPI to ask: torch's own
        yield from _TORCH_ENV(url, timeout=timeout, **kwargs)
        return
    world = MPI.COMM_WORLD
    parts = urllib.parse.urlparse(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    # (torch reads an empty variable as unset, and so does this)
    rank = int(query.get("rank") or os.environ.get("RANK") or world.Get_rank())
    size = int(query.get("world_size") or os.environ.get("WORLD_SIZE") or world.Get_size())
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if host and port:
        query.update(rank=str(rank), world_size=str(size))
        url = parts._replace(query=urllib.parse.urlencode(query)).geturl()
        yield from _TORCH_ENV(url, timeout=timeout, **kwargs)
        return
    yield mpi_store(world, timeout, host, int(port or 0)), rank, size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")  # as torch's


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])

# torch makes the default group's store before it looks at the backend: a backend has
# no say in the rendezvous, and register_rendezvous_handler refuses a scheme torch has.
# So its env:// handler (the default init_method) is replaced in its table, by one that
# calls it wherever the environment gives what it reads, as without ringmpi. A torch
# without that table keeps its own: there the environment must give all four.
_HANDLERS = getattr(importlib.import_module("torch.distributed.rendezvous"),
                    "_rendezvous_handlers", {})  # fmt: skip
if "env" in _HANDLERS:
    _TORCH_ENV = _HANDLERS["env"]
    _HANDLERS["env"] = _env_or_mpi
