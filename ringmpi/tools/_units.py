"""Sizes in bytes as the tools read and print them: 8, 64K, 1M, 16M; the sweep of
sizes that ``-b``, ``-e`` and ``-f`` give; how many buffers ``--off-cache``
rotates over to time calls beyond the node's last-level cache; and the order in
which interleaved rows take their turns."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from .._host import last_level_cache

__all__ = ["SYSTEM", "buffer_sets", "format_size", "interleaved", "off_cache_bytes",
           "parse_count", "parse_size", "sweep", "whole"]  # fmt: skip

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``64K``, ``16M``, ``1GiB`` (binary units); an argparse type."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 8, 64K, 16M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_count(text: str) -> int:
    """Elements from ``1000``, ``1K``, ``4M`` (binary: 1K is 1024); an argparse type."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 1000, 1K, 4M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def format_size(nbytes: int, long: bool = False) -> str:
    """``nbytes`` in the largest binary unit that divides it: ``64K``, or with ``long``
    ``64 KiB`` (and ``8 B`` where no unit divides it)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}iB" if long else f"{nbytes >> shift}{unit}"
    return f"{int(nbytes)} B" if long else str(nbytes)


def whole(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` (argparse names the flag)."""

    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if number < least:
            raise argparse.ArgumentTypeError(f"must be {least} or more, not {number}")
        return number

    parse.__name__ = "whole number"  # argparse's name for the type in its messages
    return parse


def sweep(first: int, last: int, factor: int) -> list[int]:
    """The sizes of ``-b first -e last -f factor``: ``first``, times ``factor`` while
    it is at most ``last``. ValueError naming the flags where that is no size at all,
    or a sweep that would never end."""
    if first < 1:
        raise ValueError(f"-b/--minbytes must be 1 or more bytes, not {first}")
    if last < first:
        raise ValueError(
            f"-b/--minbytes {format_size(first)} is larger than -e/--maxbytes "
            f"{format_size(last)}: no size to run"
        )
    if factor < 2 and last > first:
        raise ValueError(
            f"-f/--stepfactor {factor} never gets from -b/--minbytes to -e/--maxbytes: "
            "give 2 or more (or one size, -b equal to -e)"
        )
    sizes = [first]
    while sizes[-1] * factor <= last and factor > 1:
        sizes.append(sizes[-1] * factor)
    return sizes


# --off-cache with no size: the cache as the system says it.
SYSTEM = -1


def off_cache_bytes(given: int | None) -> int:
    """The bytes of cache ``--off-cache`` times calls beyond: ``given`` (a size, SYSTEM
    for the system's last-level cache, None for no --off-cache: 0); ValueError where
    that is no cache."""
    if given is None:
        return 0
    if given == SYSTEM:
        found = last_level_cache()
        if not found:
            raise ValueError("--off-cache: this system does not say how large its last-level "
                             "cache is; give the size, e.g. --off-cache 256M")  # fmt: skip
        return found
    if given < 1 << 10:
        raise ValueError(f"--off-cache {given}: {format_size(given, long=True)} is no cache; "
                         "give its size with a unit, e.g. --off-cache 256M")  # fmt: skip
    return given


def buffer_sets(nbytes: int, cache: int, node_ranks: int, most: int, buffers: int = 2) -> int:
    """How many sets of ``buffers`` buffers of ``nbytes`` (a send and a receive one; 1
    in place) each rank rotates over so that the node's ranks touch twice its ``cache``
    bytes before a set comes back (``--off-cache``, as IMB's ``-off_cache``): one where
    one set already does, at most ``most`` (small buffers, which sit in any cache, gain
    nothing from more)."""
    needed = math.ceil(2 * cache / (node_ranks * buffers * max(nbytes, 1)))
    return max(1, min(needed, most))


def interleaved(rows: int, i: int) -> list[int]:
    """Round ``i``'s order of the ``rows`` timed rows: row ``j * step % rows`` j-th, the
    step cycling through the numbers coprime to ``rows``. No row follows itself, also
    across the seam to the next round (which starts at row 0 after row ``-step``); where
    ``rows`` is prime (2, 3, 5, 7, 11) every row follows every other equally often over
    ``rows - 1`` rounds, so that the row after a memory-hungry one (auto's shared memory
    beside the library's call) does not always pay for it."""
    steps = [s for s in range(1, rows) if math.gcd(s, rows) == 1] or [1]
    step = steps[i % len(steps)]
    return [j * step % rows for j in range(rows)]
