"""The MPI libraries' shared-memory files in ``/dev/shm``: their names, and the
release of this process's own when it aborts the job.

A library removes its segments when the job ends through ``MPI_Finalize``.
``MPI_Abort`` and a signal skip that: the files stay, holding memory, until
someone removes them (``python -m ringmpi shm --remove``). A rank that aborts
unlinks the ones it maps first; the mappings of the node's other ranks stay
valid until they exit, and the memory goes back when the last one does.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["PREFIXES", "SHM", "mapped", "release_mapped"]

SHM = "/dev/shm"
# How the MPI libraries name their segments: MPICH's, Open MPI's (its sm and
# older vader transports) and Intel MPI's.
PREFIXES = ("mpich_shm_", "sm_segment.", "vader_segment.", "shm-col-space-", "Intel_MPI_")


def mapped(maps: str = "/proc/self/maps", shm: str = SHM, unlinked: bool = True) -> set[str]:
    """The names of the files in ``shm`` that a process maps, read from its ``maps``
    file (none where it cannot be read); ``unlinked``: those already removed too."""
    prefix = shm.rstrip("/") + "/"
    names = set()
    with contextlib.suppress(OSError), open(maps) as fh:
        for line in fh:
            at = line.find(prefix)
            if at < 0:
                continue
            name = line[at + len(prefix) :].rstrip("\n")
            if name.endswith(" (deleted)") and not unlinked:
                continue
            names.add(name.removesuffix(" (deleted)"))
    return names


def release_mapped() -> list[str]:
    """Unlink the MPI segments this process maps (for an abort: the job ends); their
    names. Other files in ``/dev/shm``, a program's own among them, stay."""
    gone = []
    for name in sorted(mapped(unlinked=False)):
        if name.startswith(PREFIXES):
            with contextlib.suppress(OSError):
                os.unlink(f"{SHM}/{name}")
                gone.append(name)
    return gone
