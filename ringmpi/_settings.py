"""ringmpi's settings: one frozen snapshot, read from the RINGMPI_* environment once.

Each field of :class:`Settings` is one setting; its environment variable is
``RINGMPI_`` and the field's name in capitals. The environment is read at the
first call that needs a setting, never again; a program changes settings
from code with :func:`ringmpi.configure` (for the rest of the run) or
:func:`ringmpi.configured` (inside a ``with`` block). Every change makes a new
snapshot, so a cache keyed by the snapshot object (the repeat path, auto's
choice) is current by an identity test.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from typing import Any

__all__ = [
    "Settings", "check_with", "configure", "configured", "current", "parse_seconds", "using",
]  # fmt: skip

PLACEMENTS = ("block", "cyclic")
STORES = ("auto", "cached", "streaming")
WAITS = ("auto", "spin", "sleep")
OVERSUBSCRIBED = ("auto", "yes", "no")
PROGRESS = ("auto", "thread", "wait")
TUNERS = ("auto", "memory", "off")  # or a directory for the tuner's cache file


def _text(value: object) -> str:
    return str(value)


def _switch(value: object) -> bool:
    if isinstance(value, str):
        return value.strip() not in ("", "0")
    return bool(value)


def _count(value: Any, says: str) -> int | None:
    """A whole number >= 1, or None (unset, empty, None)."""
    if value is None or value == "":
        return None
    try:
        number = int(value) if not isinstance(value, float) else None
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or number < 1:
        raise ValueError(f"{says} must be a whole number >= 1, not {value!r}")
    return number


def parse_seconds(value: object, says: str) -> float:
    """A timeout in seconds: a finite number >= 0, or None, empty or 0 for none
    (returns 0.0). ``says`` names where it came from, for the error."""
    if value is None:
        return 0.0
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return 0.0
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{says} must be a number of seconds >= 0, not {text!r}") from None
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{says} must be a number of seconds or None, not {type(value).__name__}")
    if not 0.0 <= value < math.inf:
        raise ValueError(f"{says} must be a number of seconds >= 0, not {value!r}")
    return float(value)


def _one_of(options: tuple[str, ...]):
    def parse(value: object, says: str) -> str:
        text = str(value) if value not in (None, "") else options[0]
        if text not in options:
            allowed = ", ".join(options[:-1]) + f" or {options[-1]}"
            raise ValueError(f"{says} must be {allowed}, not {text!r}")
        return text

    return parse


def _text_or(default: str):
    """A text; None or empty for ``default`` (what the registered check judges)."""
    return lambda value, says: _text(value) if value not in (None, "") else default


def _tuner(value: object, says: str) -> str:
    text = str(value).strip() if value not in (None, "") else "auto"
    return text if text else "auto"


def _days(value: Any, says: str) -> float:
    if value is None or value == "":
        return 30.0
    try:
        days = float(value)
    except (TypeError, ValueError):
        days = math.nan
    if isinstance(value, bool) or not 0.0 <= days < math.inf:
        raise ValueError(f"{says} must be a number of days >= 0, not {value!r}")
    return days


def _auto_or(least: int, what: str):
    """A parser of a whole number of ``what`` >= ``least``, or None for auto (unset,
    empty, "auto")."""

    def parse(value: Any, says: str) -> int | None:
        if value is None or (isinstance(value, str) and value.strip() in ("", "auto")):
            return None
        try:
            number = int(value) if not isinstance(value, (bool, float)) else None
        except (TypeError, ValueError):
            number = None
        if number is None or number < least:
            raise ValueError(f"{says} must be auto or a whole number of {what} >= {least}, "
                             f"not {value!r}")  # fmt: skip
        return number

    return parse


def _setting(default: object, parse, doc: str):
    return field(default=default, metadata={"parse": parse, "doc": doc})


@dataclass(frozen=True, eq=False)  # a snapshot is itself: caches key it by identity
class Settings:
    """Every setting, checked. Field ``x`` is environment variable ``RINGMPI_X``."""

    algorithm: str = _setting("auto", _text_or("auto"), "what auto resolves to (a registry name)")
    tuning: str = _setting("", _text_or(""), "a tuning file for auto's cost model")
    ranks_per_node: int | None = _setting(None, _count, "emulated nodes of this many ranks")
    node_placement: str = _setting("block", _one_of(PLACEMENTS), "emulated nodes: block or cyclic")
    validate: bool = _setting(False, lambda v, s: _switch(v), "check that the ranks agree first")
    segment_bytes: int | None = _setting(None, _count, "bytes of each message segment")
    window_stores: str = _setting("auto", _one_of(STORES), "hierarchical's stores to its window")
    piece_bytes: int | None = _setting(None, _count, "bytes of each hierarchical pass")
    across: str = _setting("auto", _text_or("auto"), "hierarchical's phase across nodes (a "
                           "registry name)")  # fmt: skip
    timeout: float = _setting(0.0, parse_seconds, "seconds without progress before giving up")
    reproducible: bool = _setting(False, lambda v, s: _switch(v), "fold in rank order, bitwise")
    wait: str = _setting("auto", _one_of(WAITS), "how waiting ranks wait: spin or sleep")
    oversubscribed: str = _setting("auto", _one_of(OVERSUBSCRIBED), "whether a node's ranks "
                                   "outnumber the cores free to them: auto (their affinity "
                                   "masks and the node's load say), yes or no")  # fmt: skip
    progress: str = _setting("auto", _one_of(PROGRESS), "who carries out nonblocking calls")
    tuner: str = _setting("auto", _tuner, "auto's online tuner: auto, memory, off or a directory")
    retune_days: float = _setting(30.0, _days, "days after which a tuned choice is tried again")
    spacing: int | None = _setting(None, _auto_or(0, "calls"), "the calls of auto's lead "
                                   "between two of its tuner's trials: auto (within a "
                                   "budget of the lead's time) or a number")  # fmt: skip
    threads: int | None = _setting(None, _auto_or(1, "threads"), "threads of a rank's node "
                                   "reductions: auto (its share of the cores) or a "
                                   "number")  # fmt: skip

    @staticmethod
    def variable(name: str) -> str:
        return "RINGMPI_" + name.upper()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings the ``RINGMPI_*`` variables of ``environ`` (default: this
        process's environment) give; ValueError naming a variable with a bad value."""
        env = os.environ if environ is None else environ
        given = {
            f.name: env[cls.variable(f.name)] for f in fields(cls) if cls.variable(f.name) in env
        }
        return cls()._with(given, cls.variable)

    def changed(self, **changes: object) -> Settings:
        """A new snapshot: this one with ``changes`` (checked as :func:`configure` does)."""
        return self._with(changes, lambda name: name)

    def _with(self, changes: Mapping[str, object], says) -> Settings:
        known = {f.name: f for f in fields(self)}
        parsed = {}
        for name, value in changes.items():
            if name not in known:
                raise TypeError(f"unknown setting {name!r} (known: {', '.join(known)})")
            parsed[name] = known[name].metadata["parse"](value, says(name))
            check = _CHECKS.get(name)
            if check is not None and parsed[name] != known[name].default:
                check(parsed[name], says(name))
        return replace(self, **parsed)


# Checks of values that only other modules can judge (the registry's names, a tuning
# file), which those modules register: this one imports nothing of the package.
_CHECKS: dict[str, Callable[[Any, str], object]] = {}


def check_with(name: str, check: Callable[[Any, str], object]) -> None:
    """Check every value given for setting ``name`` (from the environment or from
    code) with ``check(value, says)``, which raises ValueError naming ``says``."""
    _CHECKS[name] = check


_now: list[Settings | None] = [None]


def current() -> Settings:
    """The settings in force: read from the environment at the first use."""
    now = _now[0]
    if now is None:
        now = _now[0] = Settings.from_environ()
    return now


def configure(**changes: object) -> Settings:
    """Change settings for the rest of the run: ``ringmpi.configure(timeout=30,
    segment_bytes=1 << 20)``; a value of None restores the default. Values are
    checked as the environment's are (strings are parsed); returns the new
    settings. Every rank should make the same changes."""
    new = current().changed(**_defaulted(changes))
    _now[0] = new
    return new


def _defaulted(changes: Mapping[str, object]) -> dict[str, object]:
    """``changes`` with None as the setting's default."""
    defaults = Settings()
    return {k: getattr(defaults, k) if v is None and k in _names() else v
            for k, v in changes.items()}  # fmt: skip


@contextmanager
def configured(**changes: object) -> Iterator[Settings]:
    """:func:`configure` inside a ``with`` block: the settings before it come back after."""
    with using(current().changed(**_defaulted(changes))) as now:
        yield now


@contextmanager
def using(snapshot: Settings) -> Iterator[Settings]:
    """The settings ``snapshot`` inside a ``with`` block (a tool's prepared variant)."""
    before = current()
    _now[0] = snapshot
    try:
        yield snapshot
    finally:
        _now[0] = before


def reset() -> None:
    """Read the environment again at the next use (its ``RINGMPI_*`` variables then
    replace every setting, those made by :func:`configure` too)."""
    _now[0] = None


def _names() -> set[str]:
    return {f.name for f in fields(Settings)}
