"""gpumon health on a real GPU host, read-only: the PCI bus and NVML agree, the verdict is OK."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumon.backends.nvml import NvmlBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.health.inventory import pci_gpus
from gpumon.model.bus_id import normalize_bus_id
from tests.helpers import run_cli

pytestmark = pytest.mark.gpu


def test_every_nvidia_gpu_in_sysfs_is_listed_by_nvml(backend: NvmlBackend) -> None:
    snapshot = Poller(backend, SnapshotStore()).poll()
    nvml = sorted(normalize_bus_id(g.pci_bus_id or "") or "" for g in snapshot.gpus)
    assert pci_gpus(Path("/sys")) == nvml


def test_gpumon_health_on_a_healthy_host_is_ok_and_records_the_inventory(tmp_path: Path) -> None:
    # Without the kernel log: XIDs from earlier in this boot are history the host may have; NVML is the point here.
    done = run_cli(
        "health", "--local", "--backend", "nvml", "--state-dir", str(tmp_path), "--json",
        env={"GPUMON_KERNEL_LOG": "false"},
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 0, report
    assert report["status"] == "OK"
    inventory = json.loads((tmp_path / "health" / "inventory.json").read_text())
    assert inventory["gpus"] and all(g["nvlinks_up"] >= 0 for g in inventory["gpus"])
