"""A lost GPU keeps its identity and its counters (XIDs above all) on /metrics (DESIGN.md §4), so the
XID that came with the loss reaches Prometheus and the shipped critical-XID rule sees it."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.collector import GpumonCollector
from gpumon.model.poll_intervals import PollIntervals
from tests.helpers import REPO, DaemonProcess, value, wait_for

pytestmark = pytest.mark.faults  # the daemon under faults, as a user meets them: make test-faults
PROMTOOL = shutil.which("promtool")


def samples_of(text: str, gpu: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of GPU ``gpu`` in an exposition: (name, labels without gpu) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("gpu") == gpu:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "gpu"))
                out[(s.name, labels)] = float(s.value)
    return out


def scrape_when(daemon: DaemonProcess, condition: Callable[[str], bool], what: str) -> str:
    """The first scrape of ``daemon`` for which ``condition(text)`` holds."""

    def scrape() -> str | None:
        text = daemon.metrics()
        return text if condition(text) else None

    return str(wait_for(scrape, 20, what=what))


def test_a_lost_gpu_keeps_its_xid_series_and_identity_on_metrics(
    start_daemon: Callable[..., DaemonProcess],
) -> None:
    # fake:gpu-lost: GPU 1 reports XID 79 at the 4th poll and is lost from the 5th.
    daemon = start_daemon("--backend", "fake:gpu-lost", "--interval-seconds", "0.2")
    lost = scrape_when(daemon, lambda t: value(t, "gpumon_gpu_up", gpu="1") == 0, "GPU 1 lost")
    assert value(lost, "gpumon_xid_errors_total", gpu="1", xid="79") == 1
    assert value(lost, "gpumon_xid_last_timestamp_seconds", gpu="1", xid="79") is not None
    assert value(lost, "gpumon_gpu_info", gpu="1") == 1
    assert value(lost, "gpumon_temperature_celsius", gpu="1") is None  # live readings dropped

    # still there polls later (the old code dropped them within seconds)
    taken = value(lost, "gpumon_snapshot_timestamp_seconds")
    assert taken is not None
    later = scrape_when(
        daemon, lambda t: (value(t, "gpumon_snapshot_timestamp_seconds") or 0) > taken + 2, "a snapshot 2 s later"
    )
    assert value(later, "gpumon_gpu_up", gpu="1") == 0
    assert value(later, "gpumon_xid_errors_total", gpu="1", xid="79") == 1
    assert value(later, "gpumon_xid_last_timestamp_seconds", gpu="1", xid="79") is not None
    assert value(later, "gpumon_temperature_celsius", gpu="0") is not None  # the other GPU unaffected


def test_a_lost_gpu_keeps_its_last_counters_and_drops_its_gauges() -> None:
    """The counters read before the loss stay as they were (a counter that vanishes and returns
    reads as a reset); the live gauges go."""
    backend = FakeBackend.from_mapping(
        {
            "base": {"temperature_celsius": 60, "power_watts": 300.0, "energy_joules_total": 5000.0},
            "gpus": [{}, {"lost_at_tick": 4, "values": {"pcie_replays_total": 7}}],
        }
    )
    store = SnapshotStore()
    clock = [1000.0]
    poller = Poller(
        backend,
        store,
        PollIntervals(1.0, 1.0, 300.0),
        wall_clock=lambda: clock[0],
        monotonic=lambda: clock[0],
        xid_counts=lambda index: ({"79": 1}, {"79": 999.0}) if index == 1 else ({}, {}),
    )
    collector = GpumonCollector(store, PollIntervals(1.0, 1.0, 300.0), monotonic=lambda: clock[0])
    before: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for _ in range(8):
        poller.poll()
        text = collector.render().decode()
        if value(text, "gpumon_gpu_up", gpu="1") == 1:
            before = samples_of(text, "1")
        clock[0] += 1.0
    after = samples_of(text, "1")
    assert value(text, "gpumon_gpu_up", gpu="1") == 0
    counters = {k: v for k, v in before.items() if k[0].endswith("_total")}
    assert counters, "the scenario's GPU reports counters before it is lost"
    for key, number in counters.items():
        assert after.get(key) == number, key
    assert value(text, "gpumon_xid_errors_total", gpu="1", xid="79") == 1
    assert not [k for k in after if k[0] in ("gpumon_temperature_celsius", "gpumon_power_watts")]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package: prometheus)")
def test_the_critical_xid_rule_fires_for_the_xid_of_a_lost_gpu(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """The series a scrape gives while GPU 1 is lost, fed to promtool with the shipped rules: GpuLost
    and GpuXidCritical both fire for it."""
    daemon = start_daemon("--backend", "fake:gpu-lost", "--interval-seconds", "0.2")
    text = scrape_when(daemon, lambda t: value(t, "gpumon_gpu_up", gpu="1") == 0, "GPU 1 lost")
    scraped_at = time.time()
    uuid = next(dict(k[1])["uuid"] for k in samples_of(text, "1") if k[0] == "gpumon_gpu_up")
    last = value(text, "gpumon_xid_last_timestamp_seconds", gpu="1", xid="79")
    assert last is not None, "no XID series for the lost GPU"
    age = scraped_at - last  # promtool's clock starts at 0: the same age at its 1m
    labels = f'instance="h1:10480",job="gpumon",gpu="1",uuid="{uuid}"'
    test = {
        "rule_files": [str(REPO / "prometheus" / "gpumon-alerts.rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"gpumon_gpu_up{{{labels}}}", "values": "0 0"},
                    {
                        "series": f'gpumon_xid_last_timestamp_seconds{{{labels},xid="79"}}',
                        "values": f"{60 - age - 60:.3f} {60 - age:.3f}",
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "1m",
                        "alertname": "GpuXidCritical",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "instance": "h1:10480",
                                    "job": "gpumon",
                                    "gpu": "1",
                                    "uuid": uuid,
                                    "xid": "79",
                                },
                                "exp_annotations": {
                                    "summary": "XID 79 on GPU 1 of h1:10480",
                                    "description": f"GPU 1 ({uuid}) reported XID 79, which calls for a GPU reset, "
                                    "a reboot or the vendor. See gpumon's XID catalog.",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "lost_xid_test.yml"
    path.write_text(yaml.safe_dump(test))
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
