"""Stale shared-memory segments: ``python -m ringmpi shm``.

An MPI library keeps a job's shared memory (its intra-node channels, the
shared windows ringmpi reduces through) as files in ``/dev/shm`` and removes
them when the job ends. A rank killed by a signal, a job its launcher tears
down, or one ended by ``MPI_Abort`` leaves them behind: MPICH's
``mpich_shm_*``, Open MPI's ``sm_segment.*`` and ``vader_segment.*``, Intel
MPI's ``shm-col-space-*`` (:data:`ringmpi._segments.PREFIXES`). A rank that
aborts through ``ringmpi.abort_on_error`` removes those it maps itself. They
hold memory until removed, and a stale one can make a later MPICH job hang in MPI_Init.

A segment is *stale* when its name is an MPI library's (:data:`PREFIXES`), it
is owned by this user and no live process maps it or holds it open
(``/proc/*/maps`` and ``/proc/*/fd``). Removing stale ones cannot touch a
running job, nor another program's files.

    python -m ringmpi shm                 # list the stale segments
    python -m ringmpi shm --remove        # remove them
    python -m ringmpi shm --snapshot F    # write what /dev/shm holds now to F
    python -m ringmpi shm --since F       # exit 1 if a stale segment appeared since F
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ringmpi import _segments

from . import command_parser

__all__ = ["in_use", "main", "names", "remove_new", "stale", "swept"]

SHM = Path(_segments.SHM)
PREFIXES = _segments.PREFIXES


def names(shm: Path = SHM) -> set[str]:
    """The MPI segments in ``shm`` now (none where it does not exist)."""
    try:
        return {p.name for p in shm.iterdir() if p.name.startswith(PREFIXES) and p.is_file()}
    except OSError:
        return set()


def in_use(shm: Path = SHM, but: int | None = None) -> set[str]:
    """The names of the files in ``shm`` that a live process maps or holds open
    (of the processes this user may inspect: all of them as root), process ``but``
    (a PID) aside."""
    prefix = str(shm) + "/"
    used: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == but:
            continue
        used |= _segments.mapped(str(proc / "maps"), str(shm))
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith(prefix):
                        used.add(target[len(prefix) :].removesuffix(" (deleted)"))
    return used


def stale(shm: Path = SHM, among: set[str] | None = None, but: int | None = None) -> list[str]:
    """The segments in ``shm`` (or those of ``among``) owned by this user that no
    live process uses (process ``but`` aside), sorted."""
    uid = os.getuid()
    candidates = names(shm) if among is None else among & names(shm)
    if not candidates:
        return []
    owned = set()
    for name in candidates:
        with contextlib.suppress(OSError):
            if (shm / name).stat().st_uid == uid:
                owned.add(name)
    return sorted(owned - in_use(shm, but))


def remove_new(before: set[str], shm: Path = SHM, but: int | None = None) -> list[str]:
    """Remove the stale segments that appeared since ``before`` (a :func:`names`
    snapshot; process ``but`` aside); return their names."""
    gone = []
    for name in stale(shm, names(shm) - before, but):
        with contextlib.suppress(FileNotFoundError):
            (shm / name).unlink()
            gone.append(name)
    return gone


@contextlib.contextmanager
def swept(shm: Path = SHM, linger: float = 3.0, own: bool = False) -> Iterator[list[str]]:
    """Around a job that may be killed: afterwards, remove the stale segments it
    left (those that appeared in the block and no process uses), waiting up to
    ``linger`` seconds for ranks that outlive their launcher to let go. The
    list it yields holds their names once the block ends.

    ``own``: this process's own use does not count. For the end of a process
    that started MPI without a launcher (a singleton), just before MPI_Finalize:
    Open MPI 5 leaves such a process's ``sm_segment.*`` behind, as it leaves
    the removal to a launcher's PMIx server that a singleton does not have."""
    but = os.getpid() if own else None
    before = names(shm)
    gone: list[str] = []
    try:
        yield gone
    finally:
        end = time.monotonic() + linger
        while True:
            gone.extend(remove_new(before, shm, but))
            if not names(shm) - before or time.monotonic() >= end:
                break
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = command_parser("shm", __doc__)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--remove", action="store_true", help="remove the stale segments")
    what.add_argument("--snapshot", metavar="FILE", type=Path,
                      help="write the names /dev/shm holds now to FILE (JSON)")  # fmt: skip
    what.add_argument("--since", metavar="FILE", type=Path,
                      help="exit 1 if a stale segment appeared since --snapshot FILE")  # fmt: skip
    parser.add_argument("--dir", type=Path, default=SHM, help="the directory")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        parser.error(f"--dir {args.dir}: no such directory")
    if args.snapshot:
        try:
            args.snapshot.write_text(json.dumps(sorted(names(args.dir))))
        except OSError as exc:
            parser.error(f"--snapshot: {exc}")
        return 0
    if args.since:
        try:
            before = set(json.loads(args.since.read_text()))
        except (OSError, ValueError) as exc:
            parser.error(f"--since {args.since}: not a --snapshot file ({exc})")
        left = stale(args.dir, names(args.dir) - before)
        if left:
            print(f"{len(left)} stale segment(s) appeared in {args.dir}: {', '.join(left)}")
            return 1
        print(f"{args.dir}: no stale segment appeared")
        return 0
    found = stale(args.dir)
    for name in found:
        if args.remove:
            with contextlib.suppress(FileNotFoundError):
                (args.dir / name).unlink()
        print(f"{'removed' if args.remove else 'stale'} {args.dir / name}")
    if not found:
        print(f"{args.dir}: no stale segment")
    elif not args.remove:
        print("# no live process uses these: a job killed by a signal or ended by MPI_Abort "
              "(an uncaught error under mpi4py's or ringmpi's abort-on-error) left them, as "
              "both skip the library's own removal; --remove removes them")  # fmt: skip
    return 0


if __name__ == "__main__":  # a module, not a program: say where the tool is
    from ringmpi._program import not_a_program

    not_a_program("shm")
