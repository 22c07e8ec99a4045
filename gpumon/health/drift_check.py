"""Drift from the inventory baseline as the health service asks for it: every scrape and the alert timer
ask for the report, yet the PCI bus and what drift reads of a snapshot rarely change, so both are kept."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpumon.health.drift import drift, drift_inputs
from gpumon.health.inventory import Inventory, pci_gpus
from gpumon.health.peers import peer_findings
from gpumon.model.findings import Finding
from gpumon.model.snapshot import Snapshot
from gpumon.util.reuse import Reuse

PCI_RESCAN_SECONDS = 30.0


class DriftCheck:
    """The PCI scan and the drift it last gave. Not thread-safe: the owner locks."""

    def __init__(self, sysfs: Path | None, monotonic: Callable[[], float]) -> None:
        """``sysfs``: the root of the sysfs tree the PCI bus is read from, None when the GPUs are not the
        host's (simulated); ``monotonic``: the clock of the rescans, in seconds."""
        self._sysfs = sysfs
        self._monotonic = monotonic
        self._pci_cache: tuple[float, list[str]] | None = None
        self._drift: Reuse[list[Finding]] = Reuse()
        """The drift of the very baseline and PCI scan, the expected count and the ``drift_inputs`` of a
        snapshot (equal values)."""

    def pci_gpus(self) -> list[str] | None:
        """NVIDIA GPUs on the PCI bus, re-read from sysfs at most every PCI_RESCAN_SECONDS (scrapes are frequent)."""
        if self._sysfs is None:
            return None
        now = self._monotonic()
        if self._pci_cache is None or now - self._pci_cache[0] >= PCI_RESCAN_SECONDS:
            self._pci_cache = (now, pci_gpus(self._sysfs))
        return self._pci_cache[1]

    def drift(self, baseline: Inventory | None, snapshot: Snapshot, expected_gpu_count: int | None) -> list[Finding]:
        """drift() of ``baseline`` and ``snapshot`` and the links judged against the model and the peers
        (gpumon.health.peers), worked out again only when the baseline, the PCI scan or
        what drift reads of the snapshot changed (a new snapshot comes every poll, yet its identity, links
        and PCIe widths rarely change)."""
        pci = self.pci_gpus()

        def judged() -> list[Finding]:
            found = drift(baseline, snapshot, pci, expected_gpu_count)
            return found + peer_findings(baseline, snapshot, found)  # links from the first poll on

        return self._drift.get(
            judged,
            same=(baseline, pci),
            equal=(expected_gpu_count, drift_inputs(snapshot)),
        )
