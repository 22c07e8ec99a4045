"""NVLink: link state (fast) and the error counters nvidia-smi nvlink -e shows (slow)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumon.model.fields.spec import Dcgm, Metric, Sample, Tier, declare_mapping, natural, nonzero, zero

if TYPE_CHECKING:
    from gpumon.model.snapshot import GpuSnapshot

LINKS_H200 = 18
NVLINK_ERRORS_SECONDS = 300.0
"""The daemon (``gpumon run``) asks NVML for the NVLink error counters at most this often: one
nvmlDeviceGetFieldValues call for every link and type costs about 43 ms of CPU per GPU on an H100
(18 links; the driver spins), 0.14 % of a core per GPU at 30 s (docs/nvml-notes.md). They are
cumulative: a longer interval makes an increase show later, it loses none; a fatal NVLink error
comes at once as XID 74, a link down within NVLINK_STATE_SECONDS in gpumon_nvlink_links_up."""
NVLINK_STATE_SECONDS = 30.0
"""The daemon asks for each link's state at most this often (dcgm-exporter's default interval for
every field): at the daemon's cadence 18 x nvmlDeviceGetNvLinkState cost about 1.8 ms of CPU on an
H100 (0.05 ms in a tight loop; one field-values call for the 18 costs more), so they were 80 % of the
NVML calls' CPU at every second and still 37 % at every 5 s (0.029 % of a core per GPU of a 0.078 %
floor, 4 x H100; docs/benchmarks.md), for a state that changes when a link fails.
A fatal NVLink error comes at once as XID 74. One-shot readers (burn's watcher, once, health) still
read it every time."""


def _error_samples(errors: Mapping[str, Mapping[str, int]]) -> Iterable[Sample]:
    return [
        ((link, kind), float(count))
        for link in sorted(errors, key=natural)
        for kind, count in sorted(errors[link].items())
    ]


def _links_up(up: Mapping[str, bool]) -> Iterable[Sample]:
    return [((), float(sum(1 for state in up.values() if state)))]


def _links_total(up: Mapping[str, bool]) -> Iterable[Sample]:
    return [((), float(len(up)))]


def _link_states(up: Mapping[str, bool]) -> Iterable[Sample]:
    return [((link,), 1.0 if up[link] else 0.0) for link in sorted(up, key=natural)]


def _errors_by_type(errors: Mapping[str, Mapping[str, int]]) -> Iterable[Sample]:
    totals: dict[str, int] = {}
    for counts in errors.values():
        for kind, count in counts.items():
            totals[kind] = totals.get(kind, 0) + count
    return [((kind,), float(count)) for kind, count in sorted(totals.items())]


def _summed(kind: str) -> Callable[[GpuSnapshot], float | None]:
    """One error type summed over the links; None when no link has it."""

    def value(gpu: GpuSnapshot) -> float | None:
        if not gpu.nvlink_errors_total:
            return None
        counts = [link[kind] for link in gpu.nvlink_errors_total.values() if kind in link]
        return float(sum(counts)) if counts else None

    return value


@dataclass(frozen=True)
class NvlinkFields:
    nvlink_up: Mapping[str, bool] | None = declare_mapping(
        Tier.FAST,
        "NVLink state by link index (nvidia-smi nvlink --status)",
        nvml="nvmlDeviceGetNvLinkState per link; links counted once (0.. until NOT_SUPPORTED / INVALID_ARGUMENT)",
        smi="nvlink --status",
        metric=(
            Metric(
                "gpumon_nvlink_links_up",
                "gauge",
                "NVLink links of the GPU that are active (nvidia-smi nvlink --status).",
                samples=_links_up,
                read_every_seconds=NVLINK_STATE_SECONDS,
            ),
            Metric(
                "gpumon_nvlink_links",
                "gauge",
                "NVLink links the GPU has (nvidia-smi nvlink --status).",
                samples=_links_total,
                read_every_seconds=NVLINK_STATE_SECONDS,
            ),
            Metric(
                "gpumon_nvlink_link_up",
                "gauge",
                "1 when the NVLink link is active (nvidia-smi nvlink --status).",
                labels=("link",),
                samples=_link_states,
                detail="nvlink_per_link",
                keep=zero,
                read_every_seconds=NVLINK_STATE_SECONDS,
            ),
        ),
        fake={str(link): True for link in range(LINKS_H200)},
    )
    nvlink_errors_total: Mapping[str, Mapping[str, int]] | None = declare_mapping(
        Tier.SLOW,
        "NVLink error counters by link index, then type replay|recovery|crc (nvidia-smi nvlink -e)",
        nvml="one nvmlDeviceGetFieldValues call: NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY / _RECOVERY / _CRC (161–163)"
        " with scopeId = link; a type whose field the driver does not support falls back to"
        " nvmlDeviceGetNvLinkErrorCounter(link, DL_REPLAY / DL_RECOVERY / DL_CRC_FLIT)."
        " DL_CRC_DATA and DL_ECC_DATA are not read (below); gpumon run asks at most every 30 s",
        smi="`nvlink -e`: Replay Errors, Recovery Errors, CRC Errors",
        metric=(
            Metric(
                "gpumon_nvlink_errors_total",
                "counter",
                "NVLink errors of the GPU's links summed, by type replay|recovery|crc (nvidia-smi nvlink -e).",
                labels=("type",),
                samples=_errors_by_type,
                read_every_seconds=NVLINK_ERRORS_SECONDS,
            ),
            Metric(
                "gpumon_nvlink_link_errors_total",
                "counter",
                "NVLink errors by link and type replay|recovery|crc (nvidia-smi nvlink -e).",
                labels=("link", "type"),
                samples=_error_samples,
                read_every_seconds=NVLINK_ERRORS_SECONDS,
                detail="nvlink_per_link",
                keep=nonzero,
            ),
        ),
        dcgm=(
            Dcgm(
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                "untyped",
                "Total number of NVLink flow-control CRC errors (nvidia-smi nvlink -e: CRC Errors).",
                value=_summed("crc"),
                source="nvlink_errors_total[*][crc], summed over links",
            ),
            Dcgm(
                "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
                "untyped",
                "Total number of NVLink retries.",
                value=_summed("replay"),
                source="nvlink_errors_total[*][replay], summed",
            ),
            Dcgm(
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
                "untyped",
                "Total number of NVLink recovery errors.",
                value=_summed("recovery"),
                source="nvlink_errors_total[*][recovery], summed",
            ),
        ),
        fake={str(link): {"replay": 0, "recovery": 0, "crc": 0} for link in range(LINKS_H200)},
    )
