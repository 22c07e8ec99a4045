"""The no-load checks, the telemetry watcher and the Prometheus collector of burn results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpumon.backends.fake import FakeBackend
from gpumon.burn.orchestration.watcher import Watcher, summarise
from gpumon.burn.workloads.sw import check_gpu, check_host
from gpumon.exposition.burn_results import BurnResultsCollector
from gpumon.exposition.registry import MetricsOf
from gpumon.model.snapshot import HostSnapshot
from gpumon.state.burn_record import StateFiles


def _values(**override):
    backend = FakeBackend.from_mapping({"count": 2, "base": override})
    backend.init()
    out = {}
    for tier in ("static", "slow", "fast"):
        from gpumon.model.snapshot import Tier

        out.update(backend.read(0, Tier(tier)))
    return out


def test_healthy_gpu_passes_every_sw_check():
    checks = check_gpu(0, _values())
    assert {c.severity for c in checks} == {"ok"}


def test_sw_faults_name_what_is_wrong():
    checks = check_gpu(
        0,
        _values(
            row_remap_pending=True,
            pcie_link_width=8,
            nvlink_up={"0": True, "1": False, "2": True},
            ecc_errors_total={"uncorrected_volatile": 3},
        ),
    )
    faults = {c.name: c.detail for c in checks if c.severity == "fault"}
    assert faults["row_remap_pending"].startswith("a row remap is pending")
    assert faults["pcie_link_width"] == "PCIe link x8, below its max x16"
    assert faults["nvlink_up"] == "NVLink 1 down of 3 links"
    assert faults["ecc_uncorrected"].startswith("3 uncorrectable")


def test_other_processes_make_the_gpu_busy_and_mig_stops_the_run():
    checks = check_gpu(0, _values(processes=[{"pid": 99, "name": "train.py"}], mig_mode_enabled=True))
    by_name = {c.name: c for c in checks}
    assert by_name["processes"].severity == "busy" and "99 (train.py)" in by_name["processes"].detail
    assert by_name["mig_mode"].severity == "cannot_run"


def test_nvswitch_fabric_not_registered_cannot_run_and_a_failed_registration_is_a_fault():
    def fabric(**values):
        (check,) = [c for c in check_gpu(0, _values(**values)) if c.name == "fabric"]
        return check.severity, check.detail

    assert fabric(fabric_state="in_progress", fabric_status_ok=False) == (
        "cannot_run",
        "NVSwitch fabric registration in progress: CUDA waits for nvidia-fabricmanager",
    )
    assert fabric(fabric_state="completed", fabric_status_ok=False)[0] == "fault"
    assert fabric(fabric_state="completed", fabric_status_ok=True)[0] == "ok"
    pcie_card = {k: v for k, v in _values().items() if not k.startswith("fabric_")}
    assert not [c for c in check_gpu(0, pcie_card) if c.name == "fabric"]  # outside a fabric: nothing to say


def test_torch_cuda_newer_than_the_driver_cannot_run():
    host = HostSnapshot(driver_version="535.1", cuda_driver_version="12.2")
    (check,) = check_host(host, "12.8", "cuda")
    assert check.severity == "cannot_run" and "newer than the driver's CUDA 12.2" in check.detail
    assert check_host(host, "12.1", "cuda")[0].severity == "ok"


def test_busy_gpu_is_refused_with_exit_3_unless_forced(burn, tmp_path):
    scenario = tmp_path / "busy.yaml"
    scenario.write_text("count: 2\ngpus:\n- {}\n- values: {processes: [{pid: 4242, name: python3}]}\n")
    r = burn(["--device", "cpu", "--backend", f"fake:{scenario}", "--tests", "sw"])
    assert r.code == 3
    assert r.err.strip() == (
        "gpumon burn: could not run: GPU 1 is busy: 1 other compute process(es) on the GPU: "
        "4242 (python3) (use --force to burn anyway)"
    )
    forced = burn(["--device", "cpu", "--backend", f"fake:{scenario}", "--tests", "sw", "--force"])
    assert forced.code == 0, forced.err


def test_watcher_reports_peaks_sustained_power_and_slowdowns():
    scenario = {
        "count": 1,
        "gpus": [
            {
                "values": {
                    "power_watts": [100, 650, 660, 670, 680, 690],
                    "temperature_celsius": [40, 60, 70, 80, 75, 70],
                    "clock_events_active": [
                        {"sw_power_cap": False},
                        {"sw_power_cap": True, "hw_thermal_slowdown": True},
                    ],
                }
            }
        ],
    }
    backend = FakeBackend.from_mapping(scenario)
    backend.init()
    now = [0.0]
    w = Watcher(backend, (0,), clock=lambda: now[0])
    from gpumon.model.snapshot import Tier

    w.telemetry[0].last_slow = w._read_tier(0, Tier.SLOW)  # no thread: sample by hand at known times
    w.set_test(0, "matmul")
    for t in range(6):
        now[0] = float(t) * 2
        w._sample(0)
    s = summarise(w.telemetry[0])
    assert s["temperature_peak_celsius"] == 80
    assert s["power_limit_watts"] == 700.0
    assert s["power_sustained_watts"] == 675  # median after the 3 s ramp-up
    assert s["slowdowns_seen"] == ["hw_thermal_slowdown"]
    assert "sw_power_cap" in s["clock_events_seen"]


def _report(node: int = 0) -> dict:
    return {
        "node": node,
        "finished_at": 1700000000.0,
        "exit_code": 1,
        "gpus": [
            {
                "node": 0,
                "gpu": 0,
                "uuid": "GPU-a",
                "tests": {"matmul": True, "memory": False, "p2p": None},
                "matmul": {"dtype": "bf16", "tflops": 655.5},
                "memory": {"bandwidth_bytes_per_second": 4.2e12},
                "p2p": {"1": 3.9e11},
                "allreduce": {"busbw_bytes_per_second": 3.3e11},
            },
            {"node": 1, "gpu": 0, "uuid": "GPU-other-node", "tests": {"matmul": True}},
        ],
    }


def test_collector_exports_the_last_report_and_the_running_marker(tmp_path):
    files = StateFiles(str(tmp_path), warn=print)
    files.write_last(_report())
    files.write_marker(os.getpid(), [0], ["GPU-a"], time.time())
    reg = CollectorRegistry()
    reg.register(MetricsOf(BurnResultsCollector(tmp_path)))
    text = generate_latest(reg).decode()
    assert "gpumon_burn_last_run_timestamp_seconds 1.7e+09" in text
    assert 'gpumon_burn_passed{gpu="0",test="matmul",uuid="GPU-a"} 1.0' in text
    assert 'gpumon_burn_passed{gpu="0",test="memory",uuid="GPU-a"} 0.0' in text
    assert 'test="p2p",uuid="GPU-a"}' not in text.split("gpumon_burn_tflops")[0]  # not run: absent
    assert 'gpumon_burn_tflops{dtype="bf16",gpu="0",uuid="GPU-a"} 655.5' in text
    assert 'gpumon_burn_bandwidth_bytes_per_second{gpu="0",peer_gpu="1",test="p2p",uuid="GPU-a"} 3.9e+11' in text
    assert 'gpumon_burn_bandwidth_bytes_per_second{gpu="0",test="allreduce",uuid="GPU-a"}' in text
    assert 'peer_gpu=""' not in text, "only p2p series carry peer_gpu; no empty label"
    assert 'gpumon_burn_running{gpu="0",uuid="GPU-a"} 1.0' in text
    assert "GPU-other-node" not in text  # another node's GPUs are exported by that node's daemon
    files.remove_marker()
    assert 'gpumon_burn_running{gpu="0",uuid="GPU-a"} 0.0' in generate_latest(reg).decode()
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_collector_rereads_when_the_file_changes_and_survives_garbage(tmp_path):
    collector = BurnResultsCollector(tmp_path)
    reg = CollectorRegistry()
    reg.register(MetricsOf(collector))
    assert "gpumon_burn_passed{" not in generate_latest(reg).decode()
    last = tmp_path / "burn" / "last.json"
    last.parent.mkdir(parents=True)
    last.write_text("{not json")
    assert "gpumon_burn_passed{" not in generate_latest(reg).decode()
    last.write_text(json.dumps(_report()))
    os.utime(last, (time.time() + 5, time.time() + 5))
    assert 'gpumon_burn_passed{gpu="0",test="matmul",uuid="GPU-a"} 1.0' in generate_latest(reg).decode()


def test_unwritable_state_dir_warns_once_and_carries_on(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    warnings: list[str] = []
    files = StateFiles(str(blocker), warn=warnings.append)
    files.write_marker(1, [0], ["GPU-a"], 0.0)
    files.write_last({})
    files.remove_marker()
    assert len(warnings) == 1 and "cannot write the running marker" in warnings[0]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (CI installs it)")
def test_promtool_is_available_for_the_exposition_check():
    assert Path(shutil.which("promtool") or "").exists()
