"""ringmpi's environment settings (RINGMPI_*), read and checked in one place.

They are read at every call, so a program (or the CLI) may change them between
calls. ``os.environ.get`` of an unset variable costs about 0.7 us (a KeyError
raised and caught inside it), a sizeable part of an 8-byte all-reduce, so on
POSIX the lookup reads the mapping's own dictionary, which ``os.environ``
keeps current on every change.
"""

from __future__ import annotations

import os

__all__ = ["choice", "flag", "get", "positive_int", "seconds", "snapshot", "snapshotter", "watcher"]

_raw = getattr(os.environ, "_data", None)
_fast = os.name == "posix" and isinstance(_raw, dict)


_keys: dict[str, bytes] = {}


def get(name: str) -> str:
    """The value of environment variable ``name``; empty when unset."""
    if _fast:
        key = _keys.get(name)
        if key is None:
            key = _keys[name] = os.fsencode(name)
        value = _raw.get(key)
        return "" if value is None else os.fsdecode(value)
    return os.environ.get(name, "")


def snapshot(names: tuple[str, ...]) -> tuple:
    """The raw values of several variables at once (None where unset), to key a cache."""
    if _fast:
        return tuple(map(_raw.get, _encoded(names)))
    return tuple(os.environ.get(name) for name in names)


def snapshotter(names: tuple[str, ...]):
    """A function of no arguments that returns ``snapshot(names)``, for hot paths."""
    if _fast:
        keys, lookup = _encoded(names), _raw.get
        return lambda: tuple(map(lookup, keys))
    return lambda: snapshot(names)


def watcher(names: tuple[str, ...]):
    """A function of no arguments whose value changes whenever any of ``names`` may
    have changed: a count of every change made through ``os.environ`` (about 5 ns,
    where comparing snapshots of ten variables costs about 0.6 us of an 8-byte
    call), or, where ``os.environ`` cannot be watched, ``snapshot(names)``."""
    if _watched:
        changes = _changes
        return lambda: changes[0]
    return snapshotter(names)


# Every change made through os.environ counts here: its class is replaced by a
# subclass whose __setitem__ and __delitem__ (which update, pop, clear and
# setdefault go through) also bump the count.
_changes = [0]


def _watch() -> bool:
    base = type(os.environ)

    class _Watched(base):  # type: ignore[misc, valid-type]
        def __setitem__(self, key, value):
            super().__setitem__(key, value)
            _changes[0] += 1

        def __delitem__(self, key):
            super().__delitem__(key)
            _changes[0] += 1

    try:
        os.environ.__class__ = _Watched
    except TypeError:
        return False
    return True


_watched = _fast and (type(os.environ).__name__ == "_Watched" or _watch())


_encodings: dict[tuple[str, ...], tuple[bytes, ...]] = {}


def _encoded(names: tuple[str, ...]) -> tuple[bytes, ...]:
    found = _encodings.get(names)
    if found is None:
        found = _encodings[names] = tuple(os.fsencode(n) for n in names)
    return found


def positive_int(name: str) -> int | None:
    """The whole number >= 1 in environment variable ``name``, or None when unset."""
    text = get(name)
    if not text:
        return None
    return _parsed(text, int, lambda v: v >= 1, f"{name} must be a whole number >= 1")


def _parsed(text: str, kind, allowed, says: str):
    """``kind(text)`` if ``allowed`` by it, else ValueError(``says``, not text);
    remembered per text (a setting is parsed on every call)."""
    known = _known.get((kind, text))
    if known is not None:
        return known
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not allowed(value):
        raise ValueError(f"{says}, not {text!r}")
    _known[(kind, text)] = value
    return value


_known: dict[tuple, object] = {}


def choice(name: str, options: tuple[str, ...]) -> str:
    """One of ``options`` from environment variable ``name``; the first when unset."""
    value = get(name) or options[0]
    if value not in options:
        allowed = ", ".join(options[:-1]) + f" or {options[-1]}"
        raise ValueError(f"{name} must be {allowed}, not {value!r}")
    return value


def flag(name: str) -> bool:
    """Environment variable ``name`` as a switch: unset, empty or ``0`` is off."""
    return get(name) not in ("", "0")


def seconds(value: object, name: str) -> float:
    """A timeout in seconds: a finite number > 0, or None/0 for none (returns 0.0).
    ``name`` says where it came from, for the error."""
    if value is None:
        return 0.0
    says = f"{name} must be a number of seconds >= 0"
    if isinstance(value, str):
        text = value.strip()
        return _parsed(text, float, _finite, says) if text else 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, not {type(value).__name__}")
    if not _finite(value):
        raise ValueError(f"{says}, not {value!r}")
    return float(value)


def _finite(value: float) -> bool:
    return 0.0 <= value < float("inf")
