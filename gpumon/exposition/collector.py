"""The Prometheus collector: fresh metric families from the latest snapshot.

A scrape never touches NVML: it reads the SnapshotStore. Series of a GPU that
vanished or is lost disappear by themselves because families are rebuilt per scrape.
Extra sources (alerts, burn results, health, DCGM names) give their families inside each
scrape, each timed and guarded: one that fails is logged and reported by
``gpumon_collector_success 0``, and the scrape still answers 200 with everything else
(``gpumon.exposition.extra_sources``). The daemon's own families before the per-GPU ones
are ``gpumon.exposition.own_families``'s (a scrape's, ``KeptHead``'s: each part kept while what it
shows holds, the age made anew).

Every source gives gpumon.model.families.Family objects (``families()``); ``render()`` and
``render_openmetrics()`` write them all with the fast renderers, and ``collect()`` gives the
same families as prometheus_client Metric objects for registries.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from gpumon import __version__
from gpumon.collect.store import SnapshotStore
from gpumon.exposition import gzip_parts
from gpumon.exposition.extra_sources import ExtraSources
from gpumon.exposition.gpu_families import GpuFamilies
from gpumon.exposition.openmetrics import EOF as OPENMETRICS_EOF
from gpumon.exposition.own_families import KeptHead, SelfStats, head_families
from gpumon.exposition.rendered import OPENMETRICS, TEXT, Rendered, RenderedSnapshot, render_text
from gpumon.exposition.text import Heads, needs_escaping, render
from gpumon.model.families import Family, FamilySource
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import Snapshot, Tier
from gpumon.util.budget import Budgeted

if TYPE_CHECKING:
    from prometheus_client.core import Metric

log = logging.getLogger(__name__)

SUCCESS, DURATION = "gpumon_collector_success", "gpumon_collector_duration_seconds"
"""The families that report each source of a scrape (after every other)."""


class GpumonCollector:
    """Builds every gpumon_* family from the store on each scrape."""

    serves_openmetrics = True
    """It serves OpenMetrics too (gpumon.http.server.Exposition)."""

    def __init__(
        self,
        store: SnapshotStore,
        intervals: PollIntervals,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        self_stats: Callable[[], SelfStats] = SelfStats,
        processes: bool = False,
        detail: frozenset[str] = frozenset(),
        extra: Sequence[tuple[str, FamilySource]] = (),
        version: str = __version__,
        python_version: str | None = None,
    ) -> None:
        self._store = store
        self._intervals = intervals
        self._mono = monotonic
        self._self_stats = self_stats
        self._processes = processes
        self._detail = detail
        self._gpu = GpuFamilies(intervals, processes=processes, detail=detail)
        self._version = version
        self._python_version = python_version or platform.python_version()
        self._head = KeptHead(self_stats, monotonic, version=version, python_version=self._python_version)
        """gpumon's own families of the scrapes: each part kept while what it shows holds."""
        self._served: tuple[frozenset[str], frozenset[str], frozenset[str]] = (frozenset(), frozenset(), frozenset())
        """The head's names and the per-GPU ones the last served names were worked out from, and those."""
        self._success: tuple[list[tuple[str, float]], Family] | None = None
        """The collectors and their success in the last scrape, and its gpumon_collector_success family."""
        self._lock = threading.Lock()
        self._newest: RenderedSnapshot | None = None
        """The newest snapshot whose per-GPU families are rendered."""
        self._prepared: Snapshot | None = None
        """The last snapshot ``prepare`` was called with (None: no store listener, never render ahead)."""
        self._rendering: Snapshot | None = None
        """The snapshot ``prepare`` renders ahead of the scrapes right now."""
        self._heads: dict[str, Heads] = {TEXT: {}, OPENMETRICS: {}}
        """Per format, the HELP and TYPE lines and templates of the head's and tail's families, made anew."""
        self._extras = ExtraSources(extra)
        self._extras_rendered: tuple[Rendered, list[tuple[str, float, float]]] | None = None
        """The extra sources' families of the last scrape and their bytes, and the sources' timings."""

    def set_options(self, intervals: PollIntervals, *, processes: bool, detail: frozenset[str] | None = None) -> None:
        """New intervals (for HELP texts), per-process and detail (``exporter.detail``) opt-ins after a reload."""
        self._intervals = intervals
        self._processes = processes
        self._gpu.set_options(intervals, processes=processes, detail=detail)
        if detail is not None:
            self._detail = detail  # a snapshot rendered with other opt-ins is rendered again

    def add(
        self,
        name: str,
        source: FamilySource,
        *,
        per_snapshot: bool = False,
        budget_seconds: float | None = None,
        also: Sequence[Budgeted[..., Any]] = (),
    ) -> None:
        """Take ``source``'s families in every scrape, guarded and timed as ``name``.
        ``per_snapshot``: the source builds its families once per snapshot (and reuses them for
        later scrapes of it); ``prepare`` then asks it ahead of the scrapes when it renders ahead.
        ``budget_seconds``: the longest a scrape (or ``prepare``) waits for it; ``also``: calls made
        elsewhere under its name that fail it when they overran (gpumon.exposition.extra_sources)."""
        self._extras.add(name, source, per_snapshot=per_snapshot, budget_seconds=budget_seconds, also=also)

    # ------------------------------------------------------------------
    def render(self) -> bytes:
        """The whole exposition in Prometheus text format 0.0.4 (the latest snapshot; the daemon
        serves ``body``, the same bytes)."""
        return render(self.families()).encode()

    def render_openmetrics(self) -> bytes:
        """The whole exposition in OpenMetrics 1.0 text (see ``render``)."""
        return (render_text(self.families(), OPENMETRICS) + OPENMETRICS_EOF).encode()

    def body(self, *, openmetrics: bool = False, gzip: bool = False) -> list[bytes]:
        """One scrape's body as chunks to send in order: the exposition in OpenMetrics 1.0 text
        or Prometheus text 0.0.4, as a gzip member or not.

        The same families, in the same order, as ``families()``, but the per-GPU families of a
        snapshot are encoded (and deflated) once for every scrape of that snapshot; a scrape
        renders only its head (the families before them) and its tail (the extra sources' and
        the timings). While the polling thread renders the per-GPU families of the snapshot it
        has just published (``prepare``), a scrape serves the snapshot before it, whole.
        """
        body = self._body(OPENMETRICS if openmetrics else TEXT, gzip, ready_only=False)
        assert body is not None
        return body

    def ready_body(self, *, openmetrics: bool = False, gzip: bool = False) -> list[bytes] | None:
        """``body()`` when it is made of bytes kept already, so that making it takes a few
        milliseconds at most and asks no source (the snapshot before, served while the polling
        thread works on a new one, see ``body``); None when ``body()`` has more to do."""
        return self._body(OPENMETRICS if openmetrics else TEXT, gzip, ready_only=True)

    def _body(self, fmt: str, gzip: bool, *, ready_only: bool) -> list[bytes] | None:
        start = self._mono()
        latest = self._store.latest()
        rendered, previous = self._kept_for_scrape(latest)
        last = self._extras_rendered
        if ready_only and not (previous and rendered is not None and last is not None and rendered.made(fmt, gzip)):
            return None  # (the extra families' bytes in another format or encoding are a few milliseconds)
        if rendered is None and latest is not None:
            rendered = self._rendered(latest)
        head, head_names = self._head.families(None if rendered is None else rendered.snapshot)
        timings = [("gpumon", 1.0, self._mono() - start)]
        if previous and last is not None:
            extras = last[0]  # as the last scrape got them, before the polling thread's listeners ran
            timings += last[1]
        else:
            extra = self._extras.families(timings, self._mono, self._served_with(head_names))
            extras = last[0] if last is not None and last[0].holds(extra) else Rendered(extra)
            self._extras_rendered = (extras, timings[1:])
        openmetrics = fmt == OPENMETRICS
        heads = self._heads[fmt]
        head_bytes = render_text(head, fmt, heads).encode()
        tail_bytes = (render_text(self._meta(timings), fmt, heads) + (OPENMETRICS_EOF if openmetrics else "")).encode()
        if rendered is not None:
            rendered.served.add((fmt, gzip))
        blocks = [extras] if rendered is None else [rendered, extras]
        if gzip:
            parts = [gzip_parts.stored(head_bytes), *[b.part(fmt) for b in blocks], gzip_parts.stored(tail_bytes)]
            return gzip_parts.member(parts)
        return [head_bytes, *[b.block(fmt) for b in blocks], tail_bytes]

    def collect(self) -> Iterator[Metric]:
        """The same families as prometheus_client Metric objects (for registries)."""
        from gpumon.exposition.registry import FamilyMetric  # prometheus_client only for registries

        for family in self.families():
            yield FamilyMetric(family)

    def families(self) -> list[Family]:
        """Every family of one scrape: gpumon's own, each extra source's, then the sources'
        success and duration."""
        start = self._mono()
        out = self.own_families()
        timings = [("gpumon", 1.0, self._mono() - start)]
        out += self._extras.families(timings, self._mono, self._served_by_gpumon(out))
        return out + self._meta(timings)

    def _served_by_gpumon(self, own: list[Family]) -> frozenset[str]:
        """The names of the families gpumon serves itself in a scrape whose own families are
        ``own``: the head, every per-GPU family these options can serve, the sources' report."""
        return self._served_with(frozenset(f.family_name for f in own))

    def _served_with(self, head: frozenset[str]) -> frozenset[str]:
        """The names gpumon serves itself in a scrape whose head's names are ``head``, with every per-GPU
        family's and the sources' report (the same set object, scrape after scrape, while ``head`` is
        the same object: the set is worked out again only when it changes)."""
        served = self._served
        gpu = self._gpu.names
        if served[0] is head and served[1] is gpu:
            return served[2]
        names = head | gpu | {SUCCESS, DURATION}
        self._served = (head, gpu, names)
        return names

    def _head_families(self, snapshot: Snapshot | None) -> list[Family]:
        """gpumon's own families before the per-GPU ones, for ``snapshot``."""
        return head_families(
            snapshot, self._self_stats, self._mono, version=self._version, python_version=self._python_version
        )

    def _meta(self, timings: list[tuple[str, float, float]]) -> list[Family]:
        """gpumon_collector_success (kept while each collector's success is the same, so its text is
        rendered once) and gpumon_collector_duration_seconds, one row per collector of ``timings``."""
        oks = [(name, ok) for name, ok, _seconds in timings]
        kept = self._success
        if kept is not None and kept[0] == oks:
            success = kept[1]
        else:
            success = Family(
                SUCCESS,
                "gauge",
                "1 when the named collector ran without error in this scrape.",
                ("collector",),
                [((name,), float(ok)) for name, ok in oks],
                plain_labels=not needs_escaping(name for name, _ok in oks),
            )
            self._success = (oks, success)
        duration = Family(
            DURATION,
            "gauge",
            "Time the named collector took in this scrape, seconds.",
            ("collector",),
            [((name,), float(seconds)) for name, _ok, seconds in timings],
            plain_labels=success.plain_labels,
        )
        return [success, duration]

    # ------------------------------------------------------------------
    def own_families(self) -> list[Family]:
        """gpumon's own families for the latest snapshot."""
        snapshot = self._store.latest()
        out = self._head_families(snapshot)
        if snapshot is not None:
            out += self._gpu.of(snapshot)
        return out

    def prepare(self, snapshot: Snapshot) -> None:
        """Store listener: when a scrape served the snapshot rendered last, scrapes come at least once
        a poll: then, right after a slow or static read, those tiers' families are rendered on the
        polling thread (once per read, as the first scrape after it would), so no scrape waits for
        them, and every per-GPU family of ``snapshot`` is rendered here too, with the bytes (formats,
        gzip) those scrapes asked for, work the first scrape of ``snapshot`` would do; a scrape that
        comes meanwhile serves the snapshot before (see ``body``).

        Nothing is rendered ahead when no scrape came since the last snapshot rendered: a scraper
        slower than the polls (Prometheus every 15 s) has its scrape render the slow and static
        rows of the GPUs read since the last one, once, instead of the polling thread after each
        slow read of a GPU (8 reads in 10 polls at 8 GPUs, each making every changed row's family
        again). The bytes served are the same."""
        options = (self._intervals, self._processes, self._detail)
        with self._lock:
            newest = self._newest
            ahead = newest is not None and newest.served
        if ahead:
            self._gpu.prepare_slower(snapshot)
        with self._lock:
            self._prepared = snapshot
            newest = self._newest
            if newest is None or not newest.served or newest.options != options or newest.of(snapshot):
                return
            wanted = set(newest.served)
            self._rendering = snapshot
        try:
            rendered = RenderedSnapshot(snapshot, options, self._gpu.of(snapshot))
            for fmt, gzip in sorted(wanted):
                if gzip:
                    rendered.part(fmt)
                else:
                    rendered.block(fmt)
            self._extras.warm_per_snapshot()
            self._keep(rendered)  # scrapes serve it from now on, its bytes made
        finally:
            with self._lock:
                if self._rendering is snapshot:
                    self._rendering = None

    def _kept_for_scrape(self, latest: Snapshot | None) -> tuple[RenderedSnapshot | None, bool]:
        """What a scrape serves of what is rendered: the latest snapshot, or, while the polling
        thread works on it (its listeners, then ``prepare`` renders it ahead; at most one fast
        interval after it was taken), the one before (True then); (None, False) when the latest
        is to be rendered (or there is none)."""
        if latest is None:
            return None, False
        options = (self._intervals, self._processes, self._detail)
        with self._lock:
            newest = self._newest
            if newest is not None and newest.options == options:
                if newest.of(latest):
                    return newest, False
                coming = self._prepared is not None and self._prepared is not latest  # prepare(latest) will render
                if (
                    newest.served
                    and (coming or self._rendering is latest)
                    and 0.0 <= self._mono() - latest.monotonic_seconds < self._intervals.of(Tier.FAST)
                ):
                    return newest, True
        return None, False

    def _rendered(self, snapshot: Snapshot) -> RenderedSnapshot:
        """``snapshot``'s per-GPU families rendered (kept as the newest, unless a newer one is)."""
        families = self._gpu.of(snapshot)
        with self._lock:
            newest = self._newest
            if newest is not None and newest.of(snapshot) and newest.holds(families):
                return newest
        return self._keep(RenderedSnapshot(snapshot, (self._intervals, self._processes, self._detail), families))

    def _keep(self, rendered: RenderedSnapshot) -> RenderedSnapshot:
        """Keep ``rendered`` as the newest, unless one of the same or a newer snapshot is kept already
        (returned then)."""
        with self._lock:
            newest = self._newest
            if newest is not None and newest.of(rendered.snapshot) and newest.options == rendered.options:
                return newest
            if newest is None or newest.snapshot.monotonic_seconds <= rendered.snapshot.monotonic_seconds:
                self._newest = rendered
            return rendered
