"""Counts of XID events per GPU and code, fed by the event thread and the kernel-log backfill.

The poller puts ``for_gpu``'s counts / last timestamps into ``GpuSnapshot.xid_errors_total``
and ``xid_last_timestamp_seconds`` (exported as ``gpumon_xid_errors_total`` — a
counter, repeats counted — and ``gpumon_xid_last_timestamp_seconds``).

No double counting. Two sources report XIDs: NVML's event thread (while NVML is up and
the GPU supports XID events) and the kernel log, followed from boot for as long as gpumon
runs (``KernelLogFollower``). An XID seen by both is counted once: an event is not
counted when an event of the *other* source, of the same GPU and code, within
``PAIR_WINDOW_SECONDS``, was counted and not yet paired; the two are then a pair. Pairing
is one to one, so a burst of n XIDs seen by both sources counts n, whichever source
reports first, and an XID only one source saw (before NVML came up, on a GPU without
NVML events, while NVML was down) is counted from that source.

Events that carry only a PCI bus id (kernel log) are matched to a GPU index through
the map given to ``set_gpus``. Events of a bus id no known GPU has are counted under
``None`` and logged; they move to the right GPU if a later ``set_gpus`` knows the bus.

Listeners: ``subscribe`` hears each counted event at once, its GPU filled in when known (the
alert engine). ``subscribe(..., attributed=True)`` hears each counted event once it has a GPU:
at once when the GPU is known, else when a later ``set_gpus`` maps its bus (the health verdict:
an XID read from the kernel log at start, before the first poll mapped the bus ids, reaches it
whatever the order). ``subscribe_paired`` hears the events not counted because they are the other
source's copy of a counted one, so their identity (``XidEvent.identity``) is known to be counted.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpumon.events.xid_log import XidLog
from gpumon.model.bus_id import normalize_bus_id
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid import XidEvent

_BUS_AND_INDEX = operator.attrgetter("pci_bus_id", "index")

log = logging.getLogger(__name__)

XidListener = Callable[[XidEvent], None]
_MAX_UNMATCHED = 10_000
PAIR_WINDOW_SECONDS = 10.0
"""An NVML event and a kernel-log line of the same GPU and code this close in time are one XID."""
_MAX_UNPAIRED = 256
"""Counted events kept per (source, code) for pairing."""


@dataclass
class _Seen:
    """A counted event, waiting for its twin from the other source."""

    keys: frozenset[tuple[str, object]]
    timestamp_seconds: float
    paired: bool = False


@dataclass
class _Counts:
    """One GPU's counts. ``add`` replaces both mappings, never changes them: ``for_gpu`` hands them out
    as they are (every poll, every GPU) and the snapshots that hold them keep what they saw."""

    totals: Mapping[str, int] = field(default_factory=dict)
    last: Mapping[str, float] = field(default_factory=dict)

    def add(self, event: XidEvent) -> None:
        key = str(event.xid)
        self.totals = {**self.totals, key: self.totals.get(key, 0) + 1}
        self.last = {**self.last, key: max(self.last.get(key, event.timestamp_seconds), event.timestamp_seconds)}


class XidTracker:
    """Thread-safe XID counts by GPU index (None: a GPU gpumon does not know) and code."""

    def __init__(
        self, live_since_seconds: float, logger: logging.Logger | None = None, xid_log: XidLog | None = None
    ) -> None:
        """``live_since_seconds``: Unix time the daemon started (earlier kernel-log XIDs are "since boot");
        ``xid_log``: the log lines of live XIDs, one per distinct fault (gpumon.events.xid_log)."""
        self._live_since = live_since_seconds
        self._log = logger or log
        self._xid_log = xid_log or XidLog(self._log)
        self._lock = threading.Lock()
        self._bus_to_index: dict[str, int] = {}
        self._by_gpu: dict[int | None, _Counts] = {}
        self._unmatched: list[XidEvent] = []
        self._listeners: list[XidListener] = []
        self._attributed_listeners: list[XidListener] = []
        self._paired_listeners: list[XidListener] = []
        self._seen: dict[tuple[str, int], deque[_Seen]] = {}
        """(source, code) -> recent counted events of that source, for pairing with the other source."""
        self._none = _Counts()
        """What ``for_gpu`` gives for a GPU without XIDs: the same empty mappings every time (never changed)."""
        self._said_buses: set[str] = set()
        """Bus ids whose XIDs were said to be on no GPU gpumon watches (said once GPUs are known, never before)."""
        self._last_snapshot_rows: tuple[tuple[str | None, int], ...] | None = None
        """(bus id, index) of each GPU of the last snapshot ``set_gpus_from_snapshot`` saw (polling thread only)."""

    # ---- inputs --------------------------------------------------------------
    def set_gpus(self, bus_to_index: Mapping[str, int]) -> None:
        """The GPUs known now, by PCI bus id (any common form) -> index. Re-homes unmatched events."""
        normalized: dict[str, int] = {}
        for bus, gpu in bus_to_index.items():
            key = normalize_bus_id(bus)
            if key is not None:
                normalized[key] = gpu
        rehomed: list[XidEvent] = []
        with self._lock:
            self._bus_to_index = normalized
            self._last_snapshot_rows = None
            still: list[XidEvent] = []
            for event in self._unmatched:
                match = normalized.get(event.pci_bus_id or "")
                if match is None:
                    still.append(event)
                else:
                    rehomed.append(dataclasses.replace(event, gpu_index=match))
                    self._by_gpu.setdefault(match, _Counts()).add(rehomed[-1])
            self._unmatched = still
            self._by_gpu.pop(None, None)
            for event in still:
                self._by_gpu.setdefault(None, _Counts()).add(event)
            listeners = list(self._attributed_listeners)
        for event in rehomed:  # counted before its GPU was known: those that wait for a GPU hear it now
            self._notify(listeners, event)
        if normalized:  # read before the first poll named the GPUs: said now, for those still on no GPU
            self._say_unmatched(still)

    def set_gpus_from_snapshot(self, snapshot: Snapshot) -> None:
        """``set_gpus`` from a snapshot's pci_bus_id of each GPU; a no-op when nothing changed.

        Fits ``SnapshotStore.subscribe``, so GPUs that appear after a late NVML start are learnt too.
        """
        self._xid_log.flush()  # every poll: the summaries of repeated XIDs that are due
        rows = tuple(map(_BUS_AND_INDEX, snapshot.gpus))  # in C: no dict made on every poll
        if rows == self._last_snapshot_rows:
            return  # every poll but the first: the same GPUs at the same bus ids
        mapping = {bus: index for bus, index in rows if bus}
        with self._lock:
            current = {bus: index for bus, index in self._bus_to_index.items()}
        if {normalize_bus_id(b): i for b, i in mapping.items()} != current:
            self.set_gpus(mapping)
        self._last_snapshot_rows = rows

    def subscribe(self, listener: XidListener, *, attributed: bool = False) -> None:
        """Call ``listener(event)`` for each counted event (GPU index filled in when known), e.g. the alert engine.

        ``attributed``: call it only with the GPU known: at once when it is, else when ``set_gpus`` maps the
        event's bus (an event on a bus no GPU ever has never reaches it)."""
        with self._lock:
            (self._attributed_listeners if attributed else self._listeners).append(listener)

    def subscribe_paired(self, listener: XidListener) -> None:
        """Call ``listener(event)`` for each event not counted because the other source's copy was."""
        with self._lock:
            self._paired_listeners.append(listener)

    def record(self, event: XidEvent) -> bool:
        """Count one event; False when it is a kernel-log copy of a live event (not counted)."""
        return self._record(event, warn_unmatched=True)

    def _record(self, event: XidEvent, warn_unmatched: bool) -> bool:
        bus = normalize_bus_id(event.pci_bus_id) if event.pci_bus_id else None
        with self._lock:
            index = event.gpu_index
            if index is None and bus is not None:
                index = self._bus_to_index.get(bus)
            attributed = dataclasses.replace(event, gpu_index=index, pci_bus_id=bus or event.pci_bus_id)
            keys = frozenset(k for k in (("gpu", index), ("bus", bus)) if k[1] is not None)
            twin = self._twin(event, keys)
            if twin is not None:
                twin.paired = True
                listeners = list(self._paired_listeners)
            else:
                self._seen.setdefault((event.source, event.xid), deque(maxlen=_MAX_UNPAIRED)).append(
                    _Seen(keys, event.timestamp_seconds)
                )
                self._by_gpu.setdefault(index, _Counts()).add(attributed)
                if index is None and len(self._unmatched) < _MAX_UNMATCHED:
                    self._unmatched.append(attributed)
                listeners = list(self._listeners) + (list(self._attributed_listeners) if index is not None else [])
        if twin is not None:
            self._log.debug(
                "XID %d from %s at %.3f is already counted from the other source",
                event.xid,
                event.source,
                event.timestamp_seconds,
            )
            self._notify(listeners, attributed)
            return False
        # live: one line per distinct fault (the backfill is said in one line by its reader); an XID on no GPU
        # before the GPUs are known is said by set_gpus
        if warn_unmatched and (index is not None or self._bus_to_index):
            where = (
                f"GPU {index}"
                if index is not None
                else f"PCI {bus or '(no bus id)'}, which is none of the GPUs gpumon watches; counted without a GPU"
            )
            self._xid_log.note(attributed, where, event.message or "")
        self._notify(listeners, attributed)
        return True

    def _notify(self, listeners: list[XidListener], event: XidEvent) -> None:
        for listener in listeners:
            try:
                listener(event)
            except Exception:  # a listener's bug must not stop the event thread
                self._log.exception("XID listener failed")

    def _twin(self, event: XidEvent, keys: frozenset[tuple[str, object]]) -> _Seen | None:
        """A counted, unpaired event of another source for the same GPU and code close in time (lock held)."""
        if not keys:
            return None
        for (source, code), seen in self._seen.items():
            if code != event.xid or source == event.source:
                continue
            for candidate in seen:
                if (
                    not candidate.paired
                    and candidate.keys & keys
                    and abs(candidate.timestamp_seconds - event.timestamp_seconds) <= PAIR_WINDOW_SECONDS
                ):
                    return candidate
        return None

    def record_all(self, events: list[XidEvent]) -> int:
        """Record the kernel-log backfill; returns how many were counted. One log line per unknown bus id."""
        counted = 0
        for event in events:
            counted += self._record(event, warn_unmatched=False)
        with self._lock:
            unmatched, known = list(self._unmatched), bool(self._bus_to_index)
        if known:  # before the first poll every bus is unknown: set_gpus says what stays so
            self._say_unmatched(unmatched)
        return counted

    def _say_unmatched(self, unmatched: list[XidEvent]) -> None:
        """One log line per bus id of XIDs on no GPU gpumon watches (once per bus id)."""
        by_bus: dict[str, int] = {}
        for e in unmatched:
            bus = normalize_bus_id(e.pci_bus_id or "") or "(no bus id)"
            by_bus[bus] = by_bus.get(bus, 0) + 1
        for bus, n in sorted(by_bus.items()):
            if bus in self._said_buses:
                continue
            self._said_buses.add(bus)
            self._log.warning(
                "%d XID(s) in the kernel log on PCI %s, which is none of the GPUs gpumon watches; counted without a GPU",
                n,
                bus,
            )

    # ---- outputs -------------------------------------------------------------
    def counts(self, gpu_index: int | None) -> dict[str, int]:
        """XID events seen on a GPU by code (str), since boot for the kernel log, since start live."""
        with self._lock:
            c = self._by_gpu.get(gpu_index)
            return dict(c.totals) if c else {}

    def last_timestamps(self, gpu_index: int | None) -> dict[str, float]:
        """Unix time of the latest event on a GPU by code (str)."""
        with self._lock:
            c = self._by_gpu.get(gpu_index)
            return dict(c.last) if c else {}

    def for_gpu(self, gpu_index: int) -> tuple[Mapping[str, int], Mapping[str, float]]:
        """``(counts, last_timestamps)`` in one lock: the shape gpumon.collect.poller's ``xid_counts`` wants.

        Not copies (the poller asks every poll for every GPU): mappings the tracker never changes
        afterwards; a new event replaces them."""
        with self._lock:
            c = self._by_gpu.get(gpu_index)
            return (c.totals, c.last) if c else (self._none.totals, self._none.last)
