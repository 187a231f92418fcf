"""ringmpi's environment settings (RINGMPI_*), read and checked in one place."""

from __future__ import annotations

import os

__all__ = ["choice", "flag", "positive_int"]


def positive_int(name: str) -> int | None:
    """The whole number >= 1 in environment variable ``name``, or None when unset."""
    text = os.environ.get(name, "")
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a whole number >= 1, not {text!r}")
    return value


def choice(name: str, options: tuple[str, ...]) -> str:
    """One of ``options`` from environment variable ``name``; the first when unset."""
    value = os.environ.get(name, "") or options[0]
    if value not in options:
        allowed = ", ".join(options[:-1]) + f" or {options[-1]}"
        raise ValueError(f"{name} must be {allowed}, not {value!r}")
    return value


def flag(name: str) -> bool:
    """Environment variable ``name`` as a switch: unset, empty or ``0`` is off."""
    return os.environ.get(name, "") not in ("", "0")
