"""When the inventory baseline is recorded, and what an accepted inventory silences: no baseline while a GPU
on the PCI bus is missing from NVML (it would call the broken host normal); an accepted narrow PCIe link is
quiet; what accept-inventory cannot silence is said when accepting; a GPU given to vfio-pci is not missing."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.health.config import HealthConfig
from gpumon.health.inventory import pci_gpus
from gpumon.health.service import HealthService
from gpumon.model.xid_catalog import XidCatalog
from tests.helpers import run_cli

GPU0, GPU1 = "0000:18:00.0", "0000:28:00.0"  # the fake backend's first two bus ids


def sysfs(root: Path, *bdfs: str, driver: str | None = None) -> Path:
    """A fake /sys listing NVIDIA 3D controllers at ``bdfs`` (bound to ``driver`` when given)."""
    shutil.rmtree(root, ignore_errors=True)
    for bdf in bdfs:
        d = root / "bus" / "pci" / "devices" / bdf
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
        if driver is not None:
            (root / "bus" / "pci" / "drivers" / driver).mkdir(parents=True, exist_ok=True)
            (d / "driver").symlink_to(root / "bus" / "pci" / "drivers" / driver)
    return root


def health(tmp_path: Path, gpus: int, *extra: str) -> tuple[int, str, str]:
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"health: {{sysfs_root: {tmp_path / 'sys'}}}\n")
    done = run_cli(
        "health", *extra, "--local", "--backend", "fake", "--fake-gpus", str(gpus),
        "--config", str(config), "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    return done.returncode, done.stdout, done.stderr


def test_no_baseline_is_recorded_while_a_gpu_on_the_pci_bus_is_missing(tmp_path: Path) -> None:
    sysfs(tmp_path / "sys", GPU0, GPU1)
    code, out, err = health(tmp_path, 1)  # GPU 1 fell off before gpumon first ran
    assert code == 2 and "GPU at PCI 00000000:28:00.0 is on the PCI bus but NVML does not list it" in out
    assert not list((tmp_path / "state").rglob("inventory.json"))
    assert "not recording the inventory baseline" in err

    code, out, _ = health(tmp_path, 2)  # repaired: both seen, the baseline is the two of them
    assert code == 0, out

    sysfs(tmp_path / "sys", GPU0)  # later it falls off the bus for good, gone from PCI too
    code, out, _ = health(tmp_path, 1)
    assert code == 2 and "1 GPUs seen, 2 expected (missing: 00000000:28:00.0)" in out, out


def test_accept_inventory_says_what_it_cannot_silence(tmp_path: Path) -> None:
    sysfs(tmp_path / "sys", GPU0, GPU1)
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"health: {{sysfs_root: {tmp_path / 'sys'}}}\n")
    done = run_cli(
        "health", "accept-inventory", "--backend", "fake", "--fake-gpus", "1",
        "--config", str(config), "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "still reported: CRITICAL GPU at PCI 00000000:28:00.0 is on the PCI bus but NVML does not list it"
        in done.stdout
    )


def narrow(width: int) -> FakeBackend:
    return FakeBackend.from_mapping({"gpus": [{"values": {"pcie_link_width": width, "pcie_link_width_max": 16}}]})


def test_an_accepted_narrow_pcie_link_is_quiet_until_it_narrows_again(tmp_path: Path) -> None:
    config = HealthConfig(sysfs_root=tmp_path / "nosys", boot_id_path=tmp_path / "boot_id")
    service = HealthService(tmp_path / "state", XidCatalog.load(), config)
    service.on_snapshot(Poller(narrow(8), SnapshotStore()).poll())
    assert service.report().reason() == "GPU 0 PCIe link trained at x8 of x16: inspect hardware"
    assert service.accept_inventory() is not None
    assert service.report().status == "OK"
    service.on_snapshot(Poller(narrow(4), SnapshotStore()).poll())
    assert service.report().reason() == "GPU 0 PCIe link trained at x4 of x16: inspect hardware"


def test_a_gpu_given_to_vfio_is_not_missing_from_nvml(tmp_path: Path) -> None:
    root = sysfs(tmp_path / "sys", GPU1, driver="vfio-pci")
    sysfs(tmp_path / "other", GPU0, driver="nvidia")
    assert pci_gpus(root) == []
    assert pci_gpus(tmp_path / "other") == ["00000000:18:00.0"]
