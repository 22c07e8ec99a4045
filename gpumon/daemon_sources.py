"""The extra sources of the daemon's /metrics, added to the collector by name, in one visible list.

Those of ``exporter.sources`` (gpumon.config.exporter_sources) are added only when on, each waited for
its budget at most (gpumon.util.budget): the burn results, energy per owner (a listener on the poll
thread besides), the health series (built ahead on the poll thread), and the report of the host's
figures, which the poller reads within their own budget. The DCGM-compatible source is added with
``--compat`` only (its module is loaded only then).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from gpumon.backends.base import GpuBackend
from gpumon.collect.energy import FLUSH_POLLS, OwnerEnergy
from gpumon.collect.host_figures import HostFigureReader
from gpumon.collect.store import SnapshotStore
from gpumon.config.exporter_sources import SourceSettings
from gpumon.config.file import Config
from gpumon.exposition.burn_results import BurnResultsCollector
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.extra_sources import NoFamilies
from gpumon.exposition.read_errors import ReadErrorsCollector
from gpumon.exposition.simulated import SimulatedSource
from gpumon.health.unjudged import UnjudgedCollector
from gpumon.model.families import FamilySource
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid_catalog import XidCatalog
from gpumon.util.budget import Budgeted

if TYPE_CHECKING:
    from gpumon.exposition.dcgm import DcgmCompatCollector

HostFigures = Budgeted[[], dict[str, object]]


class EnergyListener:
    """The store listener of energy per owner: keeps each snapshot, and every ``FLUSH_POLLS`` has them
    accounted by ``flush`` (on its own thread, within its budget: OverBudget when it hangs)."""

    def __init__(self, owners: OwnerEnergy, flush: Budgeted[[], None]) -> None:
        self._owners = owners
        self._flush = flush

    def __repr__(self) -> str:
        return "EnergyListener(owner_energy)"

    def __call__(self, snapshot: Snapshot) -> None:
        if self._owners.take(snapshot) >= FLUSH_POLLS:
            self._flush()


def host_figures_reader(setting: SourceSettings) -> HostFigures | None:
    """The poller's read of the host's CPU and memory, within its budget; None when turned off."""
    return Budgeted("host_figures", HostFigureReader(), setting.budget_seconds) if setting.enabled else None


def add_sources(
    collector: GpumonCollector,
    config: Config,
    backend: GpuBackend,
    store: SnapshotStore,
    catalog: XidCatalog,
    *,
    alerts: FamilySource,
    health: FamilySource,
    host_figures: HostFigures | None,
    burn_root: Path,
) -> DcgmCompatCollector | None:
    """Every extra source of ``collector``, in the order /metrics serves them; the DCGM one, if any."""
    sources = config.exporter.sources
    collector.add("alerts", alerts)
    if sources.burn.enabled:
        collector.add("burn", BurnResultsCollector(burn_root), budget_seconds=sources.burn.budget_seconds)
    collector.add("unjudged", UnjudgedCollector(config.state_dir))  # prologs that let a job through
    if sources.owner_energy.enabled:  # gpumon/collect/energy.py
        owners, budget = OwnerEnergy(config.state_dir), sources.owner_energy.budget_seconds
        flush = Budgeted("owner_energy", owners.flush, budget)  # asked by the poll thread every FLUSH_POLLS
        store.subscribe(EnergyListener(owners, flush))
        collector.add("owner_energy", owners, budget_seconds=budget, also=[flush])  # a late flush fails it
    collector.add("simulated", SimulatedSource(backend.simulated))
    if backend.per_reader_errors:  # per GPU and reader: a field's error, not a lost GPU
        collector.add("read_errors", ReadErrorsCollector(backend.read_errors))
    if sources.health.enabled:
        collector.add("health", health, per_snapshot=True, budget_seconds=sources.health.budget_seconds)
    if host_figures is not None:  # gpumon_host_* come with the snapshot: only the report here
        collector.add("host_figures", NoFamilies(), also=[host_figures])
    if not config.exporter.compat:
        return None
    from gpumon.exposition.dcgm import DcgmCompatCollector, node_name  # only with --compat dcgm / dcgm-4.9

    dcgm = DcgmCompatCollector(
        store,
        node_name(os.environ),
        catalog,
        sets=config.exporter.compat,
        hostname_label=config.exporter.compat_hostname_label,
        labels=config.exporter.compat_labels,
    )
    collector.add("dcgm", dcgm, per_snapshot=True)
    return dcgm
