"""Sizes in bytes as the tools read and print them: 8, 64K, 1M, 16M."""

from __future__ import annotations

import argparse
import re

__all__ = ["format_size", "parse_size"]

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``64K``, ``16M``, ``1GiB`` (binary units); an argparse type."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 8, 64K, 16M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def format_size(nbytes: int, long: bool = False) -> str:
    """``nbytes`` in the largest binary unit that divides it: ``64K``, or with ``long``
    ``64 KiB`` (and ``8 B`` where no unit divides it)."""
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}iB" if long else f"{nbytes >> shift}{unit}"
    return f"{int(nbytes)} B" if long else str(nbytes)
