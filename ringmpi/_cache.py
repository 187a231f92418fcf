"""Bounded caches (a dict that forgets its oldest half when it is full), and the
caches derived from communicators, emptied when one is freed or broken off."""

from __future__ import annotations

from typing import Protocol, TypeVar

__all__ = ["Bounded", "changed", "derived"]


class _Clearable(Protocol):
    """What :func:`derived` takes: a dict, or anything else that empties on ``clear()``."""

    def clear(self) -> None: ...


K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D", bound=_Clearable)


class Bounded(dict[K, V]):
    """At most ``limit`` entries; :meth:`put` into a full one first forgets the older
    half (insertion order), so a working set that fits stays whole."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> V:
        if len(self) >= self.limit:
            for old in list(self)[: max(1, self.limit // 2)]:
                self.pop(old, None)  # (another thread may have forgotten it first)
        self[key] = value
        return value


# The caches of remembered calls (the API's repeat path): emptied when a
# communicator is freed or broken off, so that a repeat need not check it.
_derived: list[_Clearable] = []


def derived(cache: D) -> D:
    """Register ``cache`` to be emptied by :func:`changed`; returns it."""
    _derived.append(cache)
    return cache


def changed() -> None:
    """A communicator was freed or broken off: forget every remembered call."""
    for cache in _derived:
        cache.clear()
