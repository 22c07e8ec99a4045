"""The extra sources of a scrape (alerts, burn results, health, DCGM names): asked, timed and guarded.

Each source gives its families in every scrape; one that raises is logged and counted as
failed (``gpumon_collector_success 0``) and the scrape goes on without its families. A family
that holds the same samples as the one of its name the scrape before gave is replaced by
that one, so its text, once rendered, is reused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpumon.exposition.family_reuse import FamilyReuse
from gpumon.model.families import Family, FamilySource

log = logging.getLogger("gpumon.exposition.collector")
"""The logger name these log lines have always carried (they lived in collector.py)."""


class ExtraSources:
    """The extra sources by name, in the order they were added, and the families they gave last."""

    def __init__(self, sources: Sequence[tuple[str, FamilySource]]) -> None:
        self._sources = list(sources)
        self._per_snapshot: set[str] = set()
        self._last = FamilyReuse()
        """The extra sources' families of the last scrape (their text, once rendered, is reused)."""

    def add(self, name: str, source: FamilySource, *, per_snapshot: bool) -> None:
        """Ask ``source`` in every scrape as ``name``; ``per_snapshot``: it builds its families once
        per snapshot, and ``warm_per_snapshot`` asks it ahead of the scrapes."""
        self._sources.append((name, source))
        if per_snapshot:
            self._per_snapshot.add(name)

    def families(self, timings: list[tuple[str, float, float]], monotonic: Callable[[], float]) -> list[Family]:
        """Every extra source's families, each timed (seconds of ``monotonic``) and guarded (its
        (name, success, seconds) appended to ``timings``)."""
        out: list[Family] = []
        for name, source in self._sources:
            start = monotonic()
            try:
                families = list(source.families())
                ok = 1.0
            except Exception:
                log.exception("collector %s failed; its metrics are left out of this scrape", name)
                families, ok = [], 0.0
            timings.append((name, ok, monotonic() - start))
            out.extend(self._last.reuse(families))
        return out

    def warm_per_snapshot(self) -> None:
        """Have each per-snapshot source build its families of the latest snapshot."""
        for name, source in self._sources:
            if name in self._per_snapshot:
                self._warm(name, source)

    @staticmethod
    def _warm(name: str, source: FamilySource) -> None:
        """Have a per-snapshot source build its families of the latest snapshot."""
        try:
            for _family in source.families():
                pass
        except Exception:  # the scrape that asks it next logs it and reports the failure
            log.debug("collector %s failed ahead of a scrape", name, exc_info=True)
