"""The value built from the very inputs last time: the one shape of gpumon's caches.

A cache keeps one value and what it was built from: inputs compared by identity (``same``: a
snapshot, a report, a list an engine keeps; objects never changed once made, so the very object
means the very content) and inputs compared by value (``equal``: options, counts, stat keys).
Given the same inputs it hands out the value it kept instead of building it again.

What a cache hands out again must not change meanwhile: ``ReuseSealed`` keeps sequences of
sealable values (metric families) and seals each one it keeps, so adding to it then raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import is_
from typing import Generic, Protocol, TypeVar

V = TypeVar("V")


def same_objects(a: Sequence[object], b: Sequence[object]) -> bool:
    """Whether ``a`` and ``b`` hold the same objects (``is``), in the same order (compared in C: a health
    series' signals hold one object per GPU and signal, compared at every scrape)."""
    return len(a) == len(b) and all(map(is_, a, b))


class Reuse(Generic[V]):
    """One value and the inputs it was built from. Safe to read from several threads (the value
    and its inputs are replaced together); two threads that build at once both build (the caller
    locks when one build must wait for the other)."""

    def __init__(self) -> None:
        self._kept: tuple[tuple[object, ...], tuple[object, ...], V] | None = None

    def kept(self, *, same: tuple[object, ...] = (), equal: tuple[object, ...] = ()) -> V | None:
        """The value kept when it was built from ``same`` (the very objects, in order) and
        ``equal`` (equal values, in order); None when it was not (or nothing is kept)."""
        kept = self._kept
        if kept is not None and kept[1] == equal and same_objects(kept[0], same):
            return kept[2]
        return None

    def get(self, build: Callable[[], V], *, same: tuple[object, ...] = (), equal: tuple[object, ...] = ()) -> V:
        """The value kept when it was built from these inputs (see ``kept``), otherwise
        ``build()``, kept with them."""
        kept = self._kept
        if kept is not None and kept[1] == equal and same_objects(kept[0], same):
            return kept[2]
        value = build()
        self._keep(value)
        self._kept = (same, equal, value)
        return value

    def forget(self) -> None:
        """Keep nothing: the next ``get`` builds."""
        self._kept = None

    def _keep(self, value: V) -> None:
        """What is done to a value before it is kept (nothing here)."""


class Sealable(Protocol):
    """A value that can be made read-only (gpumon.model.families.Family)."""

    def seal(self) -> None: ...


S = TypeVar("S", bound=Sealable)


class ReuseSealed(Reuse[list[S]], Generic[S]):
    """``Reuse`` of a list of sealable values (metric families): each one is sealed when kept, so
    what is handed out again is what was built."""

    def _keep(self, value: list[S]) -> None:
        for item in value:
            item.seal()
