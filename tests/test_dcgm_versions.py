"""The DCGM name sets of dcgm-exporter's versions: <= 4.8.x (``dcgm``), 4.9 (``dcgm-4.9``), or both.

Checked against the versions' default-counters CSVs and DCGM 4.6's deprecated aliases, kept in
tests/data/dcgm/ (README.md there says where each came from). The dashboards and alerts of each
version against a real Prometheus are in tests/test_dcgm_version_dashboards.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpumon.collect.store import SnapshotStore
from gpumon.config.file import ConfigError, load
from gpumon.exposition.dcgm import DcgmCompatCollector, node_name
from gpumon.exposition.dcgm_sets import COMPAT_LABELS, HOSTNAME_LABELS, SAME_UNIT_4_9, SETS
from gpumon.exposition.text import render
from gpumon.model.fields.processes import ProcessSnapshot
from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, Snapshot
from tests.helpers import DATA, REPO
from tests.test_dcgm_compat import busy_gpu

MIB = 1024 * 1024
CSV = DATA / "dcgm"


def full_gpu() -> GpuSnapshot:
    """A GPU with every field the default CSVs name."""
    return dataclasses.replace(
        busy_gpu(),
        encoder_utilization_ratio=0.25,
        decoder_utilization_ratio=0.5,
        graphics_active_ratio=0.95,
        serial="1654123456789",
        vbios_version="96.00.AF.00.01",
    )


def scrape(
    *gpus: GpuSnapshot,
    sets: Sequence[str] = ("dcgm-4.9",),
    hostname: str = "gpu-node-1",
    hostname_label: str | None = None,
    labels: Sequence[str] = (),
) -> dict[str, Any]:
    store = SnapshotStore()
    store.publish(
        Snapshot(
            timestamp_seconds=1.0,
            monotonic_seconds=1.0,
            nvml_up=True,
            host=HostSnapshot(driver_version="580.159.04", nvml_version="13.580.159.04"),
            gpus=gpus or (full_gpu(),),
        )
    )
    collector = DcgmCompatCollector(store, hostname, sets=sets, hostname_label=hostname_label, labels=labels)
    text = render(collector.families())
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, Any], name: str) -> float:
    (sample,) = families[name].samples
    return float(sample.value)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1980e6),  # Hz (was MHz)
        ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 3201e6),
        ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 123456.789),  # J (was mJ)
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", 0.97),  # ratio (was %)
        ("DCGM_FI_DEV_MEMORY_UTIL_RATIO", 0.41),
        ("DCGM_FI_DEV_ENC_UTIL_RATIO", 0.25),
        ("DCGM_FI_DEV_DEC_UTIL_RATIO", 0.5),
        ("DCGM_FI_DEV_FB_USED_BYTES", 81920 * MIB),  # bytes (was whole MiB)
        ("DCGM_FI_DEV_FB_FREE_BYTES", 61301 * MIB + 12345),
        ("DCGM_FI_DEV_FB_CAPACITY_BYTES", 143771 * MIB),
        ("DCGM_FI_DEV_FB_RESERVED_BYTES", 550 * MIB),
        ("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", 5.5e11),  # B/s (was MB/s)
        ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 71.0),  # renamed, same unit
        ("DCGM_FI_DEV_BOARD_POWER_WATTS", 655.5),
        ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 7.0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILED", 1.0),
        ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 0.62),
        ("DCGM_FI_DEV_POWER_VIOLATION", 1.5e9),  # ns, unchanged name
        ("DCGM_FI_DEV_XID_ERROR", 79.0),
    ],
)
def test_the_4_9_set_has_4_9s_names_and_units(name: str, expected: float) -> None:
    assert value(scrape(), name) == pytest.approx(expected)


def test_the_4_9_set_leaves_out_the_old_names() -> None:
    names = set(scrape())
    assert not names & {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"}
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" not in names  # DCGM's alias of DCGM_FI_DEV_CLOCKS_EVENT_REASONS


def test_the_4_9_set_labels_are_hostname_and_the_system_driver_version() -> None:
    (sample,) = scrape()["DCGM_FI_DEV_GPU_TEMP_CELSIUS"].samples
    assert sample.labels == {
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H200",
        "hostname": "gpu-node-1",
        "DCGM_FI_SYSTEM_DRIVER_VERSION": "580.159.04",
    }


@pytest.mark.parametrize(("spelling", "other"), [("hostname", "Hostname"), ("Hostname", "hostname")])
def test_the_host_label_spelling_is_selectable(spelling: str, other: str) -> None:
    for sets in (("dcgm",), ("dcgm-4.9",)):
        for family in scrape(sets=sets, hostname_label=spelling).values():
            for sample in family.samples:
                assert sample.labels[spelling] == "gpu-node-1" and other not in sample.labels


def active_rows(csv: str) -> tuple[list[str], list[str]]:
    """The metric and label rows of a default-counters CSV that are not commented out."""
    metrics, labels = [], []
    for line in (CSV / csv).read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, kind = (part.strip() for part in line.split(",")[:2])
        (labels if kind == "label" else metrics).append(name)
    return metrics, labels


NOT_PROVIDED = {"DCGM_FI_DEV_VGPU_LICENSE_STATUS"}  # vGPU guests only (docs/dcgm-compat.md)


@pytest.mark.parametrize(
    ("csv", "sets", "hostname_label"),
    [
        ("default-counters-4.8.2.csv", ("dcgm",), None),
        ("default-counters-4.8.3.csv", ("dcgm",), "hostname"),
        ("default-counters-4.9.0.csv", ("dcgm-4.9",), None),
        ("default-counters-4.8.2.csv", ("dcgm", "dcgm-4.9"), None),
        ("default-counters-4.9.0.csv", ("dcgm", "dcgm-4.9"), None),
    ],
)
def test_every_default_field_of_a_version_is_served_by_its_set(
    csv: str, sets: tuple[str, ...], hostname_label: str | None
) -> None:
    metrics, labels = active_rows(csv)
    families = scrape(sets=sets, hostname_label=hostname_label)
    missing = [name for name in metrics if name not in families and name not in NOT_PROVIDED]
    assert missing == []
    for name in metrics:
        if name in families:
            for sample in families[name].samples:
                assert set(labels) <= set(sample.labels), f"{name}: {sample.labels}"


def test_each_4_9_rename_of_the_same_unit_is_a_dcgm_4_6_alias() -> None:
    aliases = dict(line.split() for line in (CSV / "dcgm-4.6-deprecated-aliases.txt").read_text().splitlines())
    assert {old: aliases.get(old) for old in SAME_UNIT_4_9} == dict(SAME_UNIT_4_9)


def test_both_sets_serve_each_name_once_and_a_shared_one_with_both_spellings() -> None:
    families = scrape(sets=("dcgm", "dcgm-4.9"))
    assert {
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_XID_ERROR",
    } <= set(families)
    (old,) = families["DCGM_FI_DEV_GPU_TEMP"].samples
    assert old.labels["Hostname"] == "gpu-node-1" and "hostname" not in old.labels
    assert old.labels["DCGM_FI_DRIVER_VERSION"] == "580.159.04"
    (shared,) = families["DCGM_FI_PROF_PCIE_TX_BYTES"].samples  # neither set renamed it: one series
    assert shared.labels["Hostname"] == shared.labels["hostname"] == "gpu-node-1"
    assert shared.labels["DCGM_FI_DRIVER_VERSION"] == shared.labels["DCGM_FI_SYSTEM_DRIVER_VERSION"]


def test_the_host_label_is_node_name_when_set_as_dcgm_exporter_does() -> None:
    assert node_name({"NODE_NAME": "k8s-node-7"}) == "k8s-node-7"
    assert node_name({}) == node_name({"NODE_NAME": ""}) != ""


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (("dcgm",), {"DCGM_FI_NVML_VERSION", "DCGM_FI_DEV_SERIAL", "DCGM_FI_DEV_VBIOS_VERSION"}),
        (("dcgm-4.9",), {"DCGM_FI_SYSTEM_NVML_VERSION", "DCGM_FI_DEV_BOARD_SERIAL", "DCGM_FI_DEV_VBIOS_VERSION"}),
    ],
)
def test_optional_label_rows_are_served_when_asked(sets: tuple[str, ...], expected: set[str]) -> None:
    plain = scrape(sets=sets)
    (sample,) = next(iter(plain.values())).samples
    assert not expected & set(sample.labels)
    asked = scrape(sets=sets, labels=("nvml_version", "serial", "vbios_version"))
    for family in asked.values():
        for sample in family.samples:
            values = {k: v for k, v in sample.labels.items() if k in expected}
            assert sorted(values.values()) == ["13.580.159.04", "1654123456789", "96.00.AF.00.01"], family.name


def test_hpc_job_labels_a_series_per_slurm_job_of_the_gpu() -> None:
    """dcgm-exporter's hpc_job (its --hpc-job-mapping-dir): one series per job on the GPU, none on an idle GPU."""
    busy = dataclasses.replace(
        full_gpu(),
        processes=(
            ProcessSnapshot(pid=10, slurm_job_id="4242"),
            ProcessSnapshot(pid=11, slurm_job_id="4242"),
            ProcessSnapshot(pid=12, slurm_job_id="977"),
        ),
    )
    idle = dataclasses.replace(full_gpu(), index=1, uuid="GPU-bbbb", processes=())
    families = scrape(busy, idle, sets=("dcgm",), labels=("hpc_job",))
    samples = families["DCGM_FI_DEV_GPU_TEMP"].samples
    assert sorted((s.labels["gpu"], s.labels.get("hpc_job")) for s in samples) == [
        ("0", "4242"),
        ("0", "977"),
        ("1", None),
    ]


def _load(exporter: dict[str, Any], tmp_path: Any) -> list[str]:
    path = tmp_path / "gpumon.yaml"
    path.write_text(yaml.safe_dump({"exporter": exporter}))
    try:
        load(path, env={})
    except ConfigError as e:
        return e.problems
    return []


@pytest.mark.parametrize(
    "exporter",
    [
        {"compat": ["dcgm-4.8"]},
        {"compat": "dcgm", "compat_hostname_label": "HOSTNAME"},
        {"compat": "dcgm", "compat_labels": ["brand"]},
        {"compat_hostname_label": "hostname"},
    ],
)
def test_a_bad_compat_setting_is_one_line_naming_it(exporter: dict[str, Any], tmp_path: Any) -> None:
    (problem,) = _load(exporter, tmp_path)
    assert "\n" not in problem and "exporter.compat" in problem


def test_both_sets_and_the_options_load(tmp_path: Any) -> None:
    exporter = {"compat": "dcgm,dcgm-4.9", "compat_hostname_label": "hostname", "compat_labels": ["hpc_job"]}
    assert _load(exporter, tmp_path) == []


def test_the_config_knows_every_set_and_label() -> None:
    from gpumon.config import compat as compat_config

    assert compat_config.COMPAT_MODES == SETS
    assert set(compat_config.COMPAT_LABELS) == set(COMPAT_LABELS)
    assert compat_config.COMPAT_HOSTNAME_LABELS == HOSTNAME_LABELS


def test_the_daemonset_sets_node_name_from_the_downward_api() -> None:
    docs = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "gpumon-daemonset.yaml").read_text()))
    (daemonset,) = [d for d in docs if d and d.get("kind") == "DaemonSet"]
    (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "gpumon"]
    env = {e["name"]: e for e in container.get("env", [])}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
