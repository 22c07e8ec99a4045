"""Whether two sequences hold the very same objects: the check the caches use to reuse what they
built from those objects (families, reports) without comparing values."""

from __future__ import annotations

from collections.abc import Sequence


def same_objects(a: Sequence[object], b: Sequence[object]) -> bool:
    """Whether ``a`` and ``b`` hold the same objects (``is``), in the same order."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
