"""The extra sources of a scrape (alerts, burn results, health, DCGM names): asked, timed and guarded.

Each source gives its families in every scrape; one that raises is logged and counted as
failed (``gpumon_collector_success 0``) and the scrape goes on without its families. A source is
added once by its name, and one that serves a family whose name the scrape serves already (gpumon's
own, or an earlier source's) is refused the same way: a twin is never served. A source given a
budget (``exporter.sources``) is asked on a thread of its own and waited for that long at most: one
that overruns is reported failed and left out, not waited on (gpumon.util.budget). A family
that holds the same samples as the one of its name the scrape before gave is replaced by
that one, so its text, once rendered, is reused. A source whose families all hold what they
held in the last scrape, where the scrape serves the same names besides, is compared once (one
list of the families' contents) and served the last scrape's families, their twins checked then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence, Set
from typing import Any, NamedTuple

from gpumon.exposition.family_reuse import FamilyReuse
from gpumon.model.families import Family, FamilySource, refuse_twins
from gpumon.util.budget import Budgeted, OverBudget

log = logging.getLogger(__name__)


class NoFamilies:
    """A source of no families: a row of ``gpumon_collector_success`` for calls made elsewhere (``also``)."""

    def families(self) -> list[Family]:
        return []


class BudgetedSource:
    """A source whose families are waited for ``budget_seconds`` at most (None: as long as it takes);
    ``also``: calls made elsewhere under its name (a store listener, the poller's read of the host's
    figures): while one of them overran at its last call, the source fails too."""

    def __init__(
        self, name: str, source: FamilySource, budget_seconds: float | None, also: Sequence[Budgeted[..., Any]] = ()
    ) -> None:
        self._source = source
        self._budgeted = None if budget_seconds is None else Budgeted(name, self._ask, budget_seconds)
        self._also = tuple(also)

    def _ask(self) -> list[Family]:
        return list(self._source.families())

    def families(self) -> list[Family]:
        late = next((call for call in self._also if call.overran), None)
        if late is not None:
            raise OverBudget(f"{late.name} took longer than its budget of {late.budget_seconds:g} s at its last call")
        return self._ask() if self._budgeted is None else self._budgeted()


class _Given(NamedTuple):
    """What a source gave in the last scrape it answered, and where."""

    contents: list[tuple[object, ...]]
    """What the source gave, family by family (``_contents``), before any was replaced by the last scrape's."""
    served_before: Set[str]
    """The names the scrape served before this source's families."""
    families: list[Family]
    """The families served (sealed)."""
    names: frozenset[str]


def _contents(families: list[Family]) -> list[tuple[object, ...]]:
    """What each of ``families`` renders from (its samples copied: a source may change a family it
    gave, as long as it is not sealed): two equal lists render to the same text."""
    return [
        (f.name, f.kind, f.help, f.label_names, tuple(f.samples), f.plain_labels, f.optional_labels) for f in families
    ]


class ExtraSources:
    """The extra sources by name, in the order they were added, and the families they gave last."""

    def __init__(self, sources: Sequence[tuple[str, FamilySource]]) -> None:
        self._sources: list[tuple[str, FamilySource]] = []
        self._per_snapshot: set[str] = set()
        self._last = FamilyReuse()
        """The extra sources' families of the last scrape (their text, once rendered, is reused)."""
        self._given: dict[str, _Given] = {}
        """Per source, what it gave in the last scrape it answered."""
        self._late: set[str] = set()
        """The sources that overran their budget in the last scrape (logged once, until they answer again)."""
        for name, source in sources:
            self.add(name, source, per_snapshot=False)

    def add(
        self,
        name: str,
        source: FamilySource,
        *,
        per_snapshot: bool,
        budget_seconds: float | None = None,
        also: Sequence[Budgeted[..., Any]] = (),
    ) -> None:
        """Ask ``source`` in every scrape as ``name``; ``per_snapshot``: it builds its families once
        per snapshot, and ``warm_per_snapshot`` asks it ahead of the scrapes; ``budget_seconds`` and
        ``also``: see BudgetedSource. ValueError when a source of that name was added already (its
        ``gpumon_collector_success`` row would be twice)."""
        if name == "gpumon" or any(name == known for known, _ in self._sources):
            raise ValueError(f"collector {name} is added twice")
        if budget_seconds is not None or also:
            source = BudgetedSource(name, source, budget_seconds, also)
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
        for name, source in self._sources:
            start = monotonic()
            try:
                families, served = self._served(name, list(source.families()), served)
                ok = 1.0
            except OverBudget as exc:
                if name not in self._late:
                    log.warning("collector %s left out of the scrape: %s", name, exc)
                self._late.add(name)
                families, ok = [], 0.0
            except Exception:
                log.exception("collector %s failed; its metrics are left out of this scrape", name)
                families, ok = [], 0.0
            if ok and name in self._late:
                self._late.discard(name)
                log.warning("collector %s answers within its budget again", name)
            timings.append((name, ok, monotonic() - start))
            out.extend(families)
        return out

    def _served(self, name: str, families: list[Family], served: Set[str]) -> tuple[list[Family], Set[str]]:
        """The families to serve of ``families`` (source ``name``'s), each replaced by the last
        scrape's of its name when it holds the same, and the names served with them;
        DuplicateFamilyError for a twin (of ``served`` or among them)."""
        contents = _contents(families)
        given = self._given.get(name)
        if given is not None and given.contents == contents and given.served_before == served:
            return given.families, served | given.names  # checked for twins with these very names
        names = refuse_twins((f.family_name for f in families), served)
        families = self._last.reuse(families)
        self._given[name] = _Given(contents, served, families, names)
        return families, served | names

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
