"""gpumon run as a user runs it: a subprocess on the fake backend, scraped over HTTP."""

from __future__ import annotations

import dataclasses
import math
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumon.alerts import config as alerts_config
from gpumon.backends.fake import FakeBackend
from gpumon.config.file import Config
from gpumon.daemon import Daemon
from tests.helpers import DaemonProcess, run_cli, value, wait_for


def test_serves_metrics_healthz_and_ready(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "3")
    text = daemon.metrics()
    assert value(text, "gpumon_gpus") == 3.0
    assert value(text, "gpumon_nvml_up") == 1.0
    assert value(text, "gpumon_gpu_up", gpu="2") == 1.0
    assert daemon.get("/healthz").text == "ok\n"
    assert daemon.get("/ready").status_code == 200
    snapshot = daemon.get("/api/snapshot").json()
    assert len(snapshot["gpus"]) == 3 and snapshot["gpus"][0]["name"] == "NVIDIA H200"


def test_openmetrics_when_asked_text_otherwise_and_gzip_on_request(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "1")
    prometheus_accept = "application/openmetrics-text;version=1.0.0;q=0.9,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    openmetrics = daemon.get("/metrics", headers={"Accept": prometheus_accept})
    assert openmetrics.headers["Content-Type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert openmetrics.text.endswith("# EOF\n")
    plain = daemon.get("/metrics")
    assert plain.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    gz = daemon.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert gz.headers.get("Content-Encoding") == "gzip" and "gpumon_gpu_up" in gz.text


def test_hung_nvml_call_scrape_answers_fast_with_the_snapshot_age(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    scenario = tmp_path / "hang.yaml"
    scenario.write_text("gpus:\n  - hang_at_tick: 2\n    hang_seconds: 120\n")
    config = tmp_path / "c.yaml"
    config.write_text("interval_seconds: 0.5\nslow_interval_seconds: 1\n")
    daemon = start_daemon("--backend", f"fake:{scenario}", "--config", str(config))
    wait_for(lambda: (value(daemon.metrics(), "gpumon_snapshot_age_seconds") or 0) > 2.6, timeout=15, what="stale age")
    latencies = []
    for _ in range(20):
        start = time.monotonic()
        response = daemon.get("/metrics")
        latencies.append(time.monotonic() - start)
        assert response.status_code == 200
    # a scrape never waits for the stuck poll (it would take its 5 s timeout): about 10 ms here, and a
    # 1 s bound keeps a loaded CI box from failing it
    assert sorted(latencies)[len(latencies) // 2] < 1.0, latencies
    text = daemon.get("/metrics").text
    assert value(text, "gpumon_gpu_up", gpu="0") == 1.0, "the last snapshot is still served"
    ready = daemon.get("/ready")
    assert ready.status_code == 503 and "old" in ready.text
    wait_for(lambda: (value(daemon.metrics(), "gpumon_poll_skipped_total") or 0) >= 1, timeout=5, what="skips")
    # SIGTERM ends the daemon within 2 s even though a poll is stuck inside the backend
    start = time.monotonic()
    daemon.signal(signal.SIGTERM)
    daemon.proc.wait(5)
    assert time.monotonic() - start < 2.0
    assert daemon.proc.returncode == 0


def test_sigterm_exits_cleanly_within_two_seconds(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "2")
    start = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(5) == 0
    assert time.monotonic() - start < 2.0
    assert "gpumon stopping" in daemon.log()


def test_sighup_reloads_and_keeps_the_old_config_when_the_new_one_is_bad(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("interval_seconds: 1\n")
    daemon = start_daemon("--backend", "fake", "--config", str(config))
    config.write_text("interval_seconds: -5\nwat: 1\n")
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "reload rejected" in daemon.log(), what="reload rejection logged")
    assert "interval_seconds must be from 0.1 to 3600 seconds" in daemon.log()
    assert daemon.get("/ready").status_code == 200
    config.write_text("interval_seconds: 2\nexporter: {processes: true}\n")
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in daemon.log(), what="reload")
    wait_for(lambda: "Refreshed every 2s" in daemon.metrics(), what="new interval in HELP")
    assert daemon.proc.poll() is None


def test_nvml_missing_at_start_daemon_stays_up_and_recovers(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    scenario = tmp_path / "late.yaml"
    scenario.write_text("nvml_missing_inits: 2\ngpus: [{}]\n")
    daemon = start_daemon("--backend", f"fake:{scenario}")
    wait_for(lambda: value(daemon.metrics(), "gpumon_nvml_up") == 1.0, timeout=15, what="NVML to come back")
    log = daemon.log()
    assert log.count("NVML unavailable") == 1
    assert "NVML is back" in log


def test_bad_scenario_file_is_a_usage_error(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("gpus:\n  - values: {temprature_celsius: 3}\n    whatever: 1\n")
    result = run_cli("once", "--backend", f"fake:{scenario}")
    assert result.returncode == 2
    assert "temprature_celsius" in result.stderr and "whatever" in result.stderr


def test_port_in_use_is_a_clear_error(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    first = start_daemon("--backend", "fake", "--fake-gpus", "1")
    result = run_cli(
        "run", "--backend", "fake", "--listen", f"127.0.0.1:{first.port}", "--state-dir", str(tmp_path), timeout=20
    )
    assert result.returncode == 1
    assert "cannot listen on" in result.stderr and "Traceback" not in result.stderr


def test_sighup_with_a_new_xid_catalog_changes_the_dcgm_err_msg(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    scenario = tmp_path / "xid.yaml"
    scenario.write_text("gpus:\n  - xid_events: [{tick: 1, xid: 79}]\n")
    config = tmp_path / "c.yaml"
    config.write_text("exporter: {compat: [dcgm]}\nxid_catalog: {79: {meaning: first words}}\n")
    daemon = start_daemon("--backend", f"fake:{scenario}", "--config", str(config))

    def err_msg() -> str | None:
        for family in text_string_to_metric_families(daemon.metrics()):
            for s in family.samples:
                if s.name == "DCGM_FI_DEV_XID_ERRORS":
                    return s.labels.get("err_msg")
        return None

    wait_for(lambda: err_msg() == "first words", what="XID 79 with the configured meaning")
    config.write_text("exporter: {compat: [dcgm]}\nxid_catalog: {79: {meaning: second words}}\n")
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in daemon.log(), what="reload")
    assert err_msg() == "second words"


def test_a_reloaded_configuration_without_alerting_brings_back_the_built_in_rules(tmp_path: Path) -> None:
    """A Config with no alerting section (as built by hand or by an embedding program) means
    the built-in pack and no receivers, on reload as at start."""
    mine = alerts_config.parse(
        {
            "builtin_rules": False,
            "rules": [{"name": "MyHot", "field": "temperature_celsius", "op": ">", "threshold": 50}],
        }
    )[0]
    base = Config(listen="127.0.0.1:0", backend="fake", state_dir=tmp_path, kernel_log=False)
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"temperature_celsius": 99}}]})
    daemon = Daemon(dataclasses.replace(base, alerting=mine), backend, reload_config=lambda: base)
    daemon.start()
    try:

        def names() -> set[str]:
            return {a["labels"]["alertname"] for a in daemon.alerts.active_alerts()}

        wait_for(lambda: names() == {"MyHot"}, what="the configured rule firing")
        daemon.reload()
        wait_for(lambda: "MyHot" not in names() and names(), what="the built-in pack instead")
        assert all(name.startswith("Gpu") for name in names()), names()
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    "change",
    [
        {"interval_seconds": 2.0, "xid_catalog": {79: {"severity": "apocalyptic"}}},
        {"interval_seconds": math.inf, "slow_interval_seconds": math.inf, "static_interval_seconds": math.inf},
        {"interval_seconds": 2.0, "stale_after_seconds": math.nan},
    ],
    ids=["a bad XID override after a good interval", "infinite intervals", "a NaN stale_after"],
)
def test_a_reload_that_cannot_be_applied_changes_nothing(tmp_path: Path, change: dict[str, Any]) -> None:
    """A configuration that passed loading but cannot be put in force is refused whole: the
    interval, the HELP texts and /ready's staleness stay as they were."""
    base = Config(listen="127.0.0.1:0", backend="fake", state_dir=tmp_path, kernel_log=False)
    daemon = Daemon(
        base, FakeBackend.from_mapping({"count": 1}), reload_config=lambda: Config(**{**vars(base), **change})
    )
    daemon.start()
    try:
        wait_for(lambda: daemon.store.latest() is not None, what="a first poll")
        assert daemon.reload() is False
        assert daemon.config is base
        assert "Refreshed every 1s" in daemon.collector.render().decode()
        trigger = daemon.poll_job.scheduler.get_job("poll").trigger
        assert trigger.interval_length == 1.0
        text = daemon.collector.render().decode()
        assert "gpumon_config_last_reload_successful 0.0" in text
    finally:
        daemon.stop()


def test_memory_is_settled_once_after_the_first_poll(tmp_path: Path) -> None:
    """run_forever freezes the start-up objects and trims the C heap once the first snapshot is in
    the store, and only once."""
    config = Config(listen="127.0.0.1:0", backend="fake", state_dir=tmp_path, kernel_log=False)
    settled: list[bool] = []
    daemon = Daemon(
        config,
        FakeBackend.from_mapping({"count": 1}),
        settle_memory=lambda: settled.append(daemon.store.latest() is not None),
    )
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    stopper = threading.Timer(2.5, daemon.request_stop)  # a few turns of the main loop after the first poll
    stopper.start()
    try:
        assert daemon.run_forever() == 0
    finally:
        stopper.cancel()
        for s, handler in handlers.items():
            signal.signal(s, handler)
    assert settled == [True]


def test_settling_freezes_the_collector_and_gives_freed_heap_pages_back() -> None:
    """What start-up freed in the middle of the C heap stays resident until the daemon settles:
    here 20 MB of 1000-byte blocks (malloc's, not Python's small-object arenas), one in 16 kept."""
    code = """
import gc
from gpumon import process_memory

def rss_kib():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])

blocks = [bytes(1000) for _ in range(20000)]
kept = blocks[::16]
del blocks
before = rss_kib()
process_memory.settle()
print(before - rss_kib(), gc.get_freeze_count() > 0)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    released_kib, frozen = done.stdout.split()
    assert int(released_kib) > 8 * 1024, "the free pages between the kept blocks went back to the kernel"
    assert frozen == "True"


def test_settling_collects_start_up_garbage_instead_of_freezing_it() -> None:
    """A reference cycle that start-up dropped (an argument parser, a parsed config) is freed when
    the daemon settles; frozen, it would stay in memory for the daemon's whole life."""
    code = """
import gc, weakref
from gpumon import process_memory

class Node:
    pass

gc.disable()  # as if no collection had run between the cycle's making and the settling
cycle = Node()
cycle.me = cycle
alive = weakref.ref(cycle)
del cycle
process_memory.settle()
print(alive() is None)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True", "the dropped cycle was collected before the freeze"
