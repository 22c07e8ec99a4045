"""Fans (fast tier): each fan's speed, as nvidia-smi fan.speed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumon.model.fields.spec import Dcgm, Metric, Tier, declare_mapping

if TYPE_CHECKING:
    from gpumon.model.snapshot import GpuSnapshot


def _fan_percent(gpu: GpuSnapshot) -> float | None:
    fans: Mapping[str, float] | None = gpu.fan_speed_ratios
    if not fans:
        return None
    return 100.0 * sum(fans.values()) / len(fans)


@dataclass(frozen=True)
class FanFields:
    fan_speed_ratios: Mapping[str, float] | None = declare_mapping(
        Tier.FAST,
        "Fan speed by fan index, 0-1 (fan.speed / 100)",
        nvml="nvmlDeviceGetNumFans (once), nvmlDeviceGetFanSpeed_v2",
        conversion="% / 100",
        smi="fan.speed",
        metric=Metric(
            "gpumon_fan_speed_ratio",
            "gauge",
            "Fan speed by fan, 0-1 of its maximum (nvidia-smi fan.speed / 100).",
            labels=("fan",),
        ),
        dcgm=Dcgm(
            "DCGM_FI_DEV_FAN_SPEED",
            "gauge",
            "Fan speed (in %), the mean of the GPU's fans.",
            unit="%",
            value=_fan_percent,
            source="mean of fan_speed_ratios × 100",
        ),
    )
