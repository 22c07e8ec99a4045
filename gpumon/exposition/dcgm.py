"""dcgm-exporter's metric names, labels and units, from gpumon's snapshots (``--compat dcgm``, ``dcgm-4.9``).

So that dashboards and alert rules written for NVIDIA's dcgm-exporter work unchanged:
the same ``DCGM_FI_*`` names, the same units (MHz, MiB, %, mJ, ns up to 4.8.x; 4.9's
in gpumon.exposition.dcgm_sets) and the same per-GPU label set as dcgm-exporter's GPU
template: ``gpu`` (index), ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<index>``),
``modelName``, ``Hostname`` or ``hostname`` (omitted when empty, as dcgm-exporter does with
``--no-hostname``) and ``DCGM_FI_DRIVER_VERSION`` or ``DCGM_FI_SYSTEM_DRIVER_VERSION``.
Served together, two sets share the families neither renamed (one series, both sets' labels).

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

import dataclasses
import logging
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpumon.collect.store import SnapshotStore
from gpumon.exposition.dcgm_sets import DCGM_SETS, HPC_JOB, LABEL_FIELDS, LEGACY, LabelField
from gpumon.exposition.text import needs_escaping
from gpumon.model.families import Family
from gpumon.model.fields.spec import Dcgm
from gpumon.model.nvml_vocabulary import CLOCK_EVENT_BITS
from gpumon.model.snapshot import GpuSnapshot, Snapshot, field_specs
from gpumon.model.xid_catalog import XidCatalog

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# CLOCK_EVENT_BITS (NVML's nvmlClocksEventReason* values) come from gpumon.model.nvml_vocabulary: one table of them.

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
"""Values of twins declared ``in_exporter=True``: they need NVML's constants, which gpumon/model/fields may not import."""

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


@dataclass(frozen=True)
class _Served:
    """One family served: its name, type, help and value, and which sets (by index) serve it."""

    name: str
    kind: str
    help: str
    value: Value
    sets: tuple[int, ...]


def served_fields(sets: Sequence[str]) -> list[_Served]:
    """The families the DCGM ``sets`` (``dcgm``, ``dcgm-4.9``) serve together, each once: a name two
    sets share (a field neither renamed) is one family carrying the labels of both."""
    chosen = [DCGM_SETS[name] for name in sets]
    served: dict[str, _Served] = {}
    for spec in dcgm_fields():
        for i, dset in enumerate(chosen):
            if spec.name in dset.dropped:
                continue
            converted = dset.converted.get(spec.name)
            if converted is not None:
                name, help_text, value = converted.name, converted.help, converted.value
            else:
                name, help_text, value = dset.same_unit.get(spec.name, spec.name), spec.help, spec.value
            known = served.get(name)
            if known is None:
                served[name] = _Served(name, spec.kind, help_text, value, (i,))
            elif i not in known.sets:
                served[name] = dataclasses.replace(known, sets=(*known.sets, i))
    return list(served.values())


def node_name(env: Mapping[str, str]) -> str:
    """The host label's value, as dcgm-exporter takes it: $NODE_NAME (its Helm chart sets it from
    the pod's spec.nodeName) when set, else the host name."""
    return env.get("NODE_NAME") or socket.gethostname()


def _hpc_jobs(gpu: GpuSnapshot) -> list[str]:
    """The Slurm jobs of the GPU's processes, in order: dcgm-exporter's ``hpc_job`` values."""
    jobs = {p.slurm_job_id for p in gpu.processes or () if p.slurm_job_id}
    return sorted(jobs, key=lambda job: (len(job), job))


_BASE_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
Labels = tuple[str, ...]


class DcgmCompatCollector:
    """A metric source of dcgm-exporter's families from the latest snapshot."""

    def __init__(
        self,
        store: SnapshotStore,
        hostname: str,
        catalog: XidCatalog | None = None,
        *,
        sets: Sequence[str] = (LEGACY,),
        hostname_label: str | None = None,
        labels: Sequence[str] = (),
    ) -> None:
        """``hostname``: the host label's value (dcgm-exporter uses the node name); "" leaves it out.

        ``catalog``: gives ``err_msg`` on the XID family, as newer dcgm-exporters do.
        ``sets``: the name sets to serve (``dcgm``, ``dcgm-4.9``, or both for a migration).
        ``hostname_label``: ``Hostname`` or ``hostname`` for every set; None: each set's own
        (``Hostname`` up to dcgm-exporter 4.8.2, ``hostname`` in 4.9).
        ``labels``: optional labels (``COMPAT_LABELS``): dcgm-exporter's label rows and ``hpc_job``.
        """
        self._store = store
        self._hostname = hostname
        self._catalog = catalog
        self._sets = [DCGM_SETS[name] for name in sets]
        self._host_labels = [hostname_label or s.hostname_label for s in self._sets]
        self._label_fields = [LABEL_FIELDS[name] for name in labels if name in LABEL_FIELDS]
        self._hpc_job = HPC_JOB in labels
        self._fields = served_fields(sets)
        self._cache: tuple[Snapshot, XidCatalog | None, list[Family]] | None = None

    def set_catalog(self, catalog: XidCatalog) -> None:
        """Use ``catalog`` for ``err_msg`` from the next scrape on (a reload changed ``xid_catalog``)."""
        self._catalog = catalog

    def _label_names(self, snapshot: Snapshot, set_indices: Sequence[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The label names of a family served by ``set_indices``, and those of them a sample may lack."""
        names: list[str] = list(_BASE_LABELS)
        optional: list[str] = []

        def add(name: str, may_lack: bool = False) -> None:
            if name not in names:
                names.append(name)
                if may_lack:
                    optional.append(name)

        for i in set_indices:
            if self._hostname:
                add(self._host_labels[i])
        for i in set_indices:
            if snapshot.host.driver_version:
                add(self._sets[i].driver_label)
        for i in set_indices:
            for label in self._label_fields:
                add(self._sets[i].label_name(label), may_lack=True)
        if self._hpc_job:
            add(HPC_JOB, may_lack=True)
        return tuple(names), tuple(optional)

    def _label_values(self, gpu: GpuSnapshot, snapshot: Snapshot) -> list[dict[str, str]]:
        """The GPU's label values by name, every spelling of every set; one per HPC job when asked."""
        values = {
            "gpu": str(gpu.index),
            "UUID": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id or "",
            "device": f"nvidia{gpu.index}",
            "modelName": gpu.name or "",
        }
        for i, dset in enumerate(self._sets):
            values[self._host_labels[i]] = self._hostname
            values[dset.driver_label] = snapshot.host.driver_version or ""
            for label in self._label_fields:
                values[dset.label_name(label)] = _label_field_value(label, gpu, snapshot)
        if not self._hpc_job:
            return [values]
        jobs = _hpc_jobs(gpu)
        return [{**values, HPC_JOB: job} for job in jobs] or [values]

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
        gpus = [(gpu, self._label_values(gpu, snapshot)) for gpu in snapshot.gpus if gpu.up]
        plain = not needs_escaping(v for _, variants in gpus for values in variants for v in values.values())
        # per group of sets: the label names, those a sample may lack, and each GPU's label tuples (made once)
        heads: dict[tuple[int, ...], tuple[Labels, Labels, list[tuple[GpuSnapshot, Labels]]]] = {}
        out = []
        for spec in self._fields:
            head = heads.get(spec.sets)
            if head is None:
                names, optional = self._label_names(snapshot, spec.sets)
                rows = [(gpu, tuple(values.get(n, "") for n in names)) for gpu, variants in gpus for values in variants]
                head = heads[spec.sets] = (names, optional, rows)
            names, optional, rows = head
            family = Family(spec.name, spec.kind, spec.help, names, plain_labels=plain, optional_labels=optional)
            samples = family.samples
            value_of = spec.value
            for gpu, labels in rows:  # a GPU with several HPC jobs comes once per job
                value = value_of(gpu)
                if value is not None:
                    samples.append((labels, float(value)))
            if samples:
                out.append(family)
        for i, dset in enumerate(self._sets):
            xid = self._xid_family(dset.same_unit.get(_XID, _XID), (i,), snapshot, gpus, catalog)
            if xid.samples:
                out.append(xid)
        return out

    def _xid_family(
        self,
        name: str,
        set_indices: tuple[int, ...],
        snapshot: Snapshot,
        gpus: list[tuple[GpuSnapshot, list[dict[str, str]]]],
        catalog: XidCatalog | None,
    ) -> Family:
        names, optional = self._label_names(snapshot, set_indices)
        xid_names = (*names, "err_code") if catalog is None else (*names, "err_code", "err_msg")
        xid = Family(name, "gauge", "Value of the last XID error encountered.", xid_names, optional_labels=optional)
        for gpu, variants in gpus:
            code = last_xid(gpu)
            if code is None:
                continue
            extra: tuple[str, ...] = (str(code),)
            if catalog is not None:
                extra += ("No Error" if code == 0 else catalog.lookup(code).meaning,)
            for values in variants:
                xid.add((*(values.get(n, "") for n in names), *extra), float(code))
        return xid


_XID = "DCGM_FI_DEV_XID_ERRORS"


def _label_field_value(label: LabelField, gpu: GpuSnapshot, snapshot: Snapshot) -> str:
    if label is LABEL_FIELDS["nvml_version"]:
        return snapshot.host.nvml_version or ""
    if label is LABEL_FIELDS["serial"]:
        return gpu.serial or ""
    return gpu.vbios_version or ""
