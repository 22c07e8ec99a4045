"""The extra sources of a scrape (alerts, burn results, health, DCGM names): asked, timed and guarded.

Each source gives its families in every scrape; one that raises is logged and counted as
failed (``gpumon_collector_success 0``) and the scrape goes on without its families. A source is
added once by its name, and one that serves a family whose name the scrape serves already (gpumon's
own, or an earlier source's) is refused the same way: a twin is never served. A family
that holds the same samples as the one of its name the scrape before gave is replaced by
that one, so its text, once rendered, is reused.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence, Set

from gpumon.exposition.family_reuse import FamilyReuse
from gpumon.model.families import Family, FamilySource, refuse_twins

log = logging.getLogger("gpumon.exposition.collector")
"""The logger name these log lines have always carried (they lived in collector.py)."""


class ExtraSources:
    """The extra sources by name, in the order they were added, and the families they gave last."""

    def __init__(self, sources: Sequence[tuple[str, FamilySource]]) -> None:
        self._sources: list[tuple[str, FamilySource]] = []
        self._per_snapshot: set[str] = set()
        self._last = FamilyReuse()
        """The extra sources' families of the last scrape (their text, once rendered, is reused)."""
        for name, source in sources:
            self.add(name, source, per_snapshot=False)

    def add(self, name: str, source: FamilySource, *, per_snapshot: bool) -> None:
        """Ask ``source`` in every scrape as ``name``; ``per_snapshot``: it builds its families once
        per snapshot, and ``warm_per_snapshot`` asks it ahead of the scrapes. ValueError when a
        source of that name was added already (its ``gpumon_collector_success`` row would be twice)."""
        if name == "gpumon" or any(name == known for known, _ in self._sources):
            raise ValueError(f"collector {name} is added twice")
        self._sources.append((name, source))
        if per_snapshot:
            self._per_snapshot.add(name)

    def families(
        self, timings: list[tuple[str, float, float]], monotonic: Callable[[], float], served: Set[str]
    ) -> list[Family]:
        """Every extra source's families, each timed (seconds of ``monotonic``) and guarded (its
        (name, success, seconds) appended to ``timings``); ``served``: the family names the scrape
        serves besides, which no source may serve again."""
        out: list[Family] = []
        served = set(served)
        for name, source in self._sources:
            start = monotonic()
            try:
                families = list(source.families())
                served |= refuse_twins((f.family_name for f in families), served)
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
