"""Plain data in the middle of gpumon: what one poll saw, in base units.

Nothing here touches hardware. Every per-GPU field is optional: ``None`` means the
field was not read (not supported by this GPU, or its tier was never read yet) and
the exporter omits the series — never 0, never NaN.

The per-GPU fields are declared in gpumon/model/fields/, one module per subsystem, each with
``declare(...)`` (gpumon/model/fields/spec.py): ``metadata["spec"]`` holds the whole declaration
(NVML call, nvidia-smi field, metric family, DCGM twins, fake default) and
``metadata["tier"]`` its tier: ``fast`` (every poll), ``slow`` (costly calls, every
``slow_interval_seconds``), ``static`` (identity and limits that do not change while the
driver is loaded, re-read rarely) or ``daemon`` (filled by gpumon itself, not by a backend).
Backends use the tier to know which fields a tier covers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from gpumon.model.fields.clocks import ClockFields
from gpumon.model.fields.ecc import EccFields
from gpumon.model.fields.events import EventFields
from gpumon.model.fields.fans import FanFields
from gpumon.model.fields.gpm import GpmFields
from gpumon.model.fields.identity import GpuKey, IdentityFields
from gpumon.model.fields.modes import ModeFields
from gpumon.model.fields.nvlink import NvlinkFields
from gpumon.model.fields.pcie import PcieFields
from gpumon.model.fields.power import PowerFields
from gpumon.model.fields.processes import ProcessFields, ProcessSnapshot
from gpumon.model.fields.spec import FieldSpec, Metric, Tier
from gpumon.model.fields.thermal import ThermalFields
from gpumon.model.fields.topology import P2pStatus, TopologyFields
from gpumon.model.fields.usage import UsageFields

__all__ = [
    "FieldSpec",
    "GpuSnapshot",
    "HostSnapshot",
    "P2pStatus",
    "ProcessSnapshot",
    "Snapshot",
    "Tier",
    "TierStats",
    "counter_field_names",
    "field_specs",
    "field_tier",
    "fields_of_tier",
    "numeric_field_names",
    "to_jsonable",
]


@dataclass(frozen=True)
class GpuSnapshot(
    EventFields,
    GpmFields,
    ProcessFields,
    TopologyFields,
    NvlinkFields,
    ModeFields,
    EccFields,
    PcieFields,
    FanFields,
    ClockFields,
    PowerFields,
    ThermalFields,
    UsageFields,
    IdentityFields,
    GpuKey,
):
    """Everything gpumon knows about one GPU at one poll, in base units.

    The fields are declared by subsystem in gpumon/model/fields/ (each with its tier, doc, NVML call,
    nvidia-smi field, metric family and DCGM twins). Dataclasses take the fields of the bases
    from the last base to the first, so the order is GpuKey, identity, usage, ... events: the
    order of ``gpumon once --json`` and of the ``gpumon_*`` families.
    """

    @classmethod
    def base_fields(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every field's default overlaid with ``values``: the ``base`` that ``assemble`` takes."""
        return {**_defaults(), **values}

    @classmethod
    def assemble(
        cls,
        index: int,
        uuid: str,
        values: Mapping[str, Any],
        base: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> GpuSnapshot:
        """A live GPU's snapshot from field values, for the per-second path.

        Equal to ``GpuSnapshot(index=index, uuid=uuid, **base_values, **values, **extra)`` (tested, later
        mappings winning), without running the generated ``__init__`` field by field: ~1 µs instead of
        ~9 µs for its 70 fields. ``base`` comes from ``base_fields`` (the slower tiers, built once per slow
        read); ``extra``: what gpumon adds to the read (XID counts, process attribution).
        ``values``, ``base`` and ``extra`` must hold only field names of this class; the poller checks that.
        """
        snapshot = object.__new__(cls)
        fields_ = snapshot.__dict__
        fields_.update(_defaults() if base is None else base)
        fields_.update(values)
        if extra:
            fields_.update(extra)
        fields_["index"] = index
        fields_["uuid"] = uuid
        return snapshot


@dataclass(frozen=True)
class HostSnapshot:
    """Host-wide facts: driver and a few psutil figures alerts need."""

    driver_version: str | None = None
    """NVIDIA driver version (driver_version)."""
    cuda_driver_version: str | None = None
    """CUDA version the driver supports, e.g. 13.0 (nvidia-smi header 'CUDA Version')."""
    nvml_version: str | None = None
    cpu_utilization_ratio: float | None = None
    """Host CPU busy share 0-1 since the previous poll (psutil.cpu_percent / 100)."""
    memory_used_bytes: int | None = None
    """Host memory in use, bytes (psutil total - available)."""
    memory_total_bytes: int | None = None
    simulated: bool = False
    """The GPUs are simulated by the fake backend (``--backend fake``), not real hardware."""


@dataclass(frozen=True)
class TierStats:
    """Cost and health of the last read of one tier."""

    duration_seconds: float
    errors_total: int
    last_timestamp_seconds: float

    @classmethod
    def of_read(cls, duration_seconds: float, errors_total: int, last_timestamp_seconds: float) -> TierStats:
        """Equal to ``TierStats(...)`` (tested), made without the frozen ``__init__``'s one
        ``object.__setattr__`` per field: the poller makes one every poll. Each field is written into the
        new object's ``__dict__`` (half the cost of handing it a dict of its own)."""
        made = object.__new__(cls)
        fields_ = made.__dict__
        fields_["duration_seconds"] = duration_seconds
        fields_["errors_total"] = errors_total
        fields_["last_timestamp_seconds"] = last_timestamp_seconds
        return made


@dataclass(frozen=True)
class Snapshot:
    """What one poll saw of the whole host."""

    timestamp_seconds: float
    """Unix time the poll finished."""
    monotonic_seconds: float
    """time.monotonic() when the poll finished; ages are measured against it."""
    nvml_up: bool
    nvml_error: str | None = None
    host: HostSnapshot = field(default_factory=HostSnapshot)
    gpus: tuple[GpuSnapshot, ...] = ()
    tiers: Mapping[str, TierStats] = field(default_factory=dict)

    @classmethod
    def of_poll(
        cls,
        timestamp_seconds: float,
        monotonic_seconds: float,
        host: HostSnapshot,
        gpus: tuple[GpuSnapshot, ...],
        tiers: Mapping[str, TierStats],
    ) -> Snapshot:
        """A poll's snapshot with NVML up: equal to ``Snapshot(..., nvml_up=True)`` (tested), made
        without the frozen ``__init__``'s one ``object.__setattr__`` per field (every poll), as ``TierStats.of_read``."""
        made = object.__new__(cls)
        fields_ = made.__dict__
        fields_["timestamp_seconds"] = timestamp_seconds
        fields_["monotonic_seconds"] = monotonic_seconds
        fields_["nvml_up"] = True
        fields_["nvml_error"] = None
        fields_["host"] = host
        fields_["gpus"] = gpus
        fields_["tiers"] = tiers
        return made


@functools.cache
def _defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(GpuSnapshot) if f.default is not dataclasses.MISSING}


@functools.cache
def _tiers_by_field() -> dict[str, Tier | None]:
    return {
        f.name: (f.metadata["tier"] if isinstance(f.metadata.get("tier"), Tier) else None)
        for f in dataclasses.fields(GpuSnapshot)
    }


@functools.cache
def field_specs() -> tuple[tuple[str, FieldSpec], ...]:
    """Every declared GpuSnapshot field (all but GpuKey's) and its declaration, in field order."""
    return tuple(
        (f.name, f.metadata["spec"])
        for f in dataclasses.fields(GpuSnapshot)
        if isinstance(f.metadata.get("spec"), FieldSpec)
    )


def field_tier(name: str) -> Tier | None:
    """The tier a GpuSnapshot field is read in, or None for identity fields. KeyError for unknown names."""
    return _tiers_by_field()[name]


def fields_of_tier(tier: Tier) -> frozenset[str]:
    """Names of the GpuSnapshot fields read in ``tier``."""
    return frozenset(f.name for f in dataclasses.fields(GpuSnapshot) if f.metadata.get("tier") == tier)


@functools.cache
def counter_field_names() -> frozenset[str]:
    """Fields read from a backend that feed a counter family (``gpumon_*_total``): a lost GPU keeps
    their last values (DESIGN.md §4; a counter that vanishes and comes back reads as a reset)."""
    return frozenset(
        name
        for name, spec in field_specs()
        if spec.tier is not Tier.DAEMON and any(isinstance(m, Metric) and m.kind == "counter" for m in spec.metrics)
    )


def numeric_field_names() -> frozenset[str]:
    """Scalar numeric/bool fields that alert rules may compare (``field: temperature_celsius``)."""
    out = set()
    for f in dataclasses.fields(GpuSnapshot):
        if f.metadata.get("mapping") or f.name in ("processes", "p2p_status"):
            continue
        if f.type in ("float | None", "int | None", "bool | None", "bool", "int"):
            out.add(f.name)
    return frozenset(out)


def to_jsonable(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot as plain JSON-ready data (``gpumon once --json``); None fields dropped."""

    def clean(value: Any) -> Any:
        if isinstance(value, Enum):
            return value.value
        if isinstance(value, Mapping):
            return {str(k): clean(v) for k, v in value.items() if v is not None}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    raw = dataclasses.asdict(snapshot)
    raw["gpus"] = [{k: clean(v) for k, v in g.items() if v is not None} for g in raw["gpus"]]
    raw["host"] = {k: v for k, v in raw["host"].items() if v is not None}
    raw["tiers"] = clean(raw["tiers"])
    return clean(raw)  # type: ignore[no-any-return]
