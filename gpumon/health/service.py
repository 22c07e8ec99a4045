"""The health verdict over time: owns the XID lifecycle and the inventory baseline under the state dir.

The daemon feeds it every snapshot and XID event; ``gpumon health`` without a daemon feeds it one
poll. Files (``STATE_DIR/health/``, or ``STATE_DIR/simulated/<backend>/health/`` for simulated GPUs;
folders 0755, files 0644 whatever the umask, see gpumon.util.state.files): ``inventory.json`` (the
baseline), ``xid.json`` (open faults, recent XIDs, boot id), ``clears.d/`` (operator clears, one file
each, never rewritten: the audit trail; ``clears.json``, where an older gpumon wrote them, is still
read). Each read-modify-write holds ``.lock`` (gpumon.util.state.lock): runs that overlap lose nothing.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from gpumon.health.burn_results import burn_findings
from gpumon.health.clears import Clear
from gpumon.health.clears_watch import ClearsWatch
from gpumon.health.config import HealthConfig
from gpumon.health.detectors import Detectors
from gpumon.health.drift_check import DriftCheck
from gpumon.health.gpu_state import snapshot_findings
from gpumon.health.health_files import read_boot_id, set_aside
from gpumon.health.health_series import HealthCollector
from gpumon.health.inventory import Inventory, complete, inventory_of, missing_from_nvml
from gpumon.health.poll_watch import PollWatch
from gpumon.health.report_cache import ReportCache
from gpumon.health.report_inputs import ReportInputs
from gpumon.health.report_parts import (
    ALL_PARTS,
    BURN,
    CLEARS,
    CLEARS_READERS,
    DETECTORS,
    DRIFT,
    POLL,
    SET_ASIDE,
    SNAPSHOT,
    XID,
)
from gpumon.health.stragglers import Deviation
from gpumon.health.trends import Increase
from gpumon.health.xid_lifecycle import XidLifecycle, XidPolicy
from gpumon.model.findings import Finding, HealthReport, verdict
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid import XidEvent
from gpumon.model.xid_catalog import XidCatalog
from gpumon.state.burn_marker import BurnMarkerReader
from gpumon.state.burn_record import LAST_NAME, burn_dir
from gpumon.util.file_stamp import FileStamp
from gpumon.util.file_stamp import file_stamp as stat_key
from gpumon.util.repeat_log import RepeatLog
from gpumon.util.reuse import Reuse
from gpumon.util.state.files import (
    STATE_FILE_MODE,
    DamagedFile,
    health_dir,
    read_state_json,
    remove_stale_temporaries,
    write_json,
)
from gpumon.util.state.lock import state_lock

log = logging.getLogger(__name__)

_MAX_PENDING = 10_000


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
        simulated: bool | str = False,
        poll_watch: PollWatch | None = None,
        lock_wait_seconds: float = 30.0,
    ) -> None:
        """``simulated``: the GPUs are a simulated backend's (its spec, e.g. ``fake:xid-storm``; True: ``fake``):
        the host's PCI bus is not theirs, their state has a folder of its own (``_place``). ``poll_watch``: the
        daemon's poll (gpumon.health.poll_watch). ``lock_wait_seconds``: how long a save waits for the folder's
        lock; the daemon's 0 never waits (a gpumon health run holding it stalls no poll: saved at the next input)."""
        self._poll_watch = poll_watch
        self._lock_wait = lock_wait_seconds
        self.state_dir = Path(state_dir)
        spec = "fake" if simulated is True else (simulated or None)
        self._place(spec)
        self.config = config or HealthConfig()
        self._monotonic = monotonic
        self._drift_check = DriftCheck(
            self.config.sysfs_root or (None if spec is not None else Path("/sys")), monotonic
        )
        self._clock = clock
        self._writes = RepeatLog(log, clock=monotonic)  # failing writes: the first logged, then a summary
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._catalog = catalog
        self._set_aside: list[Finding] = []
        """State files found damaged and moved aside (shown as findings while this process runs)."""
        if self.folder.is_dir():  # what a writer killed mid-write left (no writer runs while the lock is held)
            with contextlib.suppress(TimeoutError), state_lock(self.folder, self._lock_wait):
                remove_stale_temporaries(self.folder, ("xid.json", "inventory.json"))
        self._xid_key = stat_key(self._xid_path)  # before the read: a write in between is merged at the next save
        self.lifecycle = self._new_lifecycle()
        self._pending: deque[tuple[bool, XidEvent]] = deque(maxlen=_MAX_PENDING)
        """XIDs taken in since the last save ((True, event) recorded, (False, event) a paired copy): what a save
        replays over the file when another process wrote it meanwhile."""
        self.baseline = self._load_baseline()
        self._baseline_stamp = stat_key(self._inventory_path)
        self._baseline_refused: str | None = None
        """Why the baseline was not recorded (said once per reason)."""
        self.detectors = Detectors.of(self.config, catalog)
        self._burn = BurnMarkerReader(self.state_dir)  # a burn running on the node's GPUs (alerts read it too)
        self._boot_id = read_boot_id(self.config.boot_id_path)  # it changes only at a reboot, which restarts us
        self._generation = 0
        """Bumped by every input (snapshot, XID, accepted inventory): a cached report is then stale."""
        self._burn_read: Reuse[list[Finding]] = Reuse()
        """The last burn's findings, of the very clears and the results file's stat key."""
        self._kept = ReportCache(self, monotonic)

    def _place(self, spec: str | None) -> None:
        """Where the files are: ``folder`` (``STATE_DIR/health``, or a simulated backend's own), the clears (a
        simulated backend's also in the node's folder: read, never written), whose burn results count
        (``burn_root``: gpumon.burn.command.burn_state_dir); their stat keys decide if a cached report holds."""
        self.folder = health_dir(self.state_dir, spec)
        if spec is not None:
            log.info("simulated GPUs (%s): health state in %s, apart from the node's own", spec, self.folder)
        self._clears_watch = ClearsWatch([self.folder] + ([health_dir(self.state_dir)] if spec else []), log)
        self._inventory_path = self.folder / "inventory.json"
        self.burn_root = self.folder.parent if spec is not None else self.state_dir
        self._burn_results_path = burn_dir(self.burn_root) / LAST_NAME

    def _new_lifecycle(self) -> XidLifecycle:
        """The XID lifecycle as the file has it now."""
        lifecycle = XidLifecycle(
            self._catalog,
            XidPolicy(
                escalations=self.config.xid_escalation,
                defer_window_seconds=self.config.defer_window_seconds,
                transient_window_seconds=self.config.transient_window_seconds,
            ),
        )
        raw = self._read_state(self._xid_path)
        try:
            lifecycle.load(raw)
        except ValueError as exc:
            self._damaged(self._xid_path, str(exc))
        return lifecycle

    def _load_baseline(self) -> Inventory | None:
        raw = self._read_state(self._inventory_path)
        baseline = Inventory.from_json(raw)
        if raw is not None and baseline is None:
            self._damaged(self._inventory_path, "not an inventory of this gpumon (a key or a type is wrong)")
        return baseline

    def _read_state(self, path: Path) -> object:
        """The JSON of a state file, None when absent, unreadable or damaged (then moved aside and said)."""
        try:
            return read_state_json(path)
        except DamagedFile as exc:
            self._damaged(path, str(exc))
        except OSError as exc:
            log.error("cannot read the health state %s: %s", path, exc.strerror or exc)
        return None

    def _damaged(self, path: Path, why: str) -> None:
        """Move a damaged state file aside (kept for the operator), say so once, show it as a finding."""
        self._set_aside.append(set_aside(path, why, self._clock(), log))

    @property
    def report_files(self) -> tuple[list[Path], Path, Path, BurnMarkerReader]:
        """What a report reads from disk, whose stamps it is kept by: the clears' files and folders
        (gpumon.health.clears_watch), the baseline, the last burn's results, and the burn marker's reader."""
        return self._clears_watch.paths, self._inventory_path, self._burn_results_path, self._burn

    @property
    def _xid_path(self) -> Path:
        return self.folder / "xid.json"

    # ---- inputs ------------------------------------------------------------
    def on_xid(self, event: XidEvent) -> None:
        """Take an XID in. Written at once when the verdict changed (a fault opened or rose, a first XID of a
        code on a GPU); a repeat of a known fault (an XID storm) is written with the next poll or report."""
        with self._lock:
            self._generation += 1
            self.lifecycle.record(event, self._boot_id)
            self._pending.append((True, event))
            if self.lifecycle.urgent:
                self._save()

    def on_xid_paired(self, event: XidEvent) -> None:
        """The other source's copy of a counted XID (``XidTracker.subscribe_paired``): remembered as seen."""
        with self._lock:
            self.lifecycle.note_seen(event, self._boot_id)
            self._pending.append((False, event))

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
            self.detectors.take(snapshot, burning=self._burn.read() is not None)  # observed when next asked
            self.lifecycle.observe(snapshot, self._boot_id)
            if self.baseline is None and complete(snapshot):
                self._record_baseline(snapshot)
            self._save()

    def _record_baseline(self, snapshot: Snapshot) -> None:
        """The first complete snapshot becomes the baseline, unless a GPU on the PCI bus is missing from it
        (then a baseline would call the broken host normal: said once, recorded once all are seen)."""
        missing = missing_from_nvml(snapshot, self._drift_check.pci_gpus())
        if missing:
            why = ", ".join(missing)
            if why != self._baseline_refused:
                log.warning(
                    "not recording the inventory baseline: %d NVIDIA GPU(s) on the PCI bus, NVML lists %d "
                    "(missing: %s); recorded once NVML lists them all (or: gpumon health accept-inventory)",
                    len(snapshot.gpus) + len(missing),
                    len(snapshot.gpus),
                    why,
                )
                self._baseline_refused = why
            return
        try:
            with state_lock(self.folder, self._lock_wait):
                self._reload_baseline(stat_key(self._inventory_path))  # another run may have recorded it meanwhile
                if self.baseline is None:
                    self.baseline = inventory_of(snapshot, self._clock())
                    if self._write_baseline():  # else the failure was said (once, then summed up)
                        log.info("recorded the inventory baseline: %d GPU(s)", len(snapshot.gpus))
            self._writes.succeeded(f"saving the inventory baseline in {self.folder}")
        except (OSError, TimeoutError) as exc:
            self._not_saved("the inventory baseline", exc)

    def accept_inventory(self) -> Inventory | None:
        """Make the latest snapshot the baseline; None when there is no usable snapshot."""
        with self._lock:
            if self._snapshot is None or not self._snapshot.nvml_up:
                return None
            self._generation += 1
            self.baseline = inventory_of(self._snapshot, self._clock(), source="accepted")
            with state_lock(self.folder):
                self._write_baseline()
            return self.baseline

    # ---- output ------------------------------------------------------------
    def report(
        self, source: str = "daemon", extra: Sequence[Finding] = (), *, inputs: ReportInputs | None = None
    ) -> HealthReport:
        """The verdict now; ``extra`` findings come from the caller (e.g. a poll that hung); ``inputs``: the
        files' stamps and burn marker the caller just took (``current_report``), taken here when None."""
        inputs = self._kept.inputs(self._generation) if inputs is None else inputs
        now = self._clock()
        snapshot, findings = self._findings(ALL_PARTS, inputs, now, extra)
        gpus = [(g.index, g.uuid) for g in snapshot.gpus] if snapshot is not None else []
        return verdict(findings, gpus, now, source)

    def _findings(
        self, parts: frozenset[str], inputs: ReportInputs, now: float, extra: Sequence[Finding] = ()
    ) -> tuple[Snapshot | None, list[Finding]]:
        """The snapshot and the findings of the report's ``parts`` (gpumon.health.report_parts) at ``now``."""
        with self._lock:
            if DRIFT in parts:
                self._reload_baseline(inputs.inventory)
            clears = self._clears_watch.clears(inputs.clears) if parts & CLEARS_READERS else []
            if XID in parts:
                self.lifecycle.apply_clears(clears)
            snapshot = self._snapshot
            findings = list(extra)
            if POLL in parts and self._poll_watch is not None:
                findings += self._poll_watch.findings(snapshot)
            findings += self.lifecycle.findings(now) if XID in parts else []  # first: an XID names a fault best
            findings += snapshot_findings(snapshot) if SNAPSHOT in parts and (snapshot is not None or not extra) else []
            findings += self._burn_findings(clears, inputs.burn_results) if BURN in parts else []
            findings += self._clears_watch.findings() if CLEARS in parts else []
            findings += self._set_aside if SET_ASIDE in parts else []
            if parts & DETECTORS:
                findings += self.detectors.findings(now, burning=inputs.burn is not None, parts=parts)
            if DRIFT in parts and snapshot is not None:
                findings += self._drift_check.drift(self.baseline, snapshot, self.config.expected_gpu_count)
            self._save()
        return snapshot, findings

    def current_report(self) -> HealthReport:
        """report(), reused while nothing it reads changed (gpumon.health.report_cache)."""
        return self._kept.current()

    def findings_of(self, names: frozenset[str]) -> list[Finding]:
        """The findings of current_report() of the kinds ``names`` names (``*`` matches any text, as finding rules
        name them), in its order, with only the report's parts that can give such kinds worked out."""
        return self._kept.findings_of(names)

    def findings(self, parts: frozenset[str], inputs: ReportInputs) -> list[Finding]:
        """The findings of the report's ``parts`` now (gpumon.health.report_parts), unordered; ``inputs`` as for report()."""
        return self._findings(parts, inputs, self._clock())[1]

    def snapshot_now(self) -> tuple[Snapshot | None, int]:
        """The latest snapshot (the very object) and the input count, taken together."""
        with self._lock:
            return self._snapshot, self._generation

    def signals(self) -> tuple[list[Deviation], list[Increase]]:
        """The stragglers' deviations and the error counters' increases now (for the exported series)."""
        now = self._clock()
        with self._lock:
            return self.detectors.signals(now)

    def collector(self) -> HealthCollector:
        return HealthCollector(self)

    # ---- helpers -----------------------------------------------------------
    def _save(self) -> None:
        """Write the lifecycle, under the folder's lock: when another process wrote the file since this one
        read or wrote it (overlapping ``gpumon health`` runs), read it again and replay this one's XIDs over
        it first, so neither loses the other's."""
        if not self.lifecycle.changed:
            return
        try:
            with state_lock(self.folder, self._lock_wait):
                if stat_key(self._xid_path) != self._xid_key:
                    self._merge_from_file()
                write_json(self._xid_path, self.lifecycle.to_json(), mode=STATE_FILE_MODE)
                self._xid_key = stat_key(self._xid_path)
            self.lifecycle.changed = self.lifecycle.urgent = False
            self._pending.clear()
            self._writes.succeeded(f"saving the XID lifecycle state in {self.folder}")
        except (OSError, TimeoutError) as exc:
            self._not_saved("the XID lifecycle state", exc)

    def _not_saved(self, what: str, exc: Exception) -> None:
        """A save that failed; one the daemon did not wait for (another run holds the lock) is tried again."""
        if isinstance(exc, TimeoutError) and self._lock_wait == 0:
            log.debug("%s not saved now (%s); saved at the next input", what, exc)
        else:
            self._writes.failed(f"saving {what} in {self.folder}", str(exc))

    def _merge_from_file(self) -> None:
        """The lifecycle as the file has it, with this process's snapshot, XIDs and clears taken in again."""
        self._xid_key = stat_key(self._xid_path)
        lifecycle = self._new_lifecycle()
        if self._snapshot is not None:
            lifecycle.observe(self._snapshot, self._boot_id)
        for recorded, event in self._pending:
            if recorded:
                lifecycle.record(event, self._boot_id)
            else:
                lifecycle.note_seen(event, self._boot_id)
        clears = self._clears_watch.last_read()
        if clears is not None:
            lifecycle.apply_clears(clears)
        lifecycle.changed = True
        self.lifecycle = lifecycle

    def _write_baseline(self) -> bool:
        """Write the baseline (the caller holds the folder's lock); whether it was written (a failure is
        logged through the RepeatLog)."""
        if self.baseline is None:
            return False
        try:
            write_json(self._inventory_path, self.baseline.to_json(), mode=STATE_FILE_MODE)
            self._writes.succeeded(f"writing the inventory baseline {self._inventory_path}")
            return True
        except OSError as exc:
            self._writes.failed(f"writing the inventory baseline {self._inventory_path}", str(exc))
            return False
        finally:
            self._baseline_stamp = stat_key(self._inventory_path)

    def _burn_findings(self, clears: list[Clear], stamp: FileStamp | None) -> list[Finding]:
        """The last burn's findings, worked out again only when its results file (``stamp``) or the clears changed."""
        return self._burn_read.get(lambda: burn_findings(self.burn_root, clears), same=(clears,), equal=(stamp,))

    def _reload_baseline(self, stamp: FileStamp | None) -> None:
        """Pick up a baseline accepted by another process (gpumon health accept-inventory): the file's ``stamp``
        is another than when this one read or wrote it last."""
        if stamp is not None and stamp != self._baseline_stamp:
            self.baseline = self._load_baseline() or self.baseline
            self._baseline_stamp = stamp
