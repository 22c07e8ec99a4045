"""The reader modules, one per NVML subsystem, and their readers collected by tier."""

from __future__ import annotations

from collections.abc import Iterable
from types import ModuleType

from gpumon.backends.nvml import (
    clocks,
    ecc,
    fans,
    gpm,
    identity,
    modes,
    nvlink,
    pcie,
    power,
    processes,
    thermal,
    topology,
    usage,
)
from gpumon.backends.nvml.reader import ReaderSpec
from gpumon.model.snapshot import Tier

SUBSYSTEMS: tuple[ModuleType, ...] = (
    identity,
    usage,
    thermal,
    power,
    clocks,
    fans,
    nvlink,
    processes,
    pcie,
    gpm,
    ecc,
    modes,
    topology,
)
"""The reader modules, each named as the group of gpumon/model/fields/ whose fields it reads; within a
tier, readers run in this order and then in their module's order (identity before topology: topology
uses the peers' bus ids that identity read)."""


def collect_readers(modules: Iterable[ModuleType] = SUBSYSTEMS) -> dict[Tier, tuple[ReaderSpec, ...]]:
    """Every module's ``READERS``, by tier, in module order."""
    specs: list[ReaderSpec] = [spec for module in modules for spec in module.READERS]
    return {tier: tuple(s for s in specs if s.tier is tier) for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC)}
