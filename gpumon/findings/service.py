"""The health verdict over time: owns the XID lifecycle and the inventory baseline under the state dir.

The daemon feeds it every snapshot and XID event; ``gpumon health`` without a daemon feeds it one
poll. Files (``STATE_DIR/health/``, atomic writes): ``inventory.json`` (the baseline),
``xid.json`` (open faults, recent XIDs, boot id), ``clears.json`` (operator clears, with reason).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from gpumon.alerts.burn_marker import BurnMarkerReader
from gpumon.events.catalog import XidCatalog
from gpumon.events.model import XidEvent
from gpumon.exporter.text import Family
from gpumon.findings.burn_results import burn_findings
from gpumon.findings.config import HealthConfig
from gpumon.findings.gpu_state import snapshot_findings
from gpumon.findings.inventory import Inventory, complete, drift, drift_inputs, inventory_of, pci_gpus
from gpumon.findings.model import Finding, HealthReport, verdict
from gpumon.findings.stragglers import Deviation, StragglerDetector
from gpumon.findings.trends import Increase, TrendTracker
from gpumon.findings.xid_lifecycle import Clear, XidLifecycle, XidPolicy
from gpumon.same import same_objects
from gpumon.snapshot import Snapshot
from gpumon.state.burn_files import LAST_NAME, burn_dir
from gpumon.state.files import health_dir, read_json, write_json

log = logging.getLogger(__name__)

PCI_RESCAN_SECONDS = 30.0
REPORT_REUSE_SECONDS = 1.0
"""How long the scrape may reuse an unchanged health report (the default poll interval)."""
STATUS_VALUES = {"OK": 0, "WARNING": 1, "CRITICAL": 2, "UNKNOWN": 3}
"""Nagios' numbers, used for exit codes and the ``gpumon_health_status`` series."""


def read_boot_id(path: Path) -> str | None:
    """The kernel's boot id (changes at every boot), or None when unreadable."""
    try:
        return path.read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def read_clears(state_dir: Path) -> list[Clear]:
    raw = read_json(health_dir(state_dir) / "clears.json")
    out = []
    for entry in raw if isinstance(raw, list) else []:
        try:
            out.append(Clear.from_json(entry))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def add_clear(state_dir: Path, clear: Clear) -> None:
    """Record an operator clear (kept: the list is the audit trail)."""
    path = health_dir(state_dir) / "clears.json"
    raw = read_json(path)
    entries = raw if isinstance(raw, list) else []
    entries.append(clear.to_json())
    write_json(path, entries)


def save_inventory(state_dir: Path, inventory: Inventory) -> None:
    write_json(health_dir(state_dir) / "inventory.json", inventory.to_json())


def load_inventory(state_dir: Path) -> Inventory | None:
    return Inventory.from_json(read_json(health_dir(state_dir) / "inventory.json"))


class HealthService:
    """Thread-safe: the poller, the XID thread and HTTP requests call it."""

    def __init__(
        self,
        state_dir: Path,
        catalog: XidCatalog,
        config: HealthConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        simulated: bool = False,
    ) -> None:
        """``simulated``: the GPUs are the fake backend's, so the host's PCI bus is not theirs."""
        self.state_dir = Path(state_dir)
        self._clears_path = health_dir(self.state_dir) / "clears.json"
        self._inventory_path = health_dir(self.state_dir) / "inventory.json"
        self._burn_results_path = burn_dir(self.state_dir) / LAST_NAME
        """The files a report reads, whose stat keys decide whether a cached report still holds."""
        self.config = config or HealthConfig()
        self._sysfs = self.config.sysfs_root or (None if simulated else Path("/sys"))
        self._monotonic = monotonic
        self._pci_cache: tuple[float, list[str]] | None = None
        self._drift_cache: tuple[tuple[object, ...], list[Finding]] | None = None
        """(baseline, PCI scan, expected count, ``drift_inputs`` of the snapshot) and the drift they give."""
        self._clock = clock
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self.lifecycle = XidLifecycle(
            catalog,
            XidPolicy(
                escalations=self.config.xid_escalation,
                defer_window_seconds=self.config.defer_window_seconds,
                transient_window_seconds=self.config.transient_window_seconds,
            ),
        )
        self.lifecycle.load(read_json(self._xid_path))
        self.baseline = load_inventory(self.state_dir)
        self._baseline_mtime = self._inventory_mtime()
        self.stragglers = StragglerDetector(self.config.stragglers)
        self.trends = TrendTracker(self.config.trends, words=lambda code: self._xid_name(catalog, code))
        self._burn = BurnMarkerReader(self.state_dir)
        self._boot_id = read_boot_id(self.config.boot_id_path)
        """Read once: it changes only at a reboot, which also restarts this process."""
        self._generation = 0
        """Bumped by every input (snapshot, XID, accepted inventory): a cached report is then stale."""
        self._report_cache: tuple[tuple[object, ...], float, HealthReport] | None = None
        self._clears_read: tuple[object, list[Clear]] | None = None
        """The clears file's stat key when it was last read, and its clears."""
        self._burn_read: tuple[object, list[Clear], list[Finding]] | None = None
        """The burn results file's stat key and the clears when it was last read, and its findings."""

    @staticmethod
    def _xid_name(catalog: XidCatalog, code: str) -> str:
        try:
            return catalog.lookup(int(code)).meaning
        except (ValueError, AttributeError):
            return ""

    @property
    def _xid_path(self) -> Path:
        return health_dir(self.state_dir) / "xid.json"

    # ---- inputs ------------------------------------------------------------
    def on_xid(self, event: XidEvent) -> None:
        with self._lock:
            self._generation += 1
            self.lifecycle.record(event)
            self._save()

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Store subscriber: never raises into the poller."""
        try:
            self._on_snapshot(snapshot)
        except Exception:
            log.exception("health: cannot take the snapshot into account")

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        with self._lock:
            self._generation += 1
            self._snapshot = snapshot
            self.stragglers.observe(snapshot, burning=self._burn.read() is not None)
            self.trends.observe(snapshot)
            self.lifecycle.observe(snapshot, self._boot_id)
            if self.baseline is None and complete(snapshot):
                self.baseline = inventory_of(snapshot, self._clock())
                self._write_baseline()
                log.info("recorded the inventory baseline: %d GPU(s)", len(snapshot.gpus))
            self._save()

    def accept_inventory(self) -> Inventory | None:
        """Make the latest snapshot the baseline; None when there is no usable snapshot."""
        with self._lock:
            if self._snapshot is None or not self._snapshot.nvml_up:
                return None
            self._generation += 1
            self.baseline = inventory_of(self._snapshot, self._clock(), source="accepted")
            self._write_baseline()
            return self.baseline

    # ---- output ------------------------------------------------------------
    def report(self, source: str = "daemon", extra: Sequence[Finding] = ()) -> HealthReport:
        """The verdict now; ``extra`` findings come from the caller (e.g. a poll that hung)."""
        now = self._clock()
        with self._lock:
            self._reload_baseline()
            clears = self._clears()
            self.lifecycle.apply_clears(clears)
            snapshot = self._snapshot
            findings = [*extra, *self.lifecycle.findings(now)]  # first: an XID names a fault best
            findings += snapshot_findings(snapshot) if snapshot is not None or not extra else []
            findings += self._burn_findings(clears)
            if self._burn.read() is None:  # a burn makes its GPUs unequal on purpose
                findings += self.stragglers.findings(now)
            findings += self.trends.findings(now)
            if snapshot is not None:
                findings += self._drift(snapshot)
            self._save()
        gpus = [(g.index, g.uuid) for g in snapshot.gpus] if snapshot is not None else []
        return verdict(findings, gpus, now, source)

    def current_report(self) -> HealthReport:
        """report(), reused while nothing it reads changed: the same snapshot, no XID or accepted
        inventory since, the same clears, baseline and burn files, the same burn marker, and less
        than REPORT_REUSE_SECONDS old (so what only time changes, such as an XID leaving its
        window, is late by at most that). Scrapes ask for it every few seconds, the poll's
        snapshot changes once an interval."""
        key = self._report_key()
        now = self._monotonic()
        cached = self._report_cache
        if (
            cached is not None
            and now - cached[1] < REPORT_REUSE_SECONDS
            and len(cached[0]) == len(key)
            and all(a is b or a == b for a, b in zip(cached[0], key, strict=True))
        ):
            return cached[2]
        report = self.report()
        self._report_cache = (key, now, report)  # the key read before: an input arriving meanwhile is not lost
        return report

    def _report_key(self) -> tuple[object, ...]:
        """What report() reads besides the clock: compared by identity (the snapshot, the burn
        marker) or by value (the generation, the files' stat keys)."""
        with self._lock:
            snapshot, generation = self._snapshot, self._generation
        return (
            snapshot,
            generation,
            _stat_key(self._clears_path),
            _stat_key(self._inventory_path),
            _stat_key(self._burn_results_path),
            self._burn.read(),
        )

    def signals(self) -> tuple[list[Deviation], list[Increase]]:
        """The stragglers' deviations and the error counters' increases now (for the exported series)."""
        now = self._clock()
        with self._lock:
            return self.stragglers.deviations(now), self.trends.increases(now)

    def collector(self) -> HealthCollector:
        return HealthCollector(self)

    # ---- helpers -----------------------------------------------------------
    def _save(self) -> None:
        if not self.lifecycle.changed:
            return
        try:
            write_json(self._xid_path, self.lifecycle.to_json())
            self.lifecycle.changed = False
        except OSError as exc:
            log.error("cannot write the XID lifecycle state %s: %s", self._xid_path, exc)

    def _write_baseline(self) -> None:
        if self.baseline is None:
            return
        try:
            save_inventory(self.state_dir, self.baseline)
        except OSError as exc:
            log.error("cannot write the inventory baseline: %s", exc)
        self._baseline_mtime = self._inventory_mtime()

    def _drift(self, snapshot: Snapshot) -> list[Finding]:
        """drift() of the baseline and ``snapshot``, worked out again only when the baseline, the PCI scan or
        what drift reads of the snapshot changed (every scrape and the alert timer ask for the report; a
        new snapshot comes every poll, yet its identity, links and PCIe widths rarely change)."""
        pci = self._pci_gpus()
        key = (self.baseline, pci, self.config.expected_gpu_count, drift_inputs(snapshot))
        cached = self._drift_cache
        if (
            cached is not None
            and cached[0][0] is key[0]
            and cached[0][1] is key[1]
            and cached[0][2] == key[2]
            and cached[0][3] == key[3]
        ):
            return cached[1]
        found = drift(self.baseline, snapshot, pci, self.config.expected_gpu_count)
        self._drift_cache = (key, found)
        return found

    def _clears(self) -> list[Clear]:
        """The operator clears, read again only when their file changed (a report is made every poll)."""
        key = _stat_key(self._clears_path)
        kept = self._clears_read
        if kept is None or kept[0] != key:
            kept = self._clears_read = (key, read_clears(self.state_dir))
        return kept[1]

    def _burn_findings(self, clears: list[Clear]) -> list[Finding]:
        """The last burn's findings, worked out again only when its results file or the clears changed."""
        key = _stat_key(self._burn_results_path)
        kept = self._burn_read
        if kept is None or kept[0] != key or kept[1] is not clears:
            kept = self._burn_read = (key, clears, burn_findings(self.state_dir, clears))
        return kept[2]

    def _pci_gpus(self) -> list[str] | None:
        """NVIDIA GPUs on the PCI bus, re-read from sysfs at most every PCI_RESCAN_SECONDS (scrapes are frequent)."""
        if self._sysfs is None:
            return None
        now = self._monotonic()
        if self._pci_cache is None or now - self._pci_cache[0] >= PCI_RESCAN_SECONDS:
            self._pci_cache = (now, pci_gpus(self._sysfs))
        return self._pci_cache[1]

    def _inventory_mtime(self) -> float | None:
        try:
            return self._inventory_path.stat().st_mtime
        except OSError:
            return None

    def _reload_baseline(self) -> None:
        """Pick up a baseline accepted by another process (gpumon health accept-inventory)."""
        mtime = self._inventory_mtime()
        if mtime is not None and mtime != self._baseline_mtime:
            self.baseline = load_inventory(self.state_dir) or self.baseline
            self._baseline_mtime = mtime


def _stat_key(path: Path) -> tuple[int, int, int] | None:
    """(inode, mtime in ns, size) of ``path``, None when absent: changes when the file is rewritten."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class HealthCollector:
    """``gpumon_health_status`` per GPU and ``gpumon_node_health_status``, with action and reason labels."""

    def __init__(self, service: HealthService) -> None:
        self._service = service
        self._built: tuple[HealthReport, list[Family]] | None = None
        self._signals_built: tuple[list[Deviation], list[Increase], list[Family]] | None = None
        """The deviations and increases the signal families were last built of, and those families."""

    def families(self) -> Iterator[Family]:
        report = self._service.current_report()
        if self._built is None or self._built[0] is not report:
            self._built = (report, list(self._report_families(report)))
        yield from self._built[1]
        deviations, increases = self._service.signals()
        built = self._signals_built
        if built is None or not (same_objects(built[0], deviations) and same_objects(built[1], increases)):
            built = self._signals_built = (deviations, increases, list(self._signal_families(deviations, increases)))
        yield from built[2]  # the engines keep their results while nothing changed: so are these families

    @staticmethod
    def _report_families(report: HealthReport) -> Iterator[Family]:
        help_values = "0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (as gpumon health's exit code)"
        node = Family(
            "gpumon_node_health_status",
            "gauge",
            f"Node health verdict: {help_values}; action and reason of the worst finding.",
            ("action", "reason"),
        )
        node.add([report.action, report.reason()], STATUS_VALUES[report.status])
        yield node
        gpu = Family(
            "gpumon_health_status",
            "gauge",
            f"GPU health verdict: {help_values}; action and reason of its worst finding.",
            ("gpu", "uuid", "action", "reason"),
        )
        for g in report.gpus:
            gpu.add([str(g.index), g.uuid or "", g.action, g.reason], STATUS_VALUES[g.status])
        yield gpu
        findings = Family(
            "gpumon_health_findings",
            "gauge",
            "Health findings now, by kind and severity.",
            ("kind", "severity"),
        )
        counts: dict[tuple[str, str], int] = {}
        for f in report.findings:
            counts[(f.kind, f.severity)] = counts.get((f.kind, f.severity), 0) + 1
        for (kind, severity), n in sorted(counts.items()):
            findings.add([kind, severity], n)
        yield findings

    @staticmethod
    def _signal_families(deviations: list[Deviation], increases: list[Increase]) -> Iterator[Family]:
        deviation = Family(
            "gpumon_straggler_deviation_ratio",
            "gauge",
            "A busy GPU's mean deviation from the median of its same-model peers over the straggler window, "
            "by signal (sm_clock, compute_share, power, sm_active, tensor_active); -0.12 is 12 % below.",
            ("gpu", "uuid", "signal"),
        )
        for d in deviations:
            deviation.add([str(d.index), d.uuid, d.signal], d.ratio)
        yield deviation
        increase = Family(
            "gpumon_error_trend_increase",
            "gauge",
            "How much an error counter rose within its trend window (window_seconds label), resets "
            "counted as counters, only while above 0; counter is ecc_corrected, remapped_rows, retired_pages, pcie_replays, "
            "nvlink_replay, nvlink_recovery, nvlink_crc or xid (with its code).",
            ("gpu", "uuid", "counter", "xid", "window_seconds"),
        )
        for i in increases:
            if i.increase:  # a counter that did not rise is no series (the series budget, docs/benchmarks.md)
                increase.add([str(i.index), i.uuid, i.counter, i.label, f"{i.window_seconds:g}"], i.increase)
        yield increase
