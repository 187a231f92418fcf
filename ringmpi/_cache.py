"""A bounded cache: a dict that forgets its oldest half when it is full."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["Bounded"]

K = TypeVar("K")
V = TypeVar("V")


class Bounded(dict[K, V]):
    """At most ``limit`` entries; :meth:`put` into a full one first forgets the older
    half (insertion order), so a working set that fits stays whole."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> V:
        if len(self) >= self.limit:
            for old in list(self)[: max(1, self.limit // 2)]:
                del self[old]
        self[key] = value
        return value
