"""The Prometheus collector: fresh metric families from the latest snapshot.

A scrape never touches NVML: it reads the SnapshotStore. Series of a GPU that
vanished or is lost disappear by themselves because families are rebuilt per scrape.
Extra sources (alerts, burn results, health, DCGM names) give their families inside each
scrape, each timed and guarded: one that fails is logged and reported by
``gpumon_collector_success 0``, and the scrape still answers 200 with everything else.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumon import __version__
from gpumon.collect.store import SnapshotStore
from gpumon.exposition import gzip_parts
from gpumon.exposition.gpu_families import GpuFamilies
from gpumon.exposition.openmetrics import EOF as OPENMETRICS_EOF
from gpumon.exposition.rendered import OPENMETRICS, TEXT, Rendered, RenderedSnapshot, render_text
from gpumon.exposition.text import Heads, render
from gpumon.model.families import Family, FamilySource
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import Snapshot, Tier

if TYPE_CHECKING:
    from prometheus_client.core import Metric

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelfStats:
    """Daemon figures that are not part of a snapshot."""

    poll_skipped_total: int = 0
    """Scheduled polls that did not run (one was still running, or it could not start in time)."""
    config_last_reload_successful: bool = True
    """Whether the last configuration reload (SIGHUP) was applied; True at start."""
    config_last_reload_success_timestamp_seconds: float = 0.0
    """Unix time the running configuration was loaded (start-up or the last good reload)."""
    http_connections_open: int = 0
    """Connections the exporter holds open now."""
    http_connections_shed_total: int = 0
    """Connections closed to stay under the connection limit (idle ones evicted or new ones refused)."""
    kernel_log_xids_total: int | None = None
    """XIDs read from the kernel log (the backfill since boot, then each as written); None while it is
    not followed (simulated GPUs, ``kernel_log: false``, nothing readable): no sample then."""


def _daemon_counters(stats: SelfStats) -> list[Family]:
    """The exporter's connections and the kernel log's XIDs: gpumon_http_connections_open,
    gpumon_http_connections_shed_total and gpumon_kernel_log_xids_total."""
    open_now = Family("gpumon_http_connections_open", "gauge", "Connections the exporter holds open now.")
    open_now.add([], float(stats.http_connections_open))
    shed = Family(
        "gpumon_http_connections_shed_total",
        "counter",
        "Connections the exporter closed to stay under its connection limit (idle ones evicted or new ones refused).",
    )
    shed.add([], float(stats.http_connections_shed_total))
    if stats.kernel_log_xids_total is None:
        return [open_now, shed]
    xids = Family(
        "gpumon_kernel_log_xids_total",
        "counter",
        "XIDs read from the kernel log: those since boot when gpumon started, then each as it is written.",
    )
    xids.add([], float(stats.kernel_log_xids_total))
    return [open_now, shed, xids]


def _same(a: Family, b: Family) -> bool:
    """Whether two families render to the same text."""
    return (
        a.samples == b.samples
        and a.name == b.name
        and a.kind == b.kind
        and a.help == b.help
        and a.label_names == b.label_names
        and a.plain_labels == b.plain_labels
        and a.optional_labels == b.optional_labels
    )


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
        self._extra = list(extra)
        self._per_snapshot: set[str] = set()
        self._version = version
        self._python_version = python_version or platform.python_version()
        self._lock = threading.Lock()
        self._newest: RenderedSnapshot | None = None
        """The newest snapshot whose per-GPU families are rendered."""
        self._prepared: Snapshot | None = None
        """The last snapshot ``prepare`` was called with (None: no store listener, never render ahead)."""
        self._rendering: Snapshot | None = None
        """The snapshot ``prepare`` renders ahead of the scrapes right now."""
        self._extra_seen: dict[str, Family] = {}
        """The extra sources' families of the last scrape, by name (their text, once rendered, is reused)."""
        self._text_heads: Heads = {}
        """The HELP and TYPE lines and templates of the head's and tail's families, made anew every scrape."""
        self._extras_rendered: tuple[Rendered, list[tuple[str, float, float]]] | None = None
        """The extra sources' families of the last scrape and their bytes, and the sources' timings."""

    def set_options(self, intervals: PollIntervals, *, processes: bool, detail: frozenset[str] | None = None) -> None:
        """New intervals (for HELP texts), per-process and detail (``exporter.detail``) opt-ins after a reload."""
        self._intervals = intervals
        self._processes = processes
        self._gpu.set_options(intervals, processes=processes, detail=detail)
        if detail is not None:
            self._detail = detail  # a snapshot rendered with other opt-ins is rendered again

    def add(self, name: str, source: FamilySource, *, per_snapshot: bool = False) -> None:
        """Take ``source``'s families in every scrape, guarded and timed as ``name``.
        ``per_snapshot``: the source builds its families once per snapshot (and reuses them for
        later scrapes of it); ``prepare`` then asks it ahead of the scrapes when it renders ahead."""
        self._extra.append((name, source))
        if per_snapshot:
            self._per_snapshot.add(name)

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
        head = self._head_families(None if rendered is None else rendered.snapshot)
        timings = [("gpumon", 1.0, self._mono() - start)]
        if previous and last is not None:
            extras = last[0]  # as the last scrape got them, before the polling thread's listeners ran
            timings += last[1]
        else:
            extra = self._extra_families(timings)
            extras = last[0] if last is not None and last[0].holds(extra) else Rendered(extra)
            self._extras_rendered = (extras, timings[1:])
        openmetrics = fmt == OPENMETRICS
        head_bytes = render_text(head, fmt, self._text_heads).encode()
        tail_bytes = (
            render_text(self._meta(timings), fmt, self._text_heads) + (OPENMETRICS_EOF if openmetrics else "")
        ).encode()
        if rendered is not None:
            rendered.served.add((fmt, gzip))
        blocks = [extras] if rendered is None else [rendered, extras]
        if gzip:
            parts = [gzip_parts.stored(head_bytes), *(b.part(fmt) for b in blocks), gzip_parts.stored(tail_bytes)]
            return gzip_parts.member(parts)
        return [head_bytes, *(b.block(fmt) for b in blocks), tail_bytes]

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
        out += self._extra_families(timings)
        return out + self._meta(timings)

    def _extra_families(self, timings: list[tuple[str, float, float]]) -> list[Family]:
        """Every extra source's families, each timed and guarded (its timing appended to ``timings``)."""
        out: list[Family] = []
        for name, source in self._extra:
            start = self._mono()
            try:
                families = list(source.families())
                ok = 1.0
            except Exception:
                log.exception("collector %s failed; its metrics are left out of this scrape", name)
                families, ok = [], 0.0
            timings.append((name, ok, self._mono() - start))
            out.extend(self._reused(families))
        return out

    def _reused(self, families: list[Family]) -> list[Family]:
        """``families`` with each one not yet rendered replaced by the family of that name the
        previous scrape gave, when it holds the same samples: its text is reused."""
        seen = self._extra_seen
        for i, family in enumerate(families):
            if family.rendered is not None or family.rendered_openmetrics is not None:
                continue  # the source keeps its families' text itself
            before = seen.get(family.name)
            if before is not None and _same(before, family):
                families[i] = before
            else:
                seen[family.name] = family
        return families

    def _meta(self, timings: list[tuple[str, float, float]]) -> list[Family]:
        success = Family(
            "gpumon_collector_success",
            "gauge",
            "1 when the named collector ran without error in this scrape.",
            ("collector",),
        )
        duration = Family(
            "gpumon_collector_duration_seconds",
            "gauge",
            "Time the named collector took in this scrape, seconds.",
            ("collector",),
        )
        for name, ok, seconds in timings:
            success.add([name], ok)
            duration.add([name], seconds)
        return [success, duration]

    # ------------------------------------------------------------------
    def own_families(self) -> list[Family]:
        """gpumon's own families for the latest snapshot."""
        snapshot = self._store.latest()
        out = self._head_families(snapshot)
        if snapshot is not None:
            out += self._gpu.of(snapshot)
        return out

    def _head_families(self, snapshot: Snapshot | None) -> list[Family]:
        """gpumon's own families before the per-GPU ones, for ``snapshot``."""
        build = Family(
            "gpumon_build_info", "gauge", "gpumon version and Python version; always 1.", ("version", "python_version")
        )
        build.add([self._version, self._python_version], 1.0)
        nvml_up = Family("gpumon_nvml_up", "gauge", "1 when NVML is loaded and answering.")
        nvml_up.add([], 1.0 if snapshot is not None and snapshot.nvml_up else 0.0)
        stats = self._self_stats()
        skipped = Family(
            "gpumon_poll_skipped_total",
            "counter",
            "Scheduled polls that did not run: the previous poll was still running (a slow or hung backend read), "
            "or the poll could not start in time (the host was suspended or short of CPU).",
        )
        skipped.add([], float(stats.poll_skipped_total))
        reload_ok = Family(
            "gpumon_config_last_reload_successful",
            "gauge",
            "1 when the last configuration reload (SIGHUP) was applied, 0 when it was rejected and the running "
            "configuration kept.",
        )
        reload_ok.add([], 1.0 if stats.config_last_reload_successful else 0.0)
        reload_at = Family(
            "gpumon_config_last_reload_success_timestamp_seconds",
            "gauge",
            "Unix time the running configuration was loaded (start-up or the last successful reload).",
        )
        reload_at.add([], stats.config_last_reload_success_timestamp_seconds)
        out = [build, nvml_up, skipped, reload_ok, reload_at, *_daemon_counters(stats)]
        if snapshot is not None:
            out += self._self_metrics(snapshot)
            out += self._host_metrics(snapshot)
        return out

    def _self_metrics(self, snapshot: Snapshot) -> list[Family]:
        age = Family(
            "gpumon_snapshot_age_seconds",
            "gauge",
            "Seconds since the snapshot these metrics come from was taken; grows while a poll hangs.",
        )
        age.add([], max(0.0, self._mono() - snapshot.monotonic_seconds))
        taken = Family("gpumon_snapshot_timestamp_seconds", "gauge", "Unix time the served snapshot was taken.")
        taken.add([], snapshot.timestamp_seconds)
        duration = Family(
            "gpumon_poll_duration_seconds",
            "gauge",
            "Time the last read of a tier took over all GPUs, seconds (a poll of the fast tier alone is timed whole).",
            ("tier",),
        )
        errors = Family(
            "gpumon_poll_errors_total", "counter", "Failed backend reads by tier since the daemon started.", ("tier",)
        )
        last = Family("gpumon_last_poll_timestamp_seconds", "gauge", "Unix time a tier was last read.", ("tier",))
        for tier in sorted(snapshot.tiers):
            stats = snapshot.tiers[tier]
            duration.add([tier], stats.duration_seconds)
            errors.add([tier], float(stats.errors_total))
            last.add([tier], stats.last_timestamp_seconds)
        return [age, taken, duration, errors, last]

    def _host_metrics(self, snapshot: Snapshot) -> list[Family]:
        out = []
        host = snapshot.host
        for name, value, doc in (
            ("gpumon_host_cpu_utilization_ratio", host.cpu_utilization_ratio, "Host CPU busy share, 0-1 (psutil)."),
            ("gpumon_host_memory_used_bytes", host.memory_used_bytes, "Host memory in use, bytes (psutil)."),
            ("gpumon_host_memory_total_bytes", host.memory_total_bytes, "Host memory, bytes (psutil)."),
        ):
            if value is not None:
                family = Family(name, "gauge", doc)
                family.add([], float(value))
                out.append(family)
        if snapshot.nvml_up:
            count = Family("gpumon_gpus", "gauge", "GPUs NVML reports on this host.")
            count.add([], float(len(snapshot.gpus)))
            out.append(count)
        return out

    def prepare(self, snapshot: Snapshot) -> None:
        """Store listener: right after a slow or static read, render those tiers' families on the
        polling thread (once per read, as the first scrape after it would), so no scrape waits for
        them. A poll of the fast tier alone costs a few key comparisons here.

        When a scrape served the snapshot rendered last, scrapes come at least once a poll: then
        every per-GPU family of ``snapshot`` is rendered here too, with the bytes (formats, gzip)
        those scrapes asked for, work the first scrape of ``snapshot`` would do; a scrape that
        comes meanwhile serves the snapshot before (see ``body``). Nothing is rendered ahead
        when no scrape came since the last snapshot rendered."""
        self._gpu.prepare_slower(snapshot)
        options = (self._intervals, self._processes, self._detail)
        with self._lock:
            self._prepared = snapshot
            newest = self._newest
            if newest is None or not newest.served or newest.options != options or newest.snapshot is snapshot:
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
            for name, source in self._extra:
                if name in self._per_snapshot:
                    self._warm(name, source)
            self._keep(rendered)  # scrapes serve it from now on, its bytes made
        finally:
            with self._lock:
                if self._rendering is snapshot:
                    self._rendering = None

    @staticmethod
    def _warm(name: str, source: FamilySource) -> None:
        """Have a per-snapshot source build its families of the latest snapshot."""
        try:
            for _family in source.families():
                pass
        except Exception:  # the scrape that asks it next logs it and reports the failure
            log.debug("collector %s failed ahead of a scrape", name, exc_info=True)

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
                if newest.snapshot is latest:
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
            if newest is not None and newest.snapshot is snapshot and newest.families is families:
                return newest
        return self._keep(RenderedSnapshot(snapshot, (self._intervals, self._processes, self._detail), families))

    def _keep(self, rendered: RenderedSnapshot) -> RenderedSnapshot:
        """Keep ``rendered`` as the newest, unless one of the same or a newer snapshot is kept already
        (returned then)."""
        with self._lock:
            newest = self._newest
            if newest is not None and newest.snapshot is rendered.snapshot and newest.options == rendered.options:
                return newest
            if newest is None or newest.snapshot.monotonic_seconds <= rendered.snapshot.monotonic_seconds:
                self._newest = rendered
            return rendered
