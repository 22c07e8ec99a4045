"""--compat dcgm: dcgm-exporter's names, labels and units from gpumon's snapshot."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from gpumon.collect.store import SnapshotStore
from gpumon.exposition.dcgm import DcgmCompatCollector
from gpumon.exposition.dcgm_table import clock_events_mask
from gpumon.exposition.openmetrics import render as render_openmetrics
from gpumon.exposition.registry import MetricsOf
from gpumon.exposition.text import render
from gpumon.model.families import SealedFamilyError
from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, Snapshot
from gpumon.model.xid_catalog import XidCatalog

MIB = 1024 * 1024
LABELS = {
    "gpu": "0",
    "UUID": "GPU-aaaa",
    "pci_bus_id": "00000000:18:00.0",
    "device": "nvidia0",
    "modelName": "NVIDIA H200",
    "Hostname": "gpu-node-1",
    "DCGM_FI_DRIVER_VERSION": "580.159.04",
}


def busy_gpu() -> GpuSnapshot:
    return GpuSnapshot(
        index=0,
        uuid="GPU-aaaa",
        name="NVIDIA H200",
        pci_bus_id="00000000:18:00.0",
        utilization_ratio=0.97,
        memory_bandwidth_utilization_ratio=0.41,
        memory_used_bytes=81920 * MIB,
        memory_free_bytes=61301 * MIB + 12345,
        memory_total_bytes=143771 * MIB,
        memory_reserved_bytes=550 * MIB,
        temperature_celsius=71.0,
        memory_temperature_celsius=80.0,
        power_watts=655.5,
        power_limit_watts=700.0,
        energy_joules_total=123456.789,
        clocks_hertz={"sm": 1980e6, "memory": 3201e6, "graphics": 1980e6},
        clock_events_active={"gpu_idle": False, "sw_power_cap": True, "hw_thermal_slowdown": True, "sync_boost": False},
        throttle_seconds_total={"power": 1.5, "thermal": 0.25},
        pcie_replays_total=7,
        pcie_throughput_bytes_per_second={"tx": 2048.0, "rx": 4096.0},
        ecc_errors_total={
            "corrected_volatile": 3,
            "uncorrected_volatile": 1,
            "corrected_aggregate": 30,
            "uncorrected_aggregate": 2,
        },
        remapped_rows={"correctable": 4, "uncorrectable": 1},
        row_remap_pending=False,
        row_remap_failure=True,
        nvlink_errors_total={"0": {"crc": 1, "replay": 2}, "1": {"crc": 3, "replay": 0}},
        sm_active_ratio=0.9,
        sm_occupancy_ratio=0.45,
        tensor_active_ratio=0.62,
        dram_active_ratio=0.7,
        fp16_active_ratio=0.3,
        gpm_throughput_bytes_per_second={"pcie_tx": 1e9, "pcie_rx": 2e9, "nvlink_tx": 3e11, "nvlink_rx": 2.5e11},
        xid_errors_total={"13": 3, "79": 1},
        xid_last_timestamp_seconds={"13": 1000.0, "79": 2000.0},
    )


def scrape(*gpus: GpuSnapshot, hostname: str = "gpu-node-1", catalog: XidCatalog | None = None) -> dict[str, dict]:
    store = SnapshotStore()
    store.publish(
        Snapshot(
            timestamp_seconds=1.0,
            monotonic_seconds=1.0,
            nvml_up=True,
            host=HostSnapshot(driver_version="580.159.04"),
            gpus=gpus,
        )
    )
    text = render(DcgmCompatCollector(store, hostname, catalog).families())
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {"type": family.type, "help": family.documentation, "samples": family.samples}
    return out


def value(families: dict[str, dict], name: str, gpu: str = "0") -> float:
    (sample,) = [s for s in families[name]["samples"] if s.labels["gpu"] == gpu]
    return float(sample.value)


def test_every_series_carries_dcgm_exporters_label_set() -> None:
    families = scrape(busy_gpu())
    sample = families["DCGM_FI_DEV_GPU_TEMP"]["samples"][0]
    assert sample.labels == LABELS


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("DCGM_FI_DEV_GPU_TEMP", 71.0),  # C
        ("DCGM_FI_DEV_MEMORY_TEMP", 80.0),
        ("DCGM_FI_DEV_POWER_USAGE", 655.5),  # W
        ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 700.0),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 123456789.0),  # mJ
        ("DCGM_FI_DEV_SM_CLOCK", 1980.0),  # MHz
        ("DCGM_FI_DEV_MEM_CLOCK", 3201.0),
        ("DCGM_FI_DEV_GPU_UTIL", 97.0),  # %
        ("DCGM_FI_DEV_MEM_COPY_UTIL", 41.0),
        ("DCGM_FI_DEV_FB_USED", 81920.0),  # MiB
        ("DCGM_FI_DEV_FB_FREE", 61301.0),  # whole MiB, like DCGM
        ("DCGM_FI_DEV_FB_TOTAL", 143771.0),
        ("DCGM_FI_DEV_FB_RESERVED", 550.0),
        ("DCGM_FI_DEV_POWER_VIOLATION", 1.5e9),  # ns, as dcgm-exporter (#589) and DCGM since 4.1
        ("DCGM_FI_DEV_THERMAL_VIOLATION", 0.25e9),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 7.0),
        ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", 2.0),  # KB/s
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 3.0),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1.0),
        ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 30.0),
        ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 2.0),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", 4.0),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1.0),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1.0),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", 0.0),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 4.0),  # summed over links
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 2.0),  # nvidia-smi nvlink -e: Replay Errors
        ("DCGM_FI_PROF_SM_ACTIVE", 0.9),  # ratios 0-1, as DCGM gives them
        ("DCGM_FI_PROF_SM_OCCUPANCY", 0.45),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.62),
        ("DCGM_FI_PROF_DRAM_ACTIVE", 0.7),
        ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", 0.3),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", 1e9),  # bytes/s, from GPM
        ("DCGM_FI_PROF_PCIE_RX_BYTES", 2e9),
        ("DCGM_FI_PROF_NVLINK_TX_BYTES", 3e11),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0x4 | 0x40),  # NVML bit values
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", 0x4 | 0x40),
    ],
)
def test_values_are_in_dcgm_units(name: str, expected: float) -> None:
    assert value(scrape(busy_gpu()), name) == pytest.approx(expected)


def test_xid_errors_is_the_last_xid_code_with_its_code_and_meaning() -> None:
    families = scrape(busy_gpu(), catalog=XidCatalog.load())
    (sample,) = families["DCGM_FI_DEV_XID_ERRORS"]["samples"]
    assert sample.value == 79.0
    assert sample.labels["err_code"] == "79"
    assert "fallen off the bus" in sample.labels["err_msg"]
    assert families["DCGM_FI_DEV_XID_ERRORS"]["type"] == "gauge"


def test_xid_errors_is_zero_on_a_gpu_without_xids() -> None:
    quiet = GpuSnapshot(
        index=1, uuid="GPU-bbbb", name="NVIDIA H200", xid_errors_total={}, xid_last_timestamp_seconds={}
    )
    families = scrape(quiet)
    (sample,) = families["DCGM_FI_DEV_XID_ERRORS"]["samples"]
    assert (sample.value, sample.labels["err_code"], sample.labels["gpu"]) == (0.0, "0", "1")


def test_types_follow_dcgm_exporter_where_prometheus_allows() -> None:
    families = scrape(busy_gpu())
    assert families["DCGM_FI_DEV_GPU_TEMP"]["type"] == "gauge"
    assert families["DCGM_FI_DEV_GPU_TEMP"]["help"] == "GPU temperature (in C)."
    # dcgm-exporter says "counter" for these; without a _total suffix they are exposed untyped
    for name in (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    ):
        assert families[name]["type"] == "unknown", name


def test_fields_the_gpu_does_not_report_are_omitted_not_zero() -> None:
    sparse = GpuSnapshot(index=0, uuid="GPU-aaaa", name="NVIDIA T4", temperature_celsius=50.0)
    families = scrape(sparse)
    assert set(families) == {"DCGM_FI_DEV_GPU_TEMP"}


def test_a_lost_gpu_has_no_dcgm_series_and_the_others_keep_theirs() -> None:
    lost = GpuSnapshot(index=1, uuid="GPU-bbbb", up=False, lost_reason="GPU is lost", name="NVIDIA H200")
    families = scrape(busy_gpu(), lost)
    assert {s.labels["gpu"] for s in families["DCGM_FI_DEV_GPU_TEMP"]["samples"]} == {"0"}


def test_hostname_label_is_left_out_when_empty() -> None:
    sample = scrape(busy_gpu(), hostname="")["DCGM_FI_DEV_GPU_TEMP"]["samples"][0]
    assert "Hostname" not in sample.labels


def test_no_snapshot_yet_means_no_series() -> None:
    assert list(DcgmCompatCollector(SnapshotStore(), "h").families()) == []


def test_clock_event_mask_uses_nvml_bits() -> None:
    assert clock_events_mask(None) is None
    assert clock_events_mask({}) == 0
    assert clock_events_mask({"gpu_idle": True, "display_clock_setting": True, "hw_slowdown": False}) == 0x101


def _collector(catalog: XidCatalog | None = None, hostname: str = "gpu-node-1") -> DcgmCompatCollector:
    store = SnapshotStore()
    idle = GpuSnapshot(
        index=1,
        uuid="GPU-bbbb",
        name="NVIDIA H200",
        pci_bus_id="00000000:28:00.0",
        temperature_celsius=30.0,
        xid_errors_total={},
        xid_last_timestamp_seconds={},
    )
    store.publish(
        Snapshot(
            timestamp_seconds=1.0,
            monotonic_seconds=1.0,
            nvml_up=True,
            host=HostSnapshot(driver_version="580.159.04"),
            gpus=(busy_gpu(), idle),
        )
    )
    return DcgmCompatCollector(store, hostname, catalog)


def _exposition(openmetrics: bool = False) -> str:
    families = _collector(XidCatalog.load()).families()
    return (render_openmetrics(families) if openmetrics else render(families).encode()).decode()


@pytest.mark.parametrize("catalog", [None, XidCatalog.load()])
@pytest.mark.parametrize("hostname", ["", 'odd "host"\\name'])
def test_exposition_is_what_prometheus_client_writes(catalog: XidCatalog | None, hostname: str) -> None:
    """The fast renderers write the DCGM families byte for byte as prometheus_client does."""
    collector = _collector(catalog, hostname)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsOf(collector))
    assert render(collector.families()).encode() == generate_latest(registry)
    assert render_openmetrics(collector.families()) == generate_openmetrics(registry)
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION untyped" in render(collector.families())


def test_scrapes_of_one_snapshot_agree_and_a_reloaded_catalog_shows_at_the_next_scrape() -> None:
    collector = _collector(XidCatalog.load())
    first = render(collector.families())
    assert render(collector.families()) == first
    collector.set_catalog(XidCatalog.load({79: {"meaning": "Our own words for XID 79"}}))
    assert 'err_msg="Our own words for XID 79"' in render(collector.families()), "a reloaded catalog gives err_msg"


def test_openmetrics_exposition_is_valid() -> None:
    """Prometheus may negotiate OpenMetrics; every family must still parse there."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

    names = {f.name for f in parse_om(_exposition(openmetrics=True))}
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in names and "DCGM_FI_DEV_GPU_TEMP" in names


# The only complaints promtool may make are about dcgm-exporter's own names, which compatibility keeps.
INHERENT_LINTS = (
    "label names should be written in 'snake_case' not 'camelCase'",  # modelName
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'",
)


def test_promtool_check_metrics_finds_nothing_but_dcgms_own_naming() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); CI installs it")
    proc = subprocess.run(
        [promtool, "check", "metrics"], input=_exposition(), capture_output=True, text=True, timeout=60, check=False
    )
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    unexpected = [line for line in complaints if not any(lint in line for lint in INHERENT_LINTS)]
    assert unexpected == []
    assert proc.returncode in (0, 3)  # 3: lint findings only (all of them inherent, checked above)


def test_docs_map_every_dcgm_family() -> None:
    from pathlib import Path

    from gpumon.exposition.dcgm_table import dcgm_fields

    doc = (Path(__file__).resolve().parent.parent / "docs" / "dcgm-compat.md").read_text(encoding="utf-8")
    for spec in dcgm_fields():
        assert f"| `{spec.name}` | {spec.kind} |" in doc, spec.name


def test_every_scrape_of_a_snapshot_gets_its_families_built_once_and_sealed() -> None:
    """The families of one snapshot are built once and handed to every scrape of it: sealed, so
    nothing can add a sample to what a later scrape serves again."""
    collector = _collector(XidCatalog.load())
    first = collector.families()
    assert first and all(family.sealed for family in first)
    again = collector.families()
    assert len(again) == len(first) and all(a is b for a, b in zip(again, first, strict=True))
    with pytest.raises(SealedFamilyError):
        first[0].add(first[0].samples[0][0], 1.0)
    collector.set_catalog(XidCatalog.load())  # another catalog: the XID family's meanings are built again
    assert collector.families()[0] is not first[0]
