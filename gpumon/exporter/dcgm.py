"""dcgm-exporter's metric names, labels and units, from gpumon's snapshots (``--compat dcgm``).

So that dashboards and alert rules written for NVIDIA's dcgm-exporter work unchanged:
the same ``DCGM_FI_*`` names, the same units (MHz, MiB, %, mJ, µs) and the same
per-GPU label set as dcgm-exporter's GPU template: ``gpu`` (index), ``UUID``,
``pci_bus_id``, ``device`` (``nvidia<index>``), ``modelName``, ``Hostname`` (omitted
when empty, as dcgm-exporter does with ``--no-hostname``) and ``DCGM_FI_DRIVER_VERSION``.

Two deliberate differences, both documented in docs/dcgm-compat.md:

* dcgm-exporter declares some fields ``counter`` although their names do not end in
  ``_total`` (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, ..._REMAPPED_ROWS, ECC totals).
  The Prometheus client and OpenMetrics require a counter's samples to end in
  ``_total``, so gpumon types them ``untyped``: same names, same values, and
  ``rate()`` / ``increase()`` work on them as before.
* DCGM_FI_DEV_XID_ERRORS is the code of the last XID (0 when none), as in DCGM; the
  count of every XID is in ``gpumon_xid_errors_total``.

A series is omitted when its snapshot field is None (not supported, not read yet, or
the GPU is lost), like dcgm-exporter skips blank values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpumon.events.catalog import XidCatalog
from gpumon.exporter.text import Family, needs_escaping
from gpumon.fields.spec import Dcgm
from gpumon.nvml_vocabulary import CLOCK_EVENT_BITS
from gpumon.snapshot import GpuSnapshot, Snapshot, field_specs
from gpumon.store import SnapshotStore

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# CLOCK_EVENT_BITS (NVML's nvmlClocksEventReason* values) come from gpumon.nvml_vocabulary: one table of them.

Value = Callable[[GpuSnapshot], float | None]


@dataclass(frozen=True)
class DcgmField:
    """One DCGM_FI_* family computed from a GpuSnapshot."""

    name: str
    kind: str
    """``gauge`` or ``untyped`` (dcgm-exporter's counters without a ``_total`` suffix)."""
    help: str
    value: Value


def _get(mapping: Mapping[str, float] | Mapping[str, int] | None, key: str) -> float | None:
    if mapping is None:
        return None
    value = mapping.get(key)
    return None if value is None else float(value)


def _scaled(field: str, factor: float) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        raw = getattr(gpu, field)
        if raw is None:
            return None
        return float(raw) * factor

    return value


def _mib(field: str) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        raw = getattr(gpu, field)
        return None if raw is None else float(int(raw) // MIB)

    return value


def _key(field: str, key: str, factor: float = 1.0) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        v = _get(getattr(gpu, field), key)
        return None if v is None else v * factor

    return value


def clock_events_mask(active: Mapping[str, bool] | None) -> float | None:
    """NVML's bitmask of the active clock event (throttle) reasons; None when unknown."""
    if active is None:
        return None
    return float(sum(bit for reason, bit in CLOCK_EVENT_BITS.items() if active.get(reason)))


def _clock_mask(gpu: GpuSnapshot) -> float | None:
    return clock_events_mask(gpu.clock_events_active)


COMPUTED_HERE: Mapping[str, Value] = {
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": _clock_mask,
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": _clock_mask,
}
"""Values of twins declared ``in_exporter=True``: they need NVML's constants, which gpumon/fields may not import."""

DCGM_ORDER = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_SLOWDOWN_TEMP",
    "DCGM_FI_DEV_SHUTDOWN_TEMP",
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP",
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PSTATE",
    "DCGM_FI_DEV_FAN_SPEED",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE",
    "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_RETIRED_PENDING",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
)
"""The exposition order of the families gpumon had before they were declared with their fields (that of
dcgm-exporter's default counters, roughly); twins declared later follow in declaration order."""


def _value(field: str, twin: Dcgm) -> Value:
    if twin.in_exporter:
        return COMPUTED_HERE[twin.name]
    if twin.value is not None:
        return twin.value
    if twin.whole_mib:
        return _mib(field)
    if twin.key is not None:
        return _key(field, twin.key, twin.scale)
    return _scaled(field, twin.scale)


def dcgm_fields() -> tuple[DcgmField, ...]:
    """Every DCGM_FI_* family gpumon can fill, in dcgm-exporter's units, from the fields' ``dcgm=`` twins."""
    declared = [
        DcgmField(twin.name, twin.kind, twin.help, _value(field, twin))
        for field, spec in field_specs()
        for twin in spec.dcgm
    ]
    position = {name: i for i, name in enumerate(DCGM_ORDER)}
    return tuple(sorted(declared, key=lambda f: position.get(f.name, len(position))))


def last_xid(gpu: GpuSnapshot) -> int | None:
    """The code of the most recent XID on the GPU (DCGM_FI_DEV_XID_ERRORS); 0 when none; None when not tracked."""
    if gpu.xid_last_timestamp_seconds is None and gpu.xid_errors_total is None:
        return None
    last = gpu.xid_last_timestamp_seconds or {}
    if not last:
        return 0
    code, _ = max(last.items(), key=lambda item: (item[1], int(item[0]) if item[0].isdigit() else -1))
    return int(code) if code.isdigit() else 0


class DcgmCompatCollector:
    """A metric source of dcgm-exporter's families from the latest snapshot."""

    def __init__(self, store: SnapshotStore, hostname: str, catalog: XidCatalog | None = None) -> None:
        """``hostname``: the ``Hostname`` label (dcgm-exporter uses the node name); "" leaves it out.

        ``catalog``: gives ``err_msg`` on DCGM_FI_DEV_XID_ERRORS, as newer dcgm-exporters do.
        """
        self._store = store
        self._hostname = hostname
        self._catalog = catalog
        self._fields = dcgm_fields()
        self._cache: tuple[Snapshot, XidCatalog | None, list[Family]] | None = None

    def set_catalog(self, catalog: XidCatalog) -> None:
        """Use ``catalog`` for ``err_msg`` from the next scrape on (a reload changed ``xid_catalog``)."""
        self._catalog = catalog

    def _label_names(self, snapshot: Snapshot) -> tuple[str, ...]:
        names: tuple[str, ...] = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
        if self._hostname:
            names += ("Hostname",)
        if snapshot.host.driver_version:
            names += ("DCGM_FI_DRIVER_VERSION",)
        return names

    def _labels(self, gpu: GpuSnapshot, snapshot: Snapshot) -> tuple[str, ...]:
        """The values of ``_label_names(snapshot)`` for ``gpu``."""
        labels: tuple[str, ...] = (
            str(gpu.index),
            gpu.uuid,
            gpu.pci_bus_id or "",
            f"nvidia{gpu.index}",
            gpu.name or "",
        )
        if self._hostname:
            labels += (self._hostname,)
        if snapshot.host.driver_version:
            labels += (snapshot.host.driver_version,)
        return labels

    def families(self) -> list[Family]:
        """The families of the latest snapshot, built once per snapshot: every scrape of it
        (several scrapers, text and OpenMetrics) reuses them and their rendered text."""
        snapshot = self._store.latest()
        if snapshot is None:
            return []
        catalog = self._catalog
        cached = self._cache
        if cached is not None and cached[0] is snapshot and cached[1] is catalog:
            return cached[2]
        families = self._build(snapshot, catalog)
        self._cache = (snapshot, catalog, families)
        return families

    def _build(self, snapshot: Snapshot, catalog: XidCatalog | None) -> list[Family]:
        names = self._label_names(snapshot)
        gpus = [(gpu, self._labels(gpu, snapshot)) for gpu in snapshot.gpus if gpu.up]
        plain = not needs_escaping(v for _, labels in gpus for v in labels)
        out = []
        for spec in self._fields:
            family = Family(spec.name, spec.kind, spec.help, names, plain_labels=plain)
            samples = family.samples
            value_of = spec.value
            for gpu, labels in gpus:
                value = value_of(gpu)
                if value is not None:
                    samples.append((labels, float(value)))
            if samples:
                out.append(family)
        xid_names = (*names, "err_code") if catalog is None else (*names, "err_code", "err_msg")
        xid = Family("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", xid_names)
        for gpu, labels in gpus:
            code = last_xid(gpu)
            if code is None:
                continue
            if catalog is None:
                xid.add((*labels, str(code)), float(code))
            else:
                message = "No Error" if code == 0 else catalog.lookup(code).meaning
                xid.add((*labels, str(code), message), float(code))
        if xid.samples:
            out.append(xid)
        return out
