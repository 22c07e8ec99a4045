"""The daemon over the NVML backend (a fake pynvml) when a driver answers UNKNOWN.

One field answering UNKNOWN is that field's error: the GPU stays up, the field's series is
left out, the error is counted per GPU and reader, and no GpuLost alert fires. Only when the
liveness reads (memory info and utilization) fail three polls in a row is the GPU lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest
import requests

from gpumon.backends.nvml import NvmlBackend
from gpumon.config.file import Config
from gpumon.daemon import Daemon, default_alerting
from tests.fake_pynvml import FakeNvml, h200_pair
from tests.helpers import value, wait_for

pytestmark = pytest.mark.faults  # the daemon under faults, as a user meets them: make test-faults


@pytest.fixture
def fake() -> FakeNvml:
    return h200_pair()


@pytest.fixture
def daemon(fake: FakeNvml, tmp_path: Path) -> Iterator[Daemon]:
    config = Config(
        listen="127.0.0.1:0",
        interval_seconds=0.1,
        state_dir=tmp_path,
        kernel_log=False,
        alerting=default_alerting(),
    )
    d = Daemon(config, NvmlBackend(fake))
    d.start()
    yield d
    d.stop()


def metrics(d: Daemon) -> str:
    return requests.get(f"http://127.0.0.1:{d.server.port}/metrics", timeout=5).text


def alert_names(d: Daemon) -> set[str]:
    return {a["alertname"] for a in d.alerts.active_alerts()}


def test_unknown_on_one_field_keeps_the_gpu_up_and_counts_the_fields_error(fake: FakeNvml, daemon: Daemon) -> None:
    wait_for(lambda: value(metrics(daemon), "gpumon_gpu_up", gpu="1") == 1.0, 10, what="GPU 1 up")
    fake.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    uuid1 = fake.gpus[1].uuid
    wait_for(
        lambda: (value(metrics(daemon), "gpumon_read_errors_total", gpu="1", reader="temperature") or 0) >= 10,
        10,
        what="ten polls with temperature answering UNKNOWN",
    )
    text = metrics(daemon)
    assert value(text, "gpumon_gpu_up", gpu="1") == 1.0, "one field's UNKNOWN is not a lost GPU"
    assert value(text, "gpumon_temperature_celsius", gpu="1", sensor="gpu") is None, "the failing field is left out"
    assert value(text, "gpumon_temperature_celsius", gpu="0", sensor="gpu") == 31.0
    assert value(text, "gpumon_power_watts", gpu="1") == 75.5, "the rest of the GPU's read is kept"
    assert value(text, "gpumon_read_errors_total", gpu="1", uuid=uuid1, reader="temperature") is not None
    assert (value(text, "gpumon_poll_errors_total", tier="fast") or 0) >= 10
    assert "GpuLost" not in alert_names(daemon)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 2, "the GPU was never dropped and re-acquired"


def test_unknown_on_the_liveness_reads_repeatedly_makes_the_gpu_lost(fake: FakeNvml, daemon: Daemon) -> None:
    wait_for(lambda: value(metrics(daemon), "gpumon_gpu_up", gpu="1") == 1.0, 10, what="GPU 1 up")
    for function in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetUtilizationRates"):
        fake.fail(function, pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    wait_for(lambda: value(metrics(daemon), "gpumon_gpu_up", gpu="1") == 0.0, 10, what="GPU 1 lost")
    wait_for(lambda: "GpuLost" in alert_names(daemon), 10, what="the GpuLost alert")
    [lost] = [a for a in daemon.alerts.active_alerts() if a["alertname"] == "GpuLost"]
    assert lost["gpu"] == "1"
    assert value(metrics(daemon), "gpumon_gpu_up", gpu="0") == 1.0
