"""No metric family is served twice (issue 48): as prometheus_client's registry refuses a second collector
whose names are registered, gpumon refuses a twin.

* A per-GPU family declared twice, or under the name of one gpumon makes itself (``gpumon_gpu_up``), is
  refused when the exposition is built: the daemon does not start with it.
* An extra source that serves a family the scrape serves already (gpumon's own, or an earlier source's)
  is left out of that scrape and reported as failed (``gpumon_collector_success 0``), like any source
  that fails; a second source of one name is refused when it is added.
* Every family gpumon can serve, with every compat set and every opt-in of ``exporter.detail``, the
  per-process series and every extra source the daemon adds, comes once, in both formats.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from gpumon.backends.fake import FakeBackend
from gpumon.backends.nvml import NvmlBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.config.daemon_settings import default_alerting
from gpumon.config.exporter import ExporterConfig
from gpumon.config.file import Config
from gpumon.daemon import Daemon
from gpumon.exposition import gpu_families
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.metrics import MetricRow, scalar
from gpumon.model.families import Family
from gpumon.model.fields.spec import DETAILS
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import Tier
from gpumon.state.burn_record import StateFiles
from tests.fake_pynvml import h200_pair
from tests.helpers import DATA, value, wait_for

COMPAT_SETS = [(), ("dcgm",), ("dcgm-4.9",), ("dcgm", "dcgm-4.9")]


def type_lines(text: str) -> Counter[str]:
    """How often each family name has its ``# TYPE`` line in an exposition."""
    return Counter(re.findall(r"^# TYPE (\S+) ", text, flags=re.MULTILINE))


def twins(text: str) -> list[str]:
    return sorted(name for name, n in type_lines(text).items() if n > 1)


def scraped(collector: GpumonCollector) -> Iterable[str]:
    """What a scrape serves, through both of the collector's paths, in both formats."""
    yield collector.render().decode()
    yield collector.render_openmetrics().decode()
    yield b"".join(collector.body()).decode()
    yield b"".join(collector.body(openmetrics=True)).decode()


class Families:
    """An extra source that serves the families it is given."""

    def __init__(self, *families: Family) -> None:
        self._families = families

    def families(self) -> Iterable[Family]:
        return [Family(f.name, f.kind, f.help, f.label_names, list(f.samples)) for f in self._families]


def golden_store() -> SnapshotStore:
    store = SnapshotStore()
    Poller(FakeBackend.from_file(DATA / "golden-scenario.yaml"), store, host_figures=dict).poll()
    return store


def test_an_extra_source_serving_gpumon_gpu_up_again_is_left_out_and_reported_failed() -> None:
    collector = GpumonCollector(golden_store(), PollIntervals(), monotonic=lambda: 5.0)
    twin = Family("gpumon_gpu_up", "gauge", "A second gpumon_gpu_up.", ("gpu",), [(("0",), 1.0)])
    collector.add("twin", Families(twin))
    for text in scraped(collector):
        assert twins(text) == [], twins(text)
        assert "A second gpumon_gpu_up." not in text
        assert value(text, "gpumon_collector_success", collector="twin") == 0.0


def test_of_two_sources_serving_one_new_family_the_first_is_served_and_the_second_refused() -> None:
    collector = GpumonCollector(golden_store(), PollIntervals(), monotonic=lambda: 5.0)
    first = Family("site_jobs_running", "gauge", "First.", (), [((), 3.0)])
    second = Family("site_jobs_running", "gauge", "Second.", (), [((), 4.0)])
    counter = Family("site_jobs_running_total", "counter", "Same family in OpenMetrics.", (), [((), 1.0)])
    collector.add("first", Families(first))
    collector.add("second", Families(second))
    collector.add("counter", Families(counter))  # a counter's family is its name without _total
    for text in scraped(collector):
        assert value(text, "site_jobs_running") == 3.0
        assert value(text, "gpumon_collector_success", collector="first") == 1.0
        assert value(text, "gpumon_collector_success", collector="second") == 0.0
        assert value(text, "gpumon_collector_success", collector="counter") == 0.0


def test_a_second_source_of_one_name_is_refused_when_added() -> None:
    collector = GpumonCollector(golden_store(), PollIntervals())
    collector.add("site", Families())
    with pytest.raises(ValueError):
        collector.add("site", Families())
    with pytest.raises(ValueError):
        collector.add("gpumon", Families())  # gpumon's own row of gpumon_collector_success


@pytest.mark.parametrize("name", ["gpumon_gpu_up", "gpumon_gpu_info", "gpumon_process_used_memory_bytes"])
def test_a_per_gpu_family_under_a_name_gpumon_makes_itself_is_refused_when_built(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A field declared with ``metric=Metric("gpumon_gpu_up", ...)`` (the metric table's row) would be
    served beside the one gpumon makes; even behind an opt-in of ``exporter.detail`` it is refused."""
    rows = gpu_families.gpu_rows()
    twin = MetricRow(name, "gauge", "A twin.", Tier.FAST, scalar("temperature_celsius"), detail="p2p")
    monkeypatch.setattr(gpu_families, "gpu_rows", lambda: (*rows, twin))
    with pytest.raises(ValueError, match=name):
        GpumonCollector(golden_store(), PollIntervals())


def _burn_record(state_dir: Path) -> None:
    """A last burn with results for the fake NVML's first GPU, and a burn running on it now."""
    files = StateFiles(str(state_dir), warn=print)
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    tests = {"matmul": True, "memory": False, "p2p": True, "allreduce": True}
    gpu = {"node": 0, "gpu": 0, "uuid": uuid, "tests": tests, "matmul": {"dtype": "bf16", "tflops": 600.0}}
    gpu |= {"memory": {"bandwidth_bytes_per_second": 4e12}, "p2p": {"1": 3.9e11}}
    files.write_last({"node": 0, "finished_at": time.time(), "exit_code": 1, "gpus": [gpu]})
    files.write_marker(os.getpid(), [0], [uuid], time.time())


@pytest.mark.parametrize("compat", COMPAT_SETS, ids=lambda c: "+".join(c) or "no-compat")
def test_every_family_gpumon_can_serve_comes_once(tmp_path: Path, compat: tuple[str, ...]) -> None:
    _burn_record(tmp_path)
    exporter = ExporterConfig(processes=True, compat=compat, detail=DETAILS)
    config = Config(
        listen="127.0.0.1:0",
        interval_seconds=0.1,
        state_dir=tmp_path,
        kernel_log=False,
        alerting=default_alerting(),
        exporter=exporter,
    )
    nvml = h200_pair()
    nvml.gpus[0].processes = [(os.getpid(), 1 << 30)]  # a compute process: the per-process series
    daemon = Daemon(config, NvmlBackend(nvml))
    daemon.start()
    try:
        wanted = ("gpumon_gpu_up{", "gpumon_process_used_memory_bytes{", "gpumon_health_status{")
        wait_for(lambda: all(w in daemon.collector.render().decode() for w in wanted), 30, 0.1, "every source's series")
        texts = list(scraped(daemon.collector))
    finally:
        daemon.stop()
    for text in texts:
        assert twins(text) == [], twins(text)
        assert re.findall(r'^gpumon_collector_success\{collector="(\w+)"\} 0', text, flags=re.MULTILINE) == []
    served = set(type_lines(texts[0]))
    assert {
        "gpumon_gpu_up",
        "gpumon_process_used_memory_bytes",
        "gpumon_burn_running",
        "gpumon_health_status",
    } <= served
    sources = set(re.findall(r'^gpumon_collector_success\{collector="(\w+)"\} 1', texts[0], flags=re.MULTILINE))
    assert {"alerts", "burn", "unjudged", "owner_energy", "simulated", "read_errors", "health"} <= sources
    if compat:
        assert "dcgm" in sources and any(name.startswith("DCGM_FI_") for name in served)
