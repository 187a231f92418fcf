"""What a rank may still allocate, and what a benchmark's sizes will ask of it.

The least of three bounds, each where the system sets one: the address space
``ulimit -v`` leaves this process, the memory its control group (a Slurm job's,
a container's) leaves, and the node's available memory shared among the
node's ranks. A tool checks its largest size against it before the sweep, so
that a size that cannot fit is a usage error naming the flag, not a
``MemoryError`` and an abort in the middle of the run.
"""

from __future__ import annotations

import os
import resource

__all__ = ["available", "shortfall"]

# The kernel's word for no limit in cgroup v2's memory.max.
_NO_LIMIT = "max"


def _address_space() -> int | None:
    """Bytes of address space ``ulimit -v`` leaves this process, or None."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm") as fh:
            used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None
    return max(0, soft - used)


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _cgroup() -> int | None:
    """Bytes this process's control group (cgroup v2) may still charge, or None."""
    text = _read("/proc/self/cgroup")
    if not text:
        return None
    for line in text.splitlines():
        hierarchy, _, path = line.partition("::")  # v2's one line: "0::/path"
        if hierarchy == "0" and path:
            folder = "/sys/fs/cgroup" + path.rstrip("/")
            limit, usage = _read(f"{folder}/memory.max"), _read(f"{folder}/memory.current")
            if limit is None or usage is None or limit == _NO_LIMIT:
                return None
            return max(0, int(limit) - int(usage))
    return None


def _node(node_ranks: int) -> int | None:
    """This rank's share of the node's available memory (MemAvailable), or None."""
    text = _read("/proc/meminfo")
    for line in (text or "").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024 // max(1, node_ranks)
    return None


def available(node_ranks: int) -> tuple[int, str] | None:
    """(bytes, what bounds them): the most this rank can allocate more, by the
    tightest of the bounds the system sets; None where it sets none."""
    bounds = [
        (_address_space(), "ulimit -v leaves this process"),
        (_cgroup(), "the job's memory limit (cgroup) leaves"),
        (_node(node_ranks), f"each of the node's {node_ranks} ranks has of its available memory"),
    ]
    found = [(b, why) for b, why in bounds if b is not None]
    return min(found) if found else None


def shortfall(need: int, node_ranks: int) -> str | None:
    """Why ``need`` more bytes on every rank of a node of ``node_ranks`` will not fit,
    or None where they fit (or nothing says how much does)."""
    have = available(node_ranks)
    if have is None or need <= have[0]:
        return None
    return f"needs about {_gib(need)} a rank, and {have[1]} {_gib(have[0])}"


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB"
