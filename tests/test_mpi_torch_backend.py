"""The ``ringmpi`` backend of torch.distributed against a Gloo group of the same ranks.

Every rank's input is a function of its rank (small integers, in float types
too, so that every order of a reduction is exact): each rank computes every
rank's input, and so the exact answer, itself. Each collective's answer must be
that, and Gloo's bit for bit where Gloo has the collective (make test-torch).
"""

from __future__ import annotations

import datetime
import functools
import gc
import types

import pytest
from conftest import agree
from mpi4py import MPI

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from torch_train import differences, fit, mlp, train_ddp  # noqa: E402

import ringmpi.torch  # noqa: E402
from ringmpi import _torch_group  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.torch]

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
R = dist.ReduceOp
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool]  # fmt: skip
OPS = [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


@pytest.fixture(scope="module")
def gloo():
    """The default group on the ringmpi backend; returns a Gloo group of the same ranks."""
    ringmpi.torch.init_process_group(WORLD, backend="ringmpi")
    assert dist.get_backend() == "ringmpi"
    yield dist.new_group(backend="gloo")
    dist.destroy_process_group()


def _input(rank: int, dtype, n: int = 13):
    values = torch.arange(n) % 3 + 1 + rank  # 1 .. 3 + rank: products stay exact
    if dtype == torch.bool:
        return (values + rank) % 2 == 0
    return values.to(dtype)


def _exact(op, dtype):
    """The reduction of every rank's input, computed here."""
    parts = [_input(r, dtype) for r in range(SIZE)]
    if dtype == torch.bool or op in (R.BAND, R.BOR, R.BXOR):
        fn = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor,
              R.SUM: torch.logical_or, R.MAX: torch.logical_or, R.MIN: torch.logical_and,
              R.PRODUCT: torch.logical_and}[op]  # fmt: skip
        return functools.reduce(fn, parts)
    wide = torch.stack([p.to(torch.float64) for p in parts])
    value = {R.SUM: wide.sum(0), R.AVG: wide.mean(0), R.PRODUCT: wide.prod(0),
             R.MIN: wide.min(0).values, R.MAX: wide.max(0).values}[op]  # fmt: skip
    if not dtype.is_floating_point:
        value = value.to(torch.int64).to(dtype)  # wraps as the integer type does
    return value.to(dtype)


def _applies(op, dtype) -> bool:
    if op in (R.BAND, R.BOR, R.BXOR):
        return not dtype.is_floating_point
    return op != R.AVG or dtype.is_floating_point


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS, ids=str)
def test_all_reduce_is_exact_and_gloos_bits(gloo, op, dtype):
    if not _applies(op, dtype):
        pytest.skip(f"torch does not define {op} for {dtype}")
    problems = []
    ours = _input(RANK, dtype)
    dist.all_reduce(ours, op)
    if not torch.equal(ours, _exact(op, dtype)):
        problems.append(f"{ours.tolist()} is not the exact {_exact(op, dtype).tolist()}")
    theirs = _input(RANK, dtype)
    try:
        dist.all_reduce(theirs, op, group=gloo)
    except (RuntimeError, ValueError):
        theirs = None  # Gloo does not reduce so
    if theirs is not None and not torch.equal(ours, theirs):
        problems.append(f"{ours.tolist()} is not Gloo's {theirs.tolist()}")
    agree(WORLD, problems)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS, ids=str)
def test_the_reducing_collectives_are_exact_and_gloos_bits(gloo, op, dtype):
    if not _applies(op, dtype):
        pytest.skip(f"torch does not define {op} for {dtype}")
    problems = []
    exact, mine = _exact(op, dtype), _input(RANK, dtype)
    for group in (None, gloo):
        who = "Gloo's" if group is gloo else "ours"
        calls = {
            "reduce_scatter_tensor": lambda g: _scattered(op, dtype, g),
            "reduce": lambda g: _reduced(op, mine.clone(), g),
            "all_reduce_coalesced": lambda g: _coalesced(op, mine, g),
        }  # fmt: skip
        for name, call in calls.items():
            try:
                got = call(group)
            except (RuntimeError, ValueError) as e:
                if group is gloo:
                    continue  # Gloo does not reduce so
                raise AssertionError(f"{name}: {e}") from e
            if got is not None and not torch.equal(got, exact):
                problems.append(f"{who} {name}: {got.tolist()} is not {exact.tolist()}")
    agree(WORLD, problems)


def _scattered(op, dtype, group):
    out = torch.empty(13, dtype=dtype)
    dist.reduce_scatter_tensor(out, torch.cat([_input(RANK, dtype)] * SIZE), op, group=group)
    return out


def _reduced(op, x, group):
    dist.reduce(x, 0, op, group=group)
    return x if RANK == 0 else None


def _coalesced(op, x, group):
    pair = [x.clone(), x.clone().reshape(13, 1)]
    dist.all_reduce_coalesced(pair, op, group=group)
    if not torch.equal(pair[0], pair[1].reshape(-1)):
        return pair[1].reshape(-1)  # differs: reported as not exact
    return pair[0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_copying_collectives_move_every_dtype_as_gloo_does(gloo, dtype):
    problems = []
    x = _input(RANK, dtype)
    every = torch.stack([_input(r, dtype) for r in range(SIZE)])
    want = {
        "all_gather_into_tensor": every.reshape(-1),
        "all_gather": every.reshape(-1),
        "broadcast": every[SIZE - 1],
        "all_to_all_single": torch.stack([_input(k + RANK, dtype) for k in range(SIZE)]),
    }
    for group in (None, gloo):
        who = "Gloo's" if group is gloo else "ours"
        for name, expected in want.items():
            try:
                got = _copied(name, x, group)
            except (RuntimeError, ValueError) as e:
                if group is gloo:
                    continue  # Gloo does not move this dtype so
                raise AssertionError(f"{name}: {e}") from e
            if not torch.equal(got, expected):
                problems.append(f"{who} {name}: {got.tolist()} is not {expected.tolist()}")
    agree(WORLD, problems)


def _copied(name, x, group):
    """Collective ``name`` of ``x`` (this rank's 13 elements) on ``group``."""
    if name == "all_gather_into_tensor":
        out = torch.empty(SIZE * 13, dtype=x.dtype)
        dist.all_gather_into_tensor(out, x, group=group)
        return out
    if name == "all_gather":
        parts = [torch.empty(13, dtype=x.dtype) for _ in range(SIZE)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts)
    if name == "broadcast":
        y = x.clone() if RANK == SIZE - 1 else torch.zeros_like(x)
        dist.broadcast(y, SIZE - 1, group=group)
        return y
    # all_to_all_single: row k to rank k, so rank k's row RANK is _input(k + RANK)
    out = torch.empty(SIZE, 13, dtype=x.dtype)
    inp = torch.stack([_input(RANK + k, x.dtype) for k in range(SIZE)])
    dist.all_to_all_single(out, inp, group=group)
    return out


def test_the_other_collectives_are_exact_and_gloos(gloo):
    problems = []

    def same(name, a, b):
        if not torch.equal(a, b):
            problems.append(f"{name}: {a.tolist()} against {b.tolist()}")

    x = torch.arange(6, dtype=torch.float32) + RANK
    every = torch.stack([torch.arange(6, dtype=torch.float32) + r for r in range(SIZE)])
    for group in (None, gloo):  # ours, then Gloo's: the same answer
        tag = "gloo " if group is gloo else ""
        out = torch.empty(6 * SIZE)
        dist.all_gather_into_tensor(out, x, group=group)
        same(tag + "all_gather_into_tensor", out, every.reshape(-1))
        parts = [torch.empty(6) for _ in range(SIZE)]
        dist.all_gather(parts, x, group=group)
        same(tag + "all_gather", torch.stack(parts), every)
        inp = torch.arange(4 * SIZE, dtype=torch.float32) * (RANK + 1)
        mine = torch.empty(4)
        dist.reduce_scatter_tensor(mine, inp, group=group)
        whole = torch.arange(4 * SIZE, dtype=torch.float32) * (SIZE * (SIZE + 1) // 2)
        same(tag + "reduce_scatter_tensor", mine, whole[4 * RANK : 4 * RANK + 4])
        y = x.clone() if RANK == SIZE - 1 else torch.zeros(6)
        dist.broadcast(y, SIZE - 1, group=group)
        same(tag + "broadcast", y, every[SIZE - 1])
        r = x.clone()
        dist.reduce(r, 0, group=group)
        if RANK == 0:
            same(tag + "reduce", r, every.sum(0))
        a = torch.arange(2 * SIZE, dtype=torch.float32) + 100 * RANK
        b = torch.empty(2 * SIZE)
        dist.all_to_all_single(b, a, group=group)
        want = torch.cat([torch.arange(2 * RANK, 2 * RANK + 2, dtype=torch.float32) + 100 * k
                          for k in range(SIZE)])  # fmt: skip
        same(tag + "all_to_all_single", b, want)
        dist.barrier(group=group)
    gathered = [torch.empty(6) for _ in range(SIZE)] if RANK == 0 else None
    dist.gather(x, gathered, 0)
    if RANK == 0:
        same("gather", torch.stack(gathered), every)
    got = torch.empty(3)
    dist.scatter(got, [torch.full((3,), float(k)) for k in range(SIZE)] if RANK == 0 else None, 0)
    same("scatter", got, torch.full((3,), float(RANK)))
    outs = [torch.empty(RANK + 1) for _ in range(SIZE)]  # uneven: rank k gets k + 1 of each
    dist.all_to_all(outs, [torch.full((k + 1,), float(RANK)) for k in range(SIZE)])
    same("all_to_all", torch.cat(outs), torch.cat([torch.full((RANK + 1,), float(k))
                                                  for k in range(SIZE)]))  # fmt: skip
    pair = [x.clone(), 2 * x.clone().reshape(2, 3)]
    dist.all_reduce_coalesced(pair)
    same("all_reduce_coalesced", pair[0], every.sum(0))
    same("all_reduce_coalesced, second", pair[1], 2 * every.sum(0).reshape(2, 3))
    grid = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    dist.all_reduce(grid)
    same("not contiguous", grid, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * SIZE)
    if SIZE > 1:
        if RANK == 0:
            dist.send(torch.arange(5.0), 1)
        elif RANK == 1:
            got = torch.empty(5)
            dist.recv(got, 0)
            same("send/recv", got, torch.arange(5.0))
    agree(WORLD, problems)


def test_async_work_waits_and_its_future_holds_the_result(gloo):
    x = torch.ones(5) * (RANK + 1)
    work = dist.all_reduce(x, async_op=True)
    assert work.wait()
    assert work.is_completed()
    (result,) = work.get_future().wait()
    assert torch.equal(result, torch.full((5,), float(SIZE * (SIZE + 1) // 2)))
    assert torch.equal(x, result)


def test_a_new_group_runs_on_its_own_ranks(gloo):
    members = list(range(SIZE - 1, -1, -2))  # every other rank from the last, in that order
    sub = dist.new_group(members)
    if RANK in members:
        x = torch.ones(3) * (RANK + 1)
        dist.all_reduce(x, group=sub)
        assert torch.equal(x, torch.ones(3) * sum(m + 1 for m in members))
        y = torch.full((2,), float(RANK))
        dist.broadcast(y, members[0], group=sub)  # the global rank of the group's first
        assert torch.equal(y, torch.full((2,), float(members[0])))
        dist.destroy_process_group(sub)


def test_torch_ranks_that_are_not_mpis_are_named_on_every_rank(gloo):
    if SIZE == 1:
        pytest.skip("one rank: its ranks agree")
    shifted = types.SimpleNamespace(group_rank=(RANK + 1) % SIZE, group_size=SIZE,
                                    global_ranks_in_group=list(range(SIZE)), group_id="0",
                                    timeout=dist.default_pg_timeout)  # fmt: skip
    with pytest.raises(RuntimeError, match=r"needs torch's ranks to be MPI's: MPI rank 0 is "
                                           r"torch rank 1"):  # fmt: skip
        _torch_group._create(shifted, None)


@pytest.mark.parametrize("hook", [None, "fp16_compress_hook", "bf16_compress_hook"])
def test_ddp_on_the_backend_reaches_gloos_weights(gloo, hook):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    fn = None if hook is None else getattr(default_hooks, hook)
    if hook == "bf16_compress_hook":  # torch's CPU wheel refuses it by name: the same hook

        def fn(state, bucket):
            return default_hooks.bf16_compress_hook(state, bucket)

    ours, theirs = train_ddp(None, fn), train_ddp(gloo, fn, gloo)
    problems = differences(ours, theirs)
    if hook == "bf16_compress_hook":
        # ringmpi's bfloat16 sum is the exact sum rounded once, Gloo's rounds at each add:
        # from 3 ranks they differ, by less than twice what the compression moves Gloo's
        # weights from the float32 run's
        full = train_ddp(None)
        problems = [f"parameter {k}: {float((a - b).abs().max()):.2e} from Gloo's, which is "
                    f"{float((b - f).abs().max()):.2e} from float32's"
                    for k, (a, b, f) in enumerate(zip(ours, theirs, full, strict=True))
                    if (a - b).abs().max() > 2 * (b - f).abs().max()]  # fmt: skip
    agree(WORLD, problems)


def test_all_reduces_on_the_progress_thread_are_exact_when_waited_for(gloo):
    problems = []
    with ringmpi.configured(progress="thread"):  # as where a rank has a spare core
        for op, dtype in [(R.SUM, torch.float32), (R.PRODUCT, torch.bfloat16),
                          (R.MAX, torch.int64), (R.AVG, torch.float64)]:  # fmt: skip
            x = _input(RANK, dtype)
            work = dist.all_reduce(x, op, async_op=True)
            work.wait()
            if not torch.equal(x, _exact(op, dtype)):
                problems.append(f"{op} {dtype}: {x.tolist()}")
        r = _input(RANK, torch.float32)
        dist.reduce(r, 0)
        if RANK == 0 and not torch.equal(r, _exact(R.SUM, torch.float32)):
            problems.append(f"reduce: {r.tolist()}")
    agree(WORLD, problems)


def test_a_rank_that_never_comes_is_named_after_the_groups_timeout(gloo):
    if SIZE == 1:
        pytest.skip("one rank: nobody to wait for")
    sub = dist.new_group(list(range(SIZE)), timeout=datetime.timedelta(seconds=1))
    dist.all_reduce(torch.ones(4), group=sub)  # every rank: the loops loaded
    try:
        if RANK == 0:  # the others never call
            with pytest.raises(
                ringmpi.RingMPIError,
                match=r"rank 0: all_reduce: waited 1 s for "
                + ("ranks " if SIZE > 2 else "rank ")
                + ", ".join(map(str, range(1, SIZE)))
                + " without progress",
            ):
                dist.all_reduce(torch.ones(4), group=sub)
            with pytest.raises(ringmpi.RingMPIError, match="waited 1 s"):  # the group is broken
                dist.broadcast(torch.ones(4), 0, group=sub)
    finally:
        WORLD.Barrier()


def _train_fsdp2(mesh, steps: int = 4) -> list:
    from torch.distributed.fsdp import fully_shard

    net = mlp()
    for layer in (net[0], net[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    fit(net, steps)
    # each rank's shards (the same on both meshes: the same ranks in the same order)
    return [p.to_local().detach().clone() for p in net.parameters()]


def test_fsdp2_on_the_backend_reaches_gloos_weights(gloo):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    ours = _train_fsdp2(init_device_mesh("cpu", (SIZE,)))  # the default group: ringmpi
    theirs = _train_fsdp2(DeviceMesh.from_group(gloo, "cpu"))
    problems = differences(ours, theirs)
    agree(WORLD, problems)


def test_a_tensors_view_is_kept_while_it_lives_and_dropped_with_it(gloo):
    group = dist.group.WORLD  # ours: the repeat path knows a call by its array object
    t = torch.ones(8)
    view = group._view(t)
    assert group._view(t) is view and view.size == 8
    t.resize_(1 << 20)  # other memory: another view
    assert group._view(t) is not view and group._view(t).size == 1 << 20
    key = id(t)
    del t, view
    gc.collect()
    assert key not in group._views


def test_fsdp1_on_the_backend_reaches_gloos_weights(gloo):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: N817

    def train(group) -> list:
        net = FSDP(mlp(), process_group=group, device_id=torch.device("cpu"))
        fit(net, 4)
        with FSDP.summon_full_params(net):
            return [p.detach().clone() for p in net.parameters()]

    problems = differences(train(None), train(gloo))  # None: the default group, ringmpi
    agree(WORLD, problems)


def test_fsdp_with_tensor_parallel_on_a_2d_mesh_reaches_gloos_weights(gloo):
    if SIZE % 2:
        pytest.skip("a (N/2, 2) mesh needs an even N")
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    layout = torch.arange(SIZE).view(SIZE // 2, 2)  # rows: tensor parallel; columns: data
    rows = [dist.new_group(row.tolist(), backend="gloo") for row in layout]
    cols = [dist.new_group(col.tolist(), backend="gloo") for col in layout.t()]
    names = ("dp", "tp")
    theirs_mesh = DeviceMesh.from_group([cols[RANK % 2], rows[RANK // 2]], "cpu", mesh=layout,
                                        mesh_dim_names=names)  # fmt: skip

    def train(mesh) -> list:
        net = mlp()
        parallelize_module(net, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(net, mesh=mesh["dp"])
        fit(net, 4, batches=RANK // 2)  # a tensor-parallel pair takes the same batches
        return [p.full_tensor().detach().clone() for p in net.parameters()]

    ours = train(init_device_mesh("cpu", (SIZE // 2, 2), mesh_dim_names=names))
    problems = differences(ours, train(theirs_mesh))
    agree(WORLD, problems)


def test_functional_collectives_and_dtensors_are_exact_and_gloos(gloo):
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    problems = []
    x = torch.arange(4 * SIZE, dtype=torch.float32) + RANK
    every = torch.stack([torch.arange(4 * SIZE, dtype=torch.float32) + r for r in range(SIZE)])
    full = torch.arange(4.0 * SIZE * 3).reshape(2 * SIZE, 6)
    answers = []
    for group in (dist.group.WORLD, gloo):
        mesh = DeviceMesh.from_group(group, "cpu")
        d = distribute_tensor(full, mesh, [Shard(0)])
        answers.append({
            "all_reduce": fc.all_reduce(x, "sum", group).wait(),
            "all_gather_tensor": fc.all_gather_tensor(x, 0, group).wait(),
            "reduce_scatter_tensor": fc.reduce_scatter_tensor(x, "sum", 0, group).wait(),
            "broadcast": fc.broadcast(x, SIZE - 1, group).wait(),
            "full_tensor": d.full_tensor(),
            "redistribute": d.redistribute(mesh, [Replicate()]).to_local(),
            "sum": (d * 2).sum().full_tensor(),
        })  # fmt: skip
    exact = {"all_reduce": every.sum(0), "all_gather_tensor": every.reshape(-1),
             "reduce_scatter_tensor": every.sum(0)[4 * RANK : 4 * RANK + 4],
             "broadcast": every[SIZE - 1], "full_tensor": full, "redistribute": full,
             "sum": 2 * full.sum()}  # fmt: skip
    for name, want in exact.items():
        for who, answer in zip(("ours", "Gloo's"), answers, strict=True):
            got = answer[name]
            if not torch.equal(got, want):
                problems.append(f"{who} {name}: {got.tolist()} is not {want.tolist()}")
    agree(WORLD, problems)


CALLS = {
    "all_reduce of another size": lambda: dist.all_reduce(torch.ones(8 + RANK)),
    "all_reduce of another dtype": lambda: dist.all_reduce(torch.ones(8, dtype=DTYPES[RANK % 2])),
    "broadcast of another size": lambda: dist.broadcast(torch.ones(8 + RANK), 0),
    "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
        torch.empty(SIZE * (4 + RANK)), torch.ones(4 + RANK)),
    "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
        torch.empty(4 + RANK), torch.ones(SIZE * (4 + RANK))),
    "another root": lambda: dist.broadcast(torch.ones(8), RANK % 2),
}  # fmt: skip


@pytest.mark.parametrize("call", CALLS)
def test_tensors_that_disagree_raise_on_every_rank_before_any_data_moves(gloo, call):
    if SIZE == 1:
        pytest.skip("one rank: nothing to disagree with")
    with pytest.raises(ValueError, match=r"the group's ranks disagree on \w+: ranks? 0(, \d)*: "
                                         r".*; ranks? 1(, \d)*: "):  # fmt: skip
        CALLS[call]()
    x = torch.ones(3)  # the group goes on
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((3,), float(SIZE)))


def test_a_message_of_another_size_raises_on_its_receiver(gloo):
    if SIZE == 1:
        pytest.skip("one rank: no peer")
    if RANK == 0:
        dist.send(torch.arange(4.0), 1)
    elif RANK == 1:
        with pytest.raises(ValueError, match=r"rank 1 receives 5 torch.float32 elements \(20 "
                                             r"bytes\) from rank 0, which sent 16 bytes"):  # fmt: skip
            dist.recv(torch.empty(5), 0)
    WORLD.Barrier()


def test_a_destroyed_group_frees_its_communicators(gloo):
    for _ in range(3):
        sub = dist.new_group(list(range(SIZE)))
        x = torch.ones(1 << 16)
        dist.all_reduce(x, group=sub)
        assert torch.equal(x, torch.full((1 << 16,), float(SIZE)))
        mine = sub  # the group object is ours: torch hands it back
        dist.destroy_process_group(sub)
        assert mine.comm == MPI.COMM_NULL and mine._check_comm == MPI.COMM_NULL
