"""Modes an administrator can change while gpumon runs (slow tier), NVSwitch fabric registration and the
driver's recovery action."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumon.model.fields.spec import Dcgm, Metric, Sample, Tier, declare, info_label

if TYPE_CHECKING:
    from gpumon.model.snapshot import GpuSnapshot

_FABRIC = (
    "nvmlDeviceGetGpuFabricInfo(h, byref(c_nvmlGpuFabricInfo_t)); state NOT_SUPPORTED (0) outside an NVSwitch"
    " fabric → omitted"
)


MODES_SECONDS = 60.0
"""The daemon asks for persistence, MIG, compute and ECC mode at most this often: they change only
when an administrator changes them (MIG and ECC then need a GPU reset), and the four calls were
0.009 % of a core per GPU at every 10 s on 4 x H100 (docs/benchmarks.md). One-shot readers (once,
health, burn) read them every time."""
FABRIC_SECONDS = 30.0
"""The daemon asks for the NVSwitch fabric state at most this often (~0.35 ms of CPU per GPU on an
H100, 0.004 % of a core per GPU at every 10 s on 4 x H100): it changes when the fabric manager
registers the GPU, after boot or a reset. One-shot readers (once, health, burn) read it every time."""
RECOVERY_ACTIONS = {  # nvmlDeviceGpuRecoveryAction_t (NVML_GPU_RECOVERY_ACTION_*)
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
"""NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's value -> the ``recovery_action`` word."""
_RECOVERY_CODES = {word: code for code, word in RECOVERY_ACTIONS.items()}


def _not_completed(sample: Sample) -> bool:
    """``keep`` of gpumon_fabric_state_info: a state other than completed (gpumon_fabric_status_ok says that)."""
    return sample[0] != ("completed",)


def acted(sample: Sample) -> bool:
    """``keep`` of gpumon_recovery_action_info: an action other than none."""
    return sample[0] != ("none",)


def _recovery_code(gpu: GpuSnapshot) -> float | None:
    if gpu.recovery_action is None:
        return None
    word = gpu.recovery_action
    if word in _RECOVERY_CODES:
        return float(_RECOVERY_CODES[word])
    number = word.removeprefix("action_")  # a code this gpumon has no word for
    return float(number) if number.isdigit() else None


@dataclass(frozen=True)
class ModeFields:
    persistence_mode_enabled: bool | None = declare(
        Tier.SLOW,
        "Persistence mode (persistence_mode)",
        nvml="nvmlDeviceGetPersistenceMode",
        smi="persistence_mode",
        metric=Metric(
            "gpumon_persistence_mode_enabled",
            "gauge",
            "1 when persistence mode is on (nvidia-smi persistence_mode).",
            read_every_seconds=MODES_SECONDS,
        ),
        fake=True,
    )
    mig_mode_enabled: bool | None = declare(
        Tier.SLOW,
        "MIG mode current (mig.mode.current)",
        nvml="nvmlDeviceGetMigMode()[0]",
        smi="mig.mode.current",
        metric=Metric(
            "gpumon_mig_mode_enabled",
            "gauge",
            "1 when MIG mode is on (nvidia-smi mig.mode.current).",
            read_every_seconds=MODES_SECONDS,
        ),
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
            read_every_seconds=MODES_SECONDS,
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
            detail="zero_rows",
            keep=_not_completed,
            read_every_seconds=FABRIC_SECONDS,
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
            read_every_seconds=FABRIC_SECONDS,
        ),
        fake=True,
    )
    recovery_action: str | None = declare(
        Tier.SLOW,
        "What the driver says the GPU needs to recover: none|gpu_reset|node_reboot|drain_p2p|drain_and_reset|..."
        " (gpu_recovery_action)",
        nvml="nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 230); drivers without the field → omitted",
        conversion=", ".join(f"{code} {word}" for code, word in RECOVERY_ACTIONS.items()),
        smi="gpu_recovery_action (-q GPU Recovery Action)",
        metric=Metric(
            "gpumon_recovery_action_info",
            "gauge",
            "The recovery action the driver recommends, none|gpu_reset|node_reboot|drain_p2p|drain_and_reset|...,"
            " as a label (nvidia-smi gpu_recovery_action).",
            labels=("action",),
            samples=info_label,
            detail="zero_rows",
            keep=acted,
        ),
        dcgm=Dcgm(
            "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
            "gauge",
            "GPU recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset).",
            value=_recovery_code,
            source="recovery_action as NVML's code",
        ),
        fake="none",
    )
