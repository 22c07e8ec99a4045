"""The fields users asked for, from NVML to what they see: the row-remapper histogram, the GPU recovery
action, encoder/decoder utilization, the graphics engine's activity (GPM) and the NVLink data counters.

Each is read by the real backend from the fake pynvml module, served as a gpumon_* family and as
its dcgm-exporter twin, and (the first two) judged by ``gpumon health``.
"""

from __future__ import annotations

from pathlib import Path

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumon.backends.nvml import NvmlBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.collector import GpumonCollector
from gpumon.health.gpu_state import snapshot_findings
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import GpuSnapshot, Snapshot, Tier
from tests.fake_pynvml import FakeNvml
from tests.helpers import dcgm_values, run_cli


def exposition(backend: NvmlBackend) -> dict[str, list[tuple[dict[str, str], float]]]:
    store = SnapshotStore()
    poller = Poller(backend, store)
    poller.poll()
    text = GpumonCollector(store, PollIntervals()).render().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def gpu(**fields: object) -> GpuSnapshot:
    return GpuSnapshot.assemble(0, "GPU-0", fields)


# ---- row-remapper histogram -------------------------------------------------------------------
def test_row_remapper_histogram_is_served_in_the_histograms_order(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].remap_histogram = (3060, 8, 2, 1, 1)
    series = exposition(backend)["gpumon_row_remap_banks"]
    gpu0 = [(labels["availability"], value) for labels, value in series if labels["gpu"] == "0"]
    assert gpu0 == [("max", 3060), ("high", 8), ("partial", 2), ("low", 1), ("none", 1)]
    snapshot = GpuSnapshot.assemble(0, "u", backend.read(0, Tier.SLOW))
    twins = dcgm_values(snapshot)
    assert twins["DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX"] == 3060
    assert twins["DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE"] == 1


def test_a_gpu_without_the_histogram_has_no_series_and_is_not_asked_again(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[1].remap_histogram = None
    for _ in range(3):
        got = backend.read(1, Tier.SLOW)
    assert "row_remap_bank_availability" not in got
    assert fake.calls["nvmlDeviceGetRowRemapperHistogram"] == 1
    assert all(labels["gpu"] == "0" for labels, _ in exposition(backend)["gpumon_row_remap_banks"])


def test_banks_without_spare_rows_are_a_health_warning() -> None:
    findings = snapshot_findings(snapshot_of(gpu(row_remap_bank_availability={"max": 3070, "none": 2})))
    (finding,) = findings
    assert (finding.kind, finding.severity, finding.action) == (
        "row_remap_banks_exhausted",
        "WARNING",
        "inspect_hardware",
    )
    assert "2 memory bank(s)" in finding.summary


# ---- recovery action ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "word", "twin"),
    [
        (0, "none", 0.0),
        (1, "gpu_reset", 1.0),
        (2, "node_reboot", 2.0),
        (4, "drain_and_reset", 4.0),
        (9, "action_9", 9.0),
    ],
)
def test_recovery_action_is_a_word_for_gpumon_and_nvmls_code_for_dcgm_values(
    fake: FakeNvml, backend: NvmlBackend, code: int, word: str, twin: float
) -> None:
    fake.gpus[0].recovery_action = code
    got = backend.read(0, Tier.SLOW)
    assert got["recovery_action"] == word
    assert dcgm_values(GpuSnapshot.assemble(0, "u", got))["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] == twin
    series = exposition(backend).get("gpumon_recovery_action_info", [])
    if word == "none":  # nothing to do: no series by default (exporter.detail zero_rows)
        assert series == []
    else:
        assert ({"gpu": "0", "uuid": fake.gpus[0].uuid, "action": word}, 1.0) in series


def test_a_driver_without_the_recovery_field_leaves_it_out(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].recovery_action = None
    assert "recovery_action" not in backend.read(0, Tier.SLOW)
    assert backend.take_errors() == {}


def test_a_recovery_field_answering_unknown_is_that_readers_error_and_asked_again(
    fake: FakeNvml, backend: NvmlBackend
) -> None:
    fake.gpus[0].field_errors = {230: pynvml.NVML_ERROR_UNKNOWN}
    got = backend.read(0, Tier.SLOW)
    assert "recovery_action" not in got and got["remapped_rows"]  # the rest of the read is kept
    assert backend.read_errors() == {(0, fake.gpus[0].uuid, "recovery_action"): 1}
    fake.gpus[0].field_errors = {}
    assert backend.read(0, Tier.SLOW)["recovery_action"] == "none"  # not remembered as unsupported


@pytest.mark.parametrize(
    ("word", "severity", "action"),
    [
        ("gpu_reset", "CRITICAL", "reset_gpu"),
        ("node_reboot", "CRITICAL", "reboot_node"),
        ("drain_p2p", "WARNING", "reset_gpu"),
        ("action_9", "CRITICAL", "inspect_hardware"),
    ],
)
def test_a_recovery_action_is_a_finding_with_its_rung_of_the_ladder(word: str, severity: str, action: str) -> None:
    (finding,) = snapshot_findings(snapshot_of(gpu(recovery_action=word)))
    assert (finding.kind, finding.severity, finding.action) == ("recovery_action", severity, action)
    assert snapshot_findings(snapshot_of(gpu(recovery_action="none"))) == []


RESET_WANTED = """
count: 2
gpus:
  - {}
  - {values: {recovery_action: gpu_reset}}
"""


def test_gpumon_health_drains_a_node_whose_driver_asks_for_a_gpu_reset(tmp_path: Path) -> None:
    scenario = tmp_path / "reset.yaml"
    scenario.write_text(RESET_WANTED)
    done = run_cli("health", "--local", "--backend", f"fake:{scenario}", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("gpumon health: CRITICAL - ")
    assert "GPU 1" in done.stdout and "gpu reset" in done.stdout


# ---- encoder / decoder -------------------------------------------------------------------------
def test_encoder_and_decoder_utilization_are_ratios_with_percent_twins(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].video_percent = (35, 80)
    got = backend.read(0, Tier.FAST)
    assert (got["encoder_utilization_ratio"], got["decoder_utilization_ratio"]) == (0.35, 0.80)
    twins = dcgm_values(GpuSnapshot.assemble(0, "u", got))
    assert (twins["DCGM_FI_DEV_ENC_UTIL"], twins["DCGM_FI_DEV_DEC_UTIL"]) == pytest.approx((35.0, 80.0))
    assert ({"gpu": "0", "uuid": fake.gpus[0].uuid}, 0.35) in exposition(backend)["gpumon_encoder_utilization_ratio"]


def test_a_gpu_without_video_engines_is_asked_once(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].video_percent = None
    for _ in range(3):
        got = backend.read(0, Tier.FAST)
    assert "encoder_utilization_ratio" not in got and "decoder_utilization_ratio" not in got
    assert fake.calls["nvmlDeviceGetEncoderUtilization"] == 1


# ---- graphics engine activity (GPM) -------------------------------------------------------------
def test_graphics_engine_activity_comes_from_gpm_as_a_ratio(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].gpm_metrics = {pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 87.5}
    backend.read(0, Tier.SLOW)  # GPM needs two samples
    got = backend.read(0, Tier.SLOW)
    assert got["graphics_active_ratio"] == pytest.approx(0.875)
    assert dcgm_values(GpuSnapshot.assemble(0, "u", got))["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.875)


# ---- NVLink bandwidth ---------------------------------------------------------------------------
def test_dcgm_nvlink_bandwidth_is_gpm_nvlink_traffic_both_ways_in_mb_per_second(
    fake: FakeNvml, backend: NvmlBackend
) -> None:
    fake.gpus[0].gpm_metrics = {
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 100_000.0,  # MiB/s
        pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 50_000.0,
    }
    backend.read(0, Tier.SLOW)
    got = backend.read(0, Tier.SLOW)
    expected = 150_000.0 * 2**20 / 1e6
    assert dcgm_values(GpuSnapshot.assemble(0, "u", got))["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == pytest.approx(
        expected
    )
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in dcgm_values(gpu())  # no GPM: left out, not 0


def test_the_nvlink_throughput_field_values_are_never_asked(
    fake: FakeNvml, backend: NvmlBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NVML_FI_DEV_NVLINK_THROUGHPUT_* (138-141) corrupted the C heap of a multi-threaded gpumon on H200 with
    # driver 580.159.04 (every burn and daemon run with them aborted: free(): invalid next size); see
    # gpumon/backends/nvml/nvlink.py
    asked: list[int] = []
    real = fake.nvmlDeviceGetFieldValues

    def spy(h: object, ids: list) -> list:  # type: ignore[type-arg]
        asked.extend(i[0] if isinstance(i, tuple) else i for i in ids)
        return real(h, ids)  # type: ignore[arg-type]

    monkeypatch.setattr(fake, "nvmlDeviceGetFieldValues", spy)
    for tier in (Tier.STATIC, Tier.FAST, Tier.SLOW, Tier.SLOW):
        backend.read(0, tier)
    assert asked and not {138, 139, 140, 141} & set(asked)


def snapshot_of(g: GpuSnapshot) -> Snapshot:
    return Snapshot(timestamp_seconds=1.0, monotonic_seconds=1.0, nvml_up=True, gpus=(g,))
