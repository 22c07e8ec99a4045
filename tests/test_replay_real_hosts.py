"""Real hosts, replayed: what gpumon shows of GPUs it recorded with ``gpumon record`` (tests/data/recordings).

The replay runs gpumon's own NVML readers on a real host's answers, so a reader that converts a
unit wrongly changes what these tests see: the snapshot of ``gpumon once --json``, every /metrics
body (plain, OpenMetrics, each DCGM compat set) and the health verdict are compared with their
golden files, and the snapshot with what nvidia-smi said on that host in the same minute.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumon.backends.recording import load
from tests.replayed import (
    COMPAT_SETS,
    RECORDINGS,
    compat_exposition,
    expositions,
    golden_path,
    nvidia_smi_facts,
    recordings,
    replayed_store,
    snapshot_json,
)

MIB = 1024 * 1024
REGENERATE = "review the diff, then `make golden` (tests/replayed.py write_goldens)"
ids = [p.stem for p in recordings()]


def test_the_repository_holds_recordings_of_real_hosts_idle_and_under_load() -> None:
    labels = {load(p).header["label"].split(":")[0] for p in recordings()}
    assert {"idle", "load"} <= labels, labels
    for path in recordings():
        header = load(path).header
        assert header["driver_version"] and header["nvml_version"] and header["models"], path.name
        assert header["redacted"] is True, f"{path.name}: recordings in the repository are made with --redact"
        assert path.stat().st_size < 256 * 1024, f"{path.name} is not small"
        assert path.with_suffix(".nvidia-smi.json").exists(), f"{path.name}: nvidia-smi's facts of that host"


@pytest.mark.parametrize("recording", recordings(), ids=ids)
def test_the_replay_answers_every_question_gpumon_asks(recording: Path) -> None:
    _, backend = replayed_store(recording, polls=3)
    assert backend.replay.unanswered == set()
    assert backend.take_errors() == {} and backend.read_errors() == {}


@pytest.mark.parametrize("recording", recordings(), ids=ids)
def test_once_json_matches_the_golden_snapshot(recording: Path) -> None:
    golden = json.loads(golden_path(recording, "once.json").read_text())
    assert snapshot_json(recording) == golden, REGENERATE


@pytest.mark.parametrize("recording", recordings(), ids=ids)
@pytest.mark.parametrize("body", ["metrics.txt", "openmetrics.txt", *(f"{s}.txt" for s in COMPAT_SETS)])
def test_metrics_bodies_match_their_golden_files(recording: Path, body: str) -> None:
    assert expositions(recording)[body] == golden_path(recording, body).read_text(), REGENERATE


@pytest.mark.parametrize("recording", recordings(), ids=ids)
def test_both_compat_sets_at_once_serve_each_sets_series(recording: Path) -> None:
    store, _ = replayed_store(recording)
    both = _names(compat_exposition(store, COMPAT_SETS))
    assert both == set().union(*(_names(compat_exposition(store, (s,))) for s in COMPAT_SETS))
    openmetrics = compat_exposition(store, COMPAT_SETS, openmetrics=True)
    assert openmetrics.endswith("# EOF\n") and _names(openmetrics, openmetrics=True) == both


def _names(text: str, openmetrics: bool = False) -> set[str]:
    if openmetrics:
        from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse

        return {s.name for f in parse(text) for s in f.samples}
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_golden_bodies_of_real_hosts_pass_promtool_check_metrics() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); CI installs it")
    for recording in recordings():
        text = golden_path(recording, "metrics.txt").read_text()
        result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
        assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stdout + result.stderr


@pytest.mark.parametrize("recording", recordings(), ids=ids)
def test_replay_agrees_with_nvidia_smi_on_that_host(recording: Path) -> None:
    """Units checked against nvidia-smi, not against gpumon: bytes = MiB·2^20, W, Hz = MHz·10^6, ratio = %/100."""
    snapshot = snapshot_json(recording)
    facts = nvidia_smi_facts(recording)
    assert snapshot["host"]["driver_version"] == facts["driver_version"]
    assert snapshot["host"]["cuda_driver_version"] == facts["cuda_version"]
    for gpu, smi in zip(snapshot["gpus"], facts["gpus"], strict=True):
        _steady_facts_agree(gpu, smi)
        _moving_facts_agree(gpu, smi)


def _steady_facts_agree(gpu: dict[str, Any], smi: dict[str, Any]) -> None:
    assert gpu["name"] == smi["product_name"] and gpu["pci_bus_id"] == smi["pci_bus_id"]
    assert gpu["vbios_version"] == smi["vbios_version"]
    assert gpu["memory_total_bytes"] == smi["memory_total_mib"] * MIB
    assert abs(gpu["memory_reserved_bytes"] / MIB - smi["memory_reserved_mib"]) <= 1  # nvidia-smi: 615.06 -> 616
    assert gpu["power_limit_watts"] == smi["power_limit_watts"]
    assert gpu["clocks_max_hertz"]["sm"] == smi["max_sm_clock_mhz"] * 1e6
    assert gpu["clocks_max_hertz"]["memory"] == smi["max_memory_clock_mhz"] * 1e6
    assert gpu["clocks_max_hertz"]["graphics"] == smi["max_graphics_clock_mhz"] * 1e6
    assert gpu["pcie_link_generation"] == smi["pcie_link_gen_current"]
    assert gpu["pcie_link_generation_max"] == smi["pcie_link_gen_max"]
    assert gpu["pcie_link_width"] == smi["pcie_link_width_current"]
    assert gpu["pcie_link_width_max"] == smi["pcie_link_width_max"]
    assert gpu["ecc_mode_enabled"] is (smi["ecc_mode"] == "Enabled")
    assert gpu["persistence_mode_enabled"] is (smi["persistence_mode"] == "Enabled")
    assert gpu["compute_mode"] == smi["compute_mode"].lower().replace(" ", "_")
    assert gpu["row_remap_bank_availability"]["max"] == smi["row_remapper_max_banks"]


def _moving_facts_agree(gpu: dict[str, Any], smi: dict[str, Any]) -> None:
    """Values that move, within nvidia-smi's readings just before and after (and a margin for the minute)."""

    def within(value: float, span: list[float], slack: float, scale: float = 1.0) -> bool:
        low, high = span
        return low * scale - slack <= value <= high * scale + slack

    assert within(gpu["temperature_celsius"], smi["temperature_c"], 4.0), (gpu["temperature_celsius"], smi)
    assert within(gpu["memory_temperature_celsius"], smi["memory_temperature_c"], 4.0)
    low, high = smi["power_draw_average_watts"]
    assert 0.7 * low <= gpu["power_watts"] <= 1.3 * high, (gpu["power_watts"], smi["power_draw_average_watts"])
    assert within(gpu["utilization_ratio"], smi["utilization_gpu_percent"], 0.2, scale=0.01)
    assert within(gpu["memory_used_bytes"], smi["memory_used_mib"], 64 * MIB, scale=MIB)
    assert within(gpu["clocks_hertz"]["memory"], smi["memory_clock_mhz"], 1e6, scale=1e6)
    assert 100e6 <= gpu["clocks_hertz"]["sm"] <= smi["max_sm_clock_mhz"] * 1e6
    # nvidia-smi -q "SW Power Capping" counter, µs; NVML's violation time, ns; gpumon's, s
    assert within(gpu["throttle_seconds_total"]["power"], smi["sw_power_cap_us"], 0.5, scale=1e-6)


@pytest.mark.parametrize("recording", recordings(), ids=ids)
def test_gpumon_once_plays_the_recording(recording: Path, tmp_path: Path) -> None:
    once = _gpumon(["once", "--backend", f"replay:{recording}", "--json"], tmp_path)
    assert once.returncode == 0, once.stderr
    shown = json.loads(once.stdout)
    first_poll = snapshot_json(recording, polls=1)
    for gpu, expected in zip(shown["gpus"], first_poll["gpus"], strict=True):
        procs = [{k: p.get(k) for k in ("pid", "used_memory_bytes")} for p in gpu.pop("processes", ())]
        assert procs == [{k: p.get(k) for k in ("pid", "used_memory_bytes")} for p in expected.pop("processes", ())]
        assert gpu == expected


@pytest.mark.parametrize("recording", recordings(), ids=ids)
def test_gpumon_health_judges_the_replayed_host(recording: Path, tmp_path: Path) -> None:
    health = _gpumon(["health", "--backend", f"replay:{recording}", "--state-dir", str(tmp_path), "--json"], tmp_path)
    report = json.loads(health.stdout)
    golden = json.loads(golden_path(recording, "once.json").read_text())
    assert report["status"] == "OK", report  # both recorded hosts were healthy
    assert health.returncode == 0, health.stderr
    assert [g["uuid"] for g in report.get("gpus", [])] in ([], [g["uuid"] for g in golden["gpus"]])
    # a replayed host's health state is kept apart from the node's own
    assert not (tmp_path / "health" / "inventory.json").exists()
    assert list((tmp_path / "simulated").glob("*/health/inventory.json"))


def _gpumon(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def test_recordings_live_where_the_docs_say() -> None:
    assert RECORDINGS.is_dir() and (RECORDINGS / "README.md").exists()


@pytest.mark.parametrize("recording", recordings(), ids=ids)
def test_every_per_gpu_series_of_a_real_host_names_its_gpu_and_no_value_is_nan(recording: Path) -> None:
    text = expositions(recording)["metrics.txt"]
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert samples and not [s.name for s in samples if s.value != s.value]
    per_gpu = [s for s in samples if "gpu" in s.labels]
    assert per_gpu and all(s.labels.get("uuid", "").startswith("GPU-") for s in per_gpu)
    assert {s.labels["gpu"] for s in per_gpu} == {str(g["index"]) for g in snapshot_json(recording)["gpus"]}
