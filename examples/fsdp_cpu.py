"""Sharded data-parallel training on CPUs: FSDP2 and FSDP1 on Gloo and on the ringmpi backend.

    mpirun -n 2 python examples/fsdp_cpu.py [--width 1024] [--steps 30]

torch.distributed's default group is Gloo's, set up from mpirun's ranks
(``ringmpi.torch.init_process_group``); a second group of the same ranks is on
the ``ringmpi`` backend (``new_group(backend="ringmpi")``). Four copies of one
MLP (three linear layers of ``width``, each layer its own FSDP unit), from the
same weights, train on the same batches: FSDP2 (``fully_shard``) and FSDP1
(``FullyShardedDataParallel``), each on both groups. Every step all-gathers
each layer's weights (forward and backward) and reduce-scatters its gradients.
Their steps take turns; a step's time is the slowest rank's. Prints the median
step time of each (after the first 3), ringmpi's over Gloo's, and the largest
difference between each ringmpi model's final weights and the same trainer's
on Gloo.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from ddp_cpu import arguments, model, take_turns
from mpi4py import MPI
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

import ringmpi.torch


def fsdp2(width: int, group: dist.ProcessGroup) -> nn.Module:
    net = model(width)
    mesh = DeviceMesh.from_group(group, "cpu")
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def fsdp1(width: int, group: dist.ProcessGroup) -> nn.Module:
    net = model(width)
    for i, layer in enumerate(net):
        if isinstance(layer, nn.Linear):
            net[i] = FullyShardedDataParallel(layer, process_group=group,
                                              device_id=torch.device("cpu"))  # fmt: skip
    return FullyShardedDataParallel(net, process_group=group, device_id=torch.device("cpu"))


def weights(name: str, net: nn.Module) -> list[torch.Tensor]:
    """The whole model's weights on every rank."""
    if name.startswith("fsdp2"):
        return [p.full_tensor().detach().clone() for p in net.parameters()]
    with FullyShardedDataParallel.summon_full_params(net):
        return [p.detach().clone() for p in net.parameters()]


def main() -> None:
    args = arguments(__doc__)
    comm = MPI.COMM_WORLD
    ringmpi.torch.init_process_group(comm)  # the default group: Gloo
    groups = {"gloo": dist.group.WORLD, "ringmpi": dist.new_group(backend="ringmpi")}
    runs = {f"{kind} {g}": make(args.width, group)
            for kind, make in (("fsdp2", fsdp2), ("fsdp1", fsdp1))
            for g, group in groups.items()}  # fmt: skip
    times = take_turns(runs, args.width, args.steps, comm)
    final = {k: weights(k, m) for k, m in runs.items()}
    params = sum(p.numel() for p in final["fsdp2 gloo"])
    if comm.rank == 0:
        ms = {k: float(np.median(v[3:])) * 1e3 for k, v in times.items()}
        print(f"{comm.size} ranks, {params:,} parameters ({4 * params / 2**20:.1f} MiB of "
              f"gradients), {args.steps} steps of 64 samples")  # fmt: skip
        for kind in ("fsdp2", "fsdp1"):
            ours, theirs = f"{kind} ringmpi", f"{kind} gloo"
            diff = max(float((a - b).abs().max())
                       for a, b in zip(final[ours], final[theirs], strict=True))  # fmt: skip
            ratio = ms[ours] / ms[theirs]
            print(f"{kind} step ms: gloo {ms[theirs]:.2f}, ringmpi backend {ms[ours]:.2f} "
                  f"({ratio:.2f}x); largest weight difference {diff:.3g}")  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
