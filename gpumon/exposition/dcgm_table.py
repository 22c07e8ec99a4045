"""The DCGM table: every DCGM_FI_* family gpumon can fill, in dcgm-exporter's units and order.

Each family comes from a field's ``dcgm=`` twin (gpumon/model/fields), its value computed from a
GpuSnapshot: scaled, in whole MiB, one key of a mapping, or (``in_exporter``) here, where NVML's
constants may be used. ``served_fields`` gives the families a combination of name sets
(``dcgm``, ``dcgm-4.9``) serves, each once; ``last_xid`` is DCGM_FI_DEV_XID_ERRORS's value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpumon.exposition.dcgm_sets import DCGM_SETS
from gpumon.model.fields.spec import Dcgm
from gpumon.model.nvml_vocabulary import CLOCK_EVENT_BITS
from gpumon.model.snapshot import GpuSnapshot, field_specs

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
