"""Modes an administrator can change while gpumon runs (slow tier), and NVSwitch fabric registration."""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.fields.spec import Metric, Tier, declare, info_label

_FABRIC = (
    "nvmlDeviceGetGpuFabricInfo(h, byref(c_nvmlGpuFabricInfo_t)); state NOT_SUPPORTED (0) outside an NVSwitch"
    " fabric → omitted"
)


@dataclass(frozen=True)
class ModeFields:
    persistence_mode_enabled: bool | None = declare(
        Tier.SLOW,
        "Persistence mode (persistence_mode)",
        nvml="nvmlDeviceGetPersistenceMode",
        smi="persistence_mode",
        metric=Metric(
            "gpumon_persistence_mode_enabled", "gauge", "1 when persistence mode is on (nvidia-smi persistence_mode)."
        ),
        fake=True,
    )
    mig_mode_enabled: bool | None = declare(
        Tier.SLOW,
        "MIG mode current (mig.mode.current)",
        nvml="nvmlDeviceGetMigMode()[0]",
        smi="mig.mode.current",
        metric=Metric("gpumon_mig_mode_enabled", "gauge", "1 when MIG mode is on (nvidia-smi mig.mode.current)."),
        fake=False,
    )
    compute_mode: str | None = declare(
        Tier.SLOW,
        "Compute mode default|exclusive_process|prohibited (compute_mode)",
        nvml="nvmlDeviceGetComputeMode",
        conversion="0 default, 2 prohibited, 3 exclusive_process",
        smi="compute_mode",
        metric=Metric(
            "gpumon_compute_mode_info",
            "gauge",
            "Compute mode default|exclusive_process|prohibited as a label (nvidia-smi compute_mode).",
            labels=("mode",),
            samples=info_label,
        ),
        fake="default",
    )
    fabric_state: str | None = declare(
        Tier.SLOW,
        "NVSwitch fabric registration not_started|in_progress|completed (nvidia-smi -q Fabric State)",
        nvml=_FABRIC,
        conversion="1 not_started, 2 in_progress, 3 completed",
        smi="-q Fabric: State",
        metric=Metric(
            "gpumon_fabric_state_info",
            "gauge",
            "NVSwitch fabric registration state not_started|in_progress|completed as a label, on GPUs in a fabric"
            " (nvidia-smi -q Fabric State).",
            labels=("state",),
            samples=info_label,
        ),
        fake="completed",
    )
    fabric_status_ok: bool | None = declare(
        Tier.SLOW,
        "The fabric registration's status is success (nvidia-smi -q Fabric Status: Success)",
        nvml=_FABRIC,
        conversion="status == NVML_SUCCESS",
        smi="-q Fabric: Status",
        metric=Metric(
            "gpumon_fabric_status_ok",
            "gauge",
            "1 when the fabric registration succeeded, 0 when it failed or is not done; on GPUs in a fabric"
            " (nvidia-smi -q Fabric Status).",
        ),
        fake=True,
    )
