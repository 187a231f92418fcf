"""The machine the tuner's choices were measured on: its CPU model, last-level
cache and cores, as the tuner's file names it (a host that changed is tuned
again), the cache that the benchmarks' ``--off-cache`` times beyond, and the cores
a rank may use for its own threads."""

from __future__ import annotations

import ctypes
import functools
import os
import platform

from . import _settings

__all__ = ["affinity", "busy", "cores", "cores_held", "cores_share", "cpu_model", "describe",
           "last_level_cache", "runnable", "threads"]  # fmt: skip


def cpu_model() -> str:
    """The CPU's model name as Linux gives it (``/proc/cpuinfo``), else the platform's."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Processor", "cpu model") and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@functools.cache
def cores() -> int:
    """The machine's cores online, read once (each new communicator asks)."""
    return os.cpu_count() or 1


@functools.cache
def describe() -> str:
    """This host as the tuner's file names it: CPU model, last-level cache, cores online."""
    cache = last_level_cache()
    said = f"{cache >> 20} MiB" if cache >= 1 << 20 else f"{cache >> 10} KiB" if cache else "no"
    return f"{cpu_model()}, {said} last-level cache, {cores()} cores"


def cores_share(masks: list[frozenset[int]], mine: int) -> int:
    """Rank ``mine``'s share of the cores its affinity mask holds, of a node whose ranks
    have ``masks``: each core counts 1/k toward each of the k ranks whose masks hold
    it (ranks bound to their own cores get them all; unbound ranks split the node),
    rounded down, at least 1."""
    held: dict[int, int] = {}
    for mask in masks:
        for cpu in mask:
            held[cpu] = held.get(cpu, 0) + 1
    return max(1, int(sum(1.0 / held[cpu] for cpu in masks[mine]) + 1e-9))


def cores_held(masks: list[frozenset[int]]) -> int:
    """The cores that a node's ranks with affinity ``masks`` may run on between them:
    fewer than its ranks, and the node is oversubscribed."""
    return len(frozenset().union(*masks))


def runnable() -> int:
    """Threads runnable on this machine at this moment, this one among them (Linux's
    ``/proc/loadavg``); 0 where the system does not say."""
    try:
        with open("/proc/loadavg") as fh:
            return int(fh.read().split()[3].partition("/")[0])
    except (OSError, ValueError, IndexError):
        return 0


def busy(seen: list[int], node_ranks: int) -> bool:
    """Whether a node was busy with others' work where its ranks saw ``seen``
    (:func:`runnable`, sampled): by the median sample, at least two threads more
    runnable than the node has cores or its own ranks take (one more comes and goes:
    a launcher's, the kernel's)."""
    if not seen:
        return False
    ordered = sorted(seen)
    return ordered[len(ordered) // 2] > max(cores(), node_ranks) + 1


def affinity() -> frozenset[int]:
    """The CPUs this process may run on (all online where the system does not say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(cores()))


def threads(setting: int | None, share: int) -> int:
    """The threads a rank's node reductions use: the ``threads`` setting, or (None,
    auto) its share of the cores, at most Numba's thread pool (``NUMBA_NUM_THREADS``)."""
    return max(1, min(setting or share, _pool()))


def _pool() -> int:
    """Threads in Numba's pool (``NUMBA_NUM_THREADS``; its default: the cores).
    Numba is imported here, not with the module: ``ringmpi.tools --help`` reads the
    cache size from this module and starts no compiler."""
    import numba  # noqa: PLC0415

    from . import _numba_cache  # noqa: F401, PLC0415 -- Numba's cache lock

    return int(getattr(numba.config, "NUMBA_NUM_THREADS"))  # noqa: B009 -- set at import


def _check_threads(value: int, says: str) -> None:
    pool = _pool()
    if value > pool:
        raise ValueError(
            f"{says}={value} is more than Numba's thread pool holds "
            f"(NUMBA_NUM_THREADS={pool}): set NUMBA_NUM_THREADS to {value} or more"
        )


_settings.check_with("threads", _check_threads)


def last_level_cache() -> int:
    """The node's last-level cache in bytes, 0 where the system does not say: the
    largest of what Linux lists for the first CPU's last cache level, once for each
    group of CPUs that shares one (the sockets), and what glibc reads from the CPU (a
    virtual machine may list less than its host's caches hold)."""
    listed, level = 0, 0
    for index in range(16):  # cpu0's caches, index0 (level 1) up: a few small files
        folder = f"/sys/devices/system/cpu/cpu0/cache/index{index}"
        try:
            with open(f"{folder}/level") as f_level, open(f"{folder}/type") as f_type:
                at, kind = int(f_level.read()), f_type.read().strip()
            with open(f"{folder}/size") as f_size, open(f"{folder}/shared_cpu_list") as f_cpus:
                size, sharing = _bytes(f_size.read()), _count(f_cpus.read())
        except FileNotFoundError:
            break
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and at >= level:
            level, listed = at, size * max(1, cores() // max(1, sharing))
    return max(listed, _from_cpu())


def _count(cpus: str) -> int:
    """How many CPUs a Linux CPU list names (``0-63,128-191``)."""
    total = 0
    for part in cpus.strip().split(","):
        first, _, last = part.partition("-")
        total += int(last or first) - int(first) + 1
    return total


# glibc's sysconf names for the level 4, 3 and 2 caches' sizes (<bits/confname.h>:
# _SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE), which it reads
# from the CPU; Python's os.sysconf does not know them.
_SC_CACHE_SIZES = (197, 194, 191)


def _from_cpu() -> int:
    """The largest cache glibc reads from the CPU; 0 elsewhere."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return 0
        sysconf = ctypes.CDLL(None).sysconf
    except (AttributeError, OSError, ValueError):
        return 0
    sysconf.restype, sysconf.argtypes = ctypes.c_long, [ctypes.c_int]
    return max(0, *(sysconf(name) for name in _SC_CACHE_SIZES))


def _bytes(text: str) -> int:
    """Bytes from a cache size as Linux lists it: ``32K``, ``8192K``, ``1M``."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    return int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text)
