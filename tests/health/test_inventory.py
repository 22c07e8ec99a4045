"""Expected inventory and drift, with a fake sysfs tree (read-only on a real host)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.health.drift import drift
from gpumon.health.inventory import Inventory, inventory_of, pci_gpus
from gpumon.model.findings import CRITICAL, WARNING
from gpumon.model.snapshot import Snapshot
from gpumon.util.state.files import health_dir
from tests.helpers import run_cli


def fake_sysfs(root: Path, devices: dict[str, tuple[str, str]]) -> Path:
    """``/sys/bus/pci/devices/<bdf>/{vendor,class}`` for each device."""
    for bdf, (vendor, klass) in devices.items():
        d = root / "bus" / "pci" / "devices" / bdf
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(klass + "\n")
    return root


def two_gpu_snapshot(**gpu1: object) -> Snapshot:
    snapshot = Poller(FakeBackend.from_mapping({"count": 2}), SnapshotStore()).poll()
    if gpu1:
        gpus = (snapshot.gpus[0], dataclasses.replace(snapshot.gpus[1], **gpu1))
        snapshot = dataclasses.replace(snapshot, gpus=gpus)
    return snapshot


def kinds(findings: list) -> list[tuple[str, str, int | None]]:  # type: ignore[type-arg]
    return [(f.kind, f.severity, f.gpu) for f in findings]


def test_only_nvidia_gpus_count_from_sysfs(tmp_path: Path) -> None:
    root = fake_sysfs(
        tmp_path,
        {
            "0000:18:00.0": ("0x10de", "0x030200"),  # H100/H200: 3D controller
            "0000:28:00.0": ("0x10de", "0x030000"),  # VGA-compatible NVIDIA GPU
            "0000:28:00.1": ("0x10de", "0x040300"),  # its audio function
            "0000:05:00.0": ("0x10de", "0x068000"),  # NVSwitch (bridge class)
            "0000:00:1f.0": ("0x8086", "0x060100"),
        },
    )
    assert pci_gpus(root) == ["00000000:18:00.0", "00000000:28:00.0"]
    assert pci_gpus(tmp_path / "absent") == []


def test_gpu_on_the_pci_bus_but_not_in_nvml_is_critical(tmp_path: Path) -> None:
    snapshot = two_gpu_snapshot()
    root = fake_sysfs(
        tmp_path,
        {
            "0000:18:00.0": ("0x10de", "0x030200"),
            "0000:28:00.0": ("0x10de", "0x030200"),
            "0000:38:00.0": ("0x10de", "0x030200"),  # fell off the bus before gpumon started
        },
    )
    findings = drift(None, snapshot, pci_gpus(root))
    assert kinds(findings) == [("gpu_missing", CRITICAL, None)]
    assert findings[0].reason() == (
        "node: GPU at PCI 00000000:38:00.0 is on the PCI bus but NVML does not list it: reboot node"
    )


def test_fewer_gpus_than_the_baseline(tmp_path: Path) -> None:
    baseline = inventory_of(two_gpu_snapshot(), 0.0)
    snapshot = two_gpu_snapshot()
    one = dataclasses.replace(snapshot, gpus=snapshot.gpus[:1])
    findings = drift(baseline, one, None)
    assert kinds(findings) == [("gpu_count", CRITICAL, None)]
    assert findings[0].summary == "1 GPUs seen, 2 expected (missing: 00000000:28:00.0)"
    assert kinds(drift(None, one, None, expected_gpu_count=2)) == [("gpu_count", CRITICAL, None)]


def test_nvml_down_with_a_baseline_is_zero_gpus_seen() -> None:
    baseline = inventory_of(two_gpu_snapshot(), 0.0)
    down = Snapshot(timestamp_seconds=0, monotonic_seconds=0, nvml_up=False, nvml_error="Driver Not Loaded")
    assert (
        drift(baseline, down, None)[0].summary
        == "0 GPUs seen, 2 expected (missing: 00000000:18:00.0, 00000000:28:00.0); NVML: Driver Not Loaded"
    )


def test_link_and_version_drift() -> None:
    baseline = inventory_of(two_gpu_snapshot(), 0.0)
    links = {str(i): i != 7 for i in range(18)}
    snapshot = two_gpu_snapshot(nvlink_up=links, pcie_link_width=8, vbios_version="96.00.AF.00.02", p2p_status=())
    snapshot = dataclasses.replace(snapshot, host=dataclasses.replace(snapshot.host, driver_version="590.1"))
    found = {(f.kind, f.severity, f.gpu): f.summary for f in drift(baseline, snapshot, None)}
    assert found == {
        ("nvlink_down", CRITICAL, 1): "17 of 18 NVLinks up (down: 7)",
        ("pcie_degraded", WARNING, 1): "PCIe link trained at x8 of x16",
        ("p2p_lost", WARNING, 1): "P2P no longer works: 0:atomics, 0:nvlink, 0:read, 0:write",
        ("vbios_changed", WARNING, 1): "VBIOS 96.00.AF.00.02, baseline 96.00.AF.00.01 "
        "(gpumon health accept-inventory if intended)",
        (
            "driver_changed",
            WARNING,
            None,
        ): "driver 590.1, baseline 580.159.04 (gpumon health accept-inventory if intended)",
    }


def test_inventory_round_trips_through_json() -> None:
    inventory = inventory_of(two_gpu_snapshot(), 12.5)
    assert Inventory.from_json(inventory.to_json()) == inventory
    assert Inventory.from_json({"version": 99}) is None


def test_first_run_records_the_baseline_and_accept_inventory_replaces_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = run_cli("health", "--local", "--backend", "fake", "--fake-gpus", "2", "--state-dir", str(state))
    assert first.returncode == 0, first.stdout + first.stderr
    assert (health_dir(state, "fake") / "inventory.json").exists()  # simulated GPUs: a state of their own

    fewer = run_cli("health", "--local", "--backend", "fake", "--fake-gpus", "1", "--state-dir", str(state))
    assert fewer.returncode == 2
    assert "1 GPUs seen, 2 expected (missing: 00000000:28:00.0)" in fewer.stdout

    accepted = run_cli("health", "accept-inventory", "--backend", "fake", "--fake-gpus", "1", "--state-dir", str(state))
    assert accepted.returncode == 0
    assert (
        accepted.stdout.strip() == "inventory accepted: 1 GPU(s), driver 580.159.04 (was 2 GPU(s), driver 580.159.04)"
    )
    again = run_cli("health", "--local", "--backend", "fake", "--fake-gpus", "1", "--state-dir", str(state))
    assert again.returncode == 0, again.stdout


def test_gpumon_health_names_a_gpu_missing_from_nvml_in_a_fake_sysfs_tree(tmp_path: Path) -> None:
    root = fake_sysfs(
        tmp_path / "sys",
        {
            "0000:18:00.0": ("0x10de", "0x030200"),
            "0000:28:00.0": ("0x10de", "0x030200"),
            "0000:38:00.0": ("0x10de", "0x030200"),
        },
    )
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"health:\n  sysfs_root: {root}\n")
    done = run_cli(
        "health", "--local", "--config", str(config), "--backend", "fake", "--state-dir", str(tmp_path / "s"), "--json"
    )
    assert done.returncode == 2
    import json

    report = json.loads(done.stdout)
    assert report["status"] == "CRITICAL"
    assert (
        report["reason"] == "node: GPU at PCI 00000000:38:00.0 is on the PCI bus but NVML does not list it: reboot node"
    )
