"""How one per-GPU field is declared: the words every other part of gpumon follows.

A ``GpuSnapshot`` field is declared once, with ``declare(...)`` (scalar) or ``declare_mapping(...)``
(a mapping keyed by link, domain, reason, ...): its tier, doc, NVML call, nvidia-smi field, the
``gpumon_*`` family it feeds (``Metric``), its dcgm-exporter twins (``Dcgm``) and the fake backend's
default. The metric table (gpumon/exposition/metrics.py), the DCGM table (gpumon/exposition/dcgm_table.py),
the fake defaults and the field tables in docs/ are built from these declarations.

This module imports nothing from gpumon's exporter or backends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumon.model.snapshot import GpuSnapshot


class Tier(str, Enum):
    """How often a field is read from the backend."""

    FAST = "fast"
    SLOW = "slow"
    STATIC = "static"
    DAEMON = "daemon"


Sample = tuple[tuple[str, ...], float]
"""Extra label values (in the order of the family's labels) and the value."""

Sampler = Callable[[Any], Iterable[Sample]]
"""The field's value (never read when the field is None) -> its samples."""

DETAILS = ("nvlink_per_link", "p2p", "topology", "zero_rows", "profiling", "limits")
"""The opt-ins of ``exporter.detail``, each bringing series the default leaves out (the series
budget, docs/benchmarks.md): every NVLink link's own series; every P2P status row, the OK ones
too; the topology rows; rows whose value says nothing happened (an inactive clock event reason,
a throttle reason at 0 s, ...); the GPM profiling breakdown (SM occupancy, FP pipes, throughput);
the limits that never change but the slowdown temperature (maximum clocks, the other temperature
thresholds, the memory the driver reserves)."""


def nonzero(sample: Sample) -> bool:
    """``keep`` for rows whose 0 says nothing happened."""
    return sample[1] != 0


def zero(sample: Sample) -> bool:
    """``keep`` for rows whose 1 says all is well (a link up, a P2P capability OK)."""
    return sample[1] == 0


@dataclass(frozen=True)
class Metric:
    """A ``gpumon_*`` family fed by this field; every sample also gets the ``gpu`` and ``uuid`` labels.

    By default a scalar field gives one sample and a mapping field one sample per key (natural
    order; ``keys`` splits a key into several label values). ``label``: this field is one value of
    the family's single label, and later fields add theirs with ``MetricPart``. ``samples``: a
    custom sampler of the field's value, for anything else (keep it next to the declaration).
    The family comes in the exposition where its first field is declared.
    """

    name: str
    kind: str
    """``gauge`` or ``counter`` (counters end in ``_total``)."""
    help: str
    labels: tuple[str, ...] = ()
    label: str | None = None
    keys: Callable[[str], tuple[str, ...]] | None = None
    samples: Sampler | None = None
    read_every_seconds: float | None = None
    """The NVML backend reads the field at most this often (a costly call), though its tier is read
    more often: HELP then says the longer interval."""
    detail: str | None = None
    """An opt-in of ``exporter.detail`` (one of ``DETAILS``): with it, every sample is served;
    without it, only the samples ``keep`` passes (none when ``keep`` is None). None: always served."""
    keep: Callable[[Sample], bool] | None = None
    """Without the ``detail`` opt-in, the samples served: those that say something happened (a link
    down, a reason active, a counter above 0)."""


@dataclass(frozen=True)
class MetricPart:
    """This field is the ``label`` value of a family declared (``Metric(..., label=...)``) on an earlier field."""

    name: str
    label: str


@dataclass(frozen=True)
class Dcgm:
    """A dcgm-exporter family (``--compat dcgm``) computed from this field, in DCGM's unit.

    The value is ``field × scale``, ``field[key] × scale`` with ``key``, whole MiB with
    ``whole_mib``, or ``value(gpu)`` for anything else (then say what it is in ``source``).
    ``in_exporter``: the value needs NVML's constants and is computed in gpumon/exposition/dcgm_table.py.
    """

    name: str
    kind: str
    """``gauge`` or ``untyped`` (dcgm-exporter's counters without a ``_total`` suffix)."""
    help: str
    unit: str = "—"
    key: str | None = None
    scale: float = 1.0
    whole_mib: bool = False
    value: Callable[[GpuSnapshot], float | None] | None = None
    source: str = ""
    """What it is computed from, for docs/dcgm-compat.md (generated when empty)."""
    in_exporter: bool = False


NO_FAKE: Any = object()
"""``fake=`` left out: the fake backend has no default for the field (or computes one per GPU)."""


@dataclass(frozen=True)
class FieldSpec:
    """Everything declared about one GpuSnapshot field (``metadata["spec"]``)."""

    tier: Tier
    doc: str
    """Meaning and unit, with the nvidia-smi field in parentheses."""
    mapping: bool = False
    nvml: str = ""
    """The NVML call(s) it is read with (docs/nvml-notes.md)."""
    conversion: str = "—"
    """From NVML's unit to the field's (docs/nvml-notes.md)."""
    smi: str = "—"
    """The matching nvidia-smi field (``power.draw``) or ``-q`` line."""
    metrics: tuple[Metric | MetricPart, ...] = ()
    dcgm: tuple[Dcgm, ...] = ()
    fake: Any = NO_FAKE
    """The fake backend's default value (an H200 SXM at rest)."""


def declare(
    tier: Tier,
    doc: str,
    *,
    nvml: str = "",
    conversion: str = "—",
    smi: str = "—",
    metric: Metric | MetricPart | tuple[Metric | MetricPart, ...] = (),
    dcgm: Dcgm | tuple[Dcgm, ...] = (),
    fake: Any = NO_FAKE,
    mapping: bool = False,
) -> Any:
    """A GpuSnapshot field (default None) with its declaration in ``metadata``."""
    spec = FieldSpec(
        tier=tier,
        doc=doc,
        mapping=mapping,
        nvml=nvml,
        conversion=conversion,
        smi=smi,
        metrics=metric if isinstance(metric, tuple) else (metric,),
        dcgm=dcgm if isinstance(dcgm, tuple) else (dcgm,),
        fake=fake,
    )
    metadata: dict[str, Any] = {"tier": tier, "doc": doc, "spec": spec}
    if mapping:
        metadata["mapping"] = True
    return dataclasses.field(default=None, metadata=metadata)


def declare_mapping(
    tier: Tier,
    doc: str,
    *,
    nvml: str = "",
    conversion: str = "—",
    smi: str = "—",
    metric: Metric | MetricPart | tuple[Metric | MetricPart, ...] = (),
    dcgm: Dcgm | tuple[Dcgm, ...] = (),
    fake: Any = NO_FAKE,
) -> Any:
    """``declare`` for a mapping field (keyed by domain, link, reason, ...): one sample per key by default."""
    return declare(
        tier, doc, nvml=nvml, conversion=conversion, smi=smi, metric=metric, dcgm=dcgm, fake=fake, mapping=True
    )


def natural(key: str) -> tuple[int, str]:
    """Sort key: numeric keys ("2" < "10") first, then the others by name."""
    return (int(key), "") if key.isdigit() else (1 << 30, key)


def as_number(value: object) -> float | None:
    """A sample value: bools as 1/0, numbers as float, anything else None."""
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return None


def info_label(value: str) -> Iterable[Sample]:
    """A ``*_info`` family: the field's value as the label, sample 1."""
    return [((value,), 1.0)]
