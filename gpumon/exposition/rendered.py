"""One snapshot's per-GPU families as bytes, per exposition format: encoded once, and deflated
once for gzip, whatever the number of scrapes of that snapshot.

The per-GPU families are nearly all of an exposition (5.2 MB of 5.4 at 256 GPUs); a scrape
writes its own small head (the snapshot's age, poll and host figures) and tail (alerts,
health, the collectors' timings) around this block (gpumon.exposition.collector).
"""

from __future__ import annotations

from collections.abc import Sequence

from gpumon.exposition import gzip_parts, openmetrics
from gpumon.exposition.text import Heads, render
from gpumon.model.families import Family
from gpumon.model.snapshot import Snapshot
from gpumon.util.reuse import same_objects

TEXT = "text"
"""Prometheus text format 0.0.4."""
OPENMETRICS = "openmetrics"
"""OpenMetrics 1.0 text."""


def render_text(families: Sequence[Family], fmt: str, heads: Heads | None = None) -> str:
    """``families`` in format ``fmt`` (OpenMetrics without its ``# EOF``); ``heads``: see ``text.render``."""
    return openmetrics.render_text(families, heads) if fmt == OPENMETRICS else render(families, heads)


class Rendered:
    """Families (sealed: not changed any more) and their bytes per format, made on first use.

    Safe to share between threads: two threads that ask for the same bytes at once may both
    make them (the same bytes); neither waits for the other.
    """

    def __init__(self, families: Sequence[Family], *, sealed: bool = False) -> None:
        """``sealed``: every one of ``families`` is sealed already (by whoever made them)."""
        if not sealed:
            for family in families:
                family.seal()
        self.families = families
        self._bytes: dict[str, bytes] = {}
        self._parts: dict[str, gzip_parts.Part] = {}

    def holds(self, families: Sequence[Family]) -> bool:
        """Whether ``families`` are these very family objects, in this order."""
        return same_objects(families, self.families)

    def block(self, fmt: str) -> bytes:
        """The families in format ``fmt``, encoded."""
        data = self._bytes.get(fmt)
        if data is None:
            data = self._bytes[fmt] = render_text(self.families, fmt).encode()
        return data

    def part(self, fmt: str) -> gzip_parts.Part:
        """``block(fmt)`` deflated, for a gzip member."""
        part = self._parts.get(fmt)
        if part is None:
            part = self._parts[fmt] = gzip_parts.deflate(self.block(fmt))
        return part

    def made(self, fmt: str, gzip: bool) -> bool:
        """Whether the bytes a (``fmt``, ``gzip``) scrape needs are made already."""
        return fmt in (self._parts if gzip else self._bytes)


class RenderedSnapshot(Rendered):
    """The per-GPU families of ``snapshot``, rendered with ``options`` (the collector's HELP
    intervals and process opt-in)."""

    def __init__(self, snapshot: Snapshot, options: object, families: Sequence[Family]) -> None:
        super().__init__(families, sealed=True)  # gpumon.exposition.gpu_families seals each one it makes
        self.snapshot = snapshot
        self.options = options
        self.served: set[tuple[str, bool]] = set()
        """(format, gzip) of each scrape that served this snapshot; empty: no scrape served it."""

    def of(self, snapshot: Snapshot) -> bool:
        """Whether these are the families of this very snapshot (a snapshot is frozen: each poll
        publishes a new one, so the very object means the very content)."""
        return self.snapshot is snapshot
