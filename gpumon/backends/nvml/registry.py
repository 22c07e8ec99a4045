"""The reader modules, one per NVML subsystem, and their readers collected by tier."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from gpumon.backends.nvml import (
    clocks,
    ecc,
    fabric,
    fans,
    identity,
    modes,
    nvlink,
    pcie,
    power,
    processes,
    profiling,
    temperature,
    topology,
    utilization,
)
from gpumon.backends.nvml.reader import ReaderSpec
from gpumon.model.snapshot import Tier

SUBSYSTEMS: tuple[ModuleType, ...] = (
    identity,
    utilization,
    temperature,
    power,
    clocks,
    fans,
    nvlink,
    processes,
    pcie,
    profiling,
    ecc,
    modes,
    fabric,
    topology,
)
"""The reader modules; within a tier, readers run in this order and then in their module's order
(identity before topology: topology uses the peers' bus ids that identity read)."""


def collect_readers(modules: Iterable[ModuleType] = SUBSYSTEMS) -> dict[Tier, tuple[ReaderSpec, ...]]:
    """Every module's ``READERS``, by tier, in module order."""
    specs: list[ReaderSpec] = [spec for module in modules for spec in module.READERS]
    return {tier: tuple(s for s in specs if s.tier is tier) for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC)}
