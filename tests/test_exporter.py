"""What a Prometheus scrape of gpumon returns: names, labels, units, omissions, self-metrics."""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition import openmetrics
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.registry import FamilyMetric
from gpumon.exposition.text import go_float
from gpumon.model.families import Family
from gpumon.model.poll_intervals import PollIntervals
from tests.helpers import DATA, examples

GOLDEN = DATA / "golden-metrics.txt"


def golden_collector(processes: bool = True) -> GpumonCollector:
    store = SnapshotStore()
    backend = FakeBackend.from_file(DATA / "golden-scenario.yaml")
    host = {"cpu_utilization_ratio": 0.25, "memory_used_bytes": 8 << 30, "memory_total_bytes": 64 << 30}
    poller = Poller(
        backend, store, wall_clock=lambda: 1_700_000_000.0, monotonic=lambda: 100.0, host_figures=lambda: host
    )
    poller.poll()
    return GpumonCollector(
        store, PollIntervals(), monotonic=lambda: 100.0, processes=processes, version="0.0.0", python_version="3"
    )


def golden_exposition(processes: bool = True) -> str:
    """The fixed scenario, polled once with frozen clocks, as gpumon serves it."""
    return golden_collector(processes).render().decode()


def test_fast_renderer_matches_prometheus_client_byte_for_byte() -> None:
    for collector in (golden_collector(), _plausible_collector(9)):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        assert collector.render().decode() == generate_latest(registry).decode()


def _plausible_collector(gpus: int) -> GpumonCollector:
    store = SnapshotStore()
    Poller(FakeBackend.plausible(gpus), store).poll()
    return GpumonCollector(store, PollIntervals(), monotonic=lambda: 5.0, processes=True)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out.append((dict(s.labels), s.value))
    return out


def test_metrics_match_the_golden_file_byte_for_byte() -> None:
    text = golden_exposition()
    assert GOLDEN.exists(), "run `make golden` to create tests/data/golden-metrics.txt"
    assert text == GOLDEN.read_text(), "exposition changed: review the diff, then `make generate` (or `make golden`)"


def test_golden_file_passes_promtool_check_metrics() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); CI installs it")
    result = subprocess.run([promtool, "check", "metrics"], input=GOLDEN.read_text(), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def test_every_per_gpu_series_has_gpu_and_uuid_labels_and_no_nan() -> None:
    host_level = {
        "gpumon_build_info",
        "gpumon_nvml_up",
        "gpumon_poll_skipped_total",
        "gpumon_config_last_reload_successful",
        "gpumon_config_last_reload_success_timestamp_seconds",
        "gpumon_http_connections_open",
        "gpumon_http_connections_shed_total",
        "gpumon_kernel_log_xids_total",
        "gpumon_snapshot_age_seconds",
        "gpumon_snapshot_timestamp_seconds",
        "gpumon_poll_duration_seconds",
        "gpumon_poll_errors_total",
        "gpumon_last_poll_timestamp_seconds",
        "gpumon_host_cpu_utilization_ratio",
        "gpumon_host_memory_used_bytes",
        "gpumon_host_memory_total_bytes",
        "gpumon_gpus",
        "gpumon_collector_success",
        "gpumon_collector_duration_seconds",
    }
    for family in text_string_to_metric_families(golden_exposition()):
        for s in family.samples:
            assert not math.isnan(s.value), s
            assert s.name.startswith("gpumon_")
            if s.name not in host_level:
                assert {"gpu", "uuid"} <= set(s.labels), s


def test_values_are_in_base_units() -> None:
    text = golden_exposition()
    assert samples(text, "gpumon_clock_hertz")[0][1] >= 1e9
    assert (
        {"gpu": "0", "uuid": "GPU-00000000-1111-2222-3333-444444444444"},
        0.97,
    ) in samples(text, "gpumon_gpu_utilization_ratio")
    assert ({"gpu": "0", "uuid": "GPU-00000000-1111-2222-3333-444444444444"}, 123456789.125) in samples(
        text, "gpumon_energy_joules_total"
    )


def _names(text: str, gpu: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples if s.labels.get("gpu") == gpu}


def test_unsupported_fields_are_omitted_not_zero() -> None:
    text = golden_exposition()
    gpu1_temps = [labels["sensor"] for labels, _ in samples(text, "gpumon_temperature_celsius") if labels["gpu"] == "1"]
    assert gpu1_temps == ["gpu"]
    assert "gpumon_fan_speed_ratio" in _names(text, "0")
    assert "gpumon_fan_speed_ratio" not in _names(text, "1")
    assert "gpumon_pcie_throughput_bytes_per_second" not in _names(text, "1")


def test_clock_events_one_series_per_reason_reported() -> None:
    reasons = {
        labels["reason"]: v
        for labels, v in samples(golden_exposition(), "gpumon_clock_event_active")
        if labels["gpu"] == "0"
    }
    assert reasons["sw_power_cap"] == 1.0
    assert "hw_slowdown" not in reasons  # reported, inactive: no series by default (exporter.detail zero_rows)
    assert "display_clock_setting" not in reasons  # the scenario's GPU 0 does not report it


def test_nvlink_p2p_and_topology_series() -> None:
    """By default: per-GPU NVLink aggregates, per-link rows of a link down or with errors, no P2P
    row that is OK, no topology (tests/test_series_budget.py: the opt-ins)."""
    text = golden_exposition()
    assert ({"gpu": "1", "uuid": "GPU-55555555-6666-7777-8888-999999999999", "link": "0"}, 0.0) in samples(
        text, "gpumon_nvlink_link_up"
    )
    crc = [
        v
        for labels, v in samples(text, "gpumon_nvlink_link_errors_total")
        if labels["gpu"] == "0" and labels["link"] == "1" and labels["type"] == "crc"
    ]
    assert crc == [3.0]
    assert ({"gpu": "0", "uuid": "GPU-00000000-1111-2222-3333-444444444444", "type": "crc"}, 3.0) in samples(
        text, "gpumon_nvlink_errors_total"
    )
    assert not samples(text, "gpumon_p2p_status")  # every capability OK in the scenario
    assert not samples(text, "gpumon_topology_info")


def test_per_process_series_are_opt_in() -> None:
    assert samples(golden_exposition(processes=True), "gpumon_process_used_memory_bytes")
    without = golden_exposition(processes=False)
    assert not samples(without, "gpumon_process_used_memory_bytes")
    assert samples(without, "gpumon_processes")  # the per-GPU count stays


def test_help_text_says_how_often_values_refresh() -> None:
    text = golden_exposition()
    assert "# HELP gpumon_power_watts Power draw, watts (nvidia-smi power.draw). Refreshed every 1s." in text
    assert "Refreshed every 10s." in text.split("# HELP gpumon_ecc_errors_total", 1)[1].splitlines()[0]
    # a counter read less often than its tier says so (tests/test_nvml_spacing.py)
    assert "Refreshed every 60s." in text.split("# HELP gpumon_energy_joules_total", 1)[1].splitlines()[0]


class _Broken:
    def collect(self) -> Iterable[object]:
        raise RuntimeError("boom")


def test_a_failing_extra_collector_does_not_break_the_scrape() -> None:
    store = SnapshotStore()
    Poller(FakeBackend.plausible(1), store).poll()
    collector = GpumonCollector(store, PollIntervals())
    collector.add("broken", _Broken())  # type: ignore[arg-type]
    text = collector.render().decode()
    assert ({"collector": "broken"}, 0.0) in samples(text, "gpumon_collector_success")
    assert ({"collector": "gpumon"}, 1.0) in samples(text, "gpumon_collector_success")
    assert samples(text, "gpumon_gpu_up")


def test_lost_gpu_keeps_identity_counters_and_up_zero_only(tmp_path: Path) -> None:
    """DESIGN.md §4: a lost GPU's live readings go, its identity and counters stay."""
    scenario = tmp_path / "lost.yaml"
    scenario.write_text("gpus:\n  - lost_at_tick: 1\n  - {}\n")
    store = SnapshotStore()
    poller = Poller(FakeBackend.from_file(scenario), store)
    poller.poll()
    poller.poll()
    text = GpumonCollector(store, PollIntervals()).render().decode()
    up = {labels["gpu"]: v for labels, v in samples(text, "gpumon_gpu_up")}
    assert up == {"0": 0.0, "1": 1.0}
    kept = _names(text, "0") - {"gpumon_gpu_up", "gpumon_gpu_info"}
    assert kept and all(name.endswith("_total") for name in kept), kept
    assert "gpumon_temperature_celsius" in _names(text, "1")


def _energy_over_five_polls(values: list[float]) -> list[float]:
    """The energy series a scrape shows after each of five polls, 1 s apart, with a slow tier every 2 s."""
    clock = [1000.0]
    store = SnapshotStore()
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"energy_joules_total": values}}]})
    poller = Poller(
        backend,
        store,
        PollIntervals(1, 2, 100),
        monotonic=lambda: clock[0],
        wall_clock=lambda: clock[0],
        host_figures=dict,
    )
    collector = GpumonCollector(store, PollIntervals(1, 2, 100), monotonic=lambda: clock[0])
    seen = []
    for _ in range(5):
        poller.poll()
        seen.append(samples(collector.render().decode(), "gpumon_energy_joules_total")[0][1])
        clock[0] += 1
    return seen


def test_slow_tier_series_follow_each_slow_read_despite_render_caching() -> None:
    seen = _energy_over_five_polls([1.0, 2.0, 3.0, 4.0, 5.0])
    assert seen == [1.0, 1.0, 3.0, 3.0, 5.0]


class _Odd:
    """An extra source with what gpumon's own table never holds: label values to escape,
    a counter, an untyped family, a label left out of some samples, an empty family."""

    def families(self) -> Iterable[Family]:
        gauge = Family("odd_gauge", "gauge", 'help with \\ and\nnewline and "quotes"', ("b", "a"))
        gauge.add(['back\\slash "q"\nline', "1"], 1.5)
        gauge.add(["x", "2"], math.inf)
        gauge.add(["y", "3"], -0.0)
        gauge.add(["z", "4"], 1e-7)
        gauge.add(["w", "5"], math.nan)
        yield gauge
        counter = Family("odd_events_total", "counter", "a counter", ("kind",))
        counter.add(["k"], 3.0)
        yield counter
        untyped = Family("odd_energy", "untyped", "an untyped family", ("gpu",), plain_labels=True)
        untyped.add(["0"], 12.0)
        yield untyped
        sparse = Family(
            "odd_bandwidth", "gauge", "peer only on p2p", ("gpu", "test", "peer"), optional_labels=("peer",)
        )
        sparse.add(["0", "memory", ""], 1.0)
        sparse.add(["0", "p2p", "1"], 2.0)
        yield sparse
        bare = Family("odd_bare", "gauge", "labels all optional", ("x",), optional_labels=("x",))
        bare.add([""], 4.0)
        yield bare
        yield Family("odd_empty", "gauge", "no samples")


class _Failing:
    def families(self) -> Iterable[Family]:
        yield Family("odd_partial", "gauge", "yielded before the failure")
        raise RuntimeError("broken source")


class _WithSamples:
    """The families of a collector that have samples: gpumon leaves the others out (validators reject them)."""

    def __init__(self, collector: GpumonCollector) -> None:
        self._collector = collector

    def collect(self) -> Any:
        return [family for family in self._collector.collect() if family.samples]


def test_extra_sources_render_as_prometheus_client_does() -> None:
    """Every source's families (alerts, health, burn, DCGM...) in text and OpenMetrics, byte for
    byte what prometheus_client writes for the same families."""
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    collector = golden_collector()
    collector.add("odd", _Odd())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_WithSamples(collector))  # type: ignore[arg-type]
    strip = "gpumon_collector_duration_seconds"  # timed per scrape: differs between the two scrapes
    for ours, theirs in (
        (collector.render(), generate_latest(registry)),
        (collector.render_openmetrics(), openmetrics_latest(registry)),
    ):
        assert [line for line in ours.decode().splitlines() if strip not in line] == [
            line for line in theirs.decode().splitlines() if strip not in line
        ]
    text = collector.render().decode()
    assert 'odd_gauge{a="1",b="back\\\\slash \\"q\\"\\nline"} 1.5' in text
    assert "# TYPE odd_energy untyped\n" in text
    assert "# TYPE odd_energy unknown\n" in collector.render_openmetrics().decode()
    assert 'odd_bandwidth{gpu="0",test="memory"} 1.0\nodd_bandwidth{gpu="0",peer="1",test="p2p"} 2.0\n' in text
    assert "odd_bare 4.0\n" in text


def test_a_failing_source_is_left_out_whole_and_reported() -> None:
    collector = golden_collector()
    collector.add("broken", _Failing())
    text = collector.render().decode()
    assert "odd_partial" not in text
    assert 'gpumon_collector_success{collector="broken"} 0.0' in text
    assert 'gpumon_collector_success{collector="gpumon"} 1.0' in text


def test_a_family_is_the_prometheus_client_family_of_the_same_samples() -> None:
    from prometheus_client.core import UnknownMetricFamily

    gauge = Family("g", "gauge", "h", ("a",))
    gauge.add(["1"], 2.0)
    expected_gauge = GaugeMetricFamily("g", "h", labels=["a"])
    expected_gauge.add_metric(["1"], 2.0)
    assert FamilyMetric(gauge) == expected_gauge
    counter = Family("c_total", "counter", "h", ("a",))
    counter.add(["1"], 2.0)
    expected_counter = CounterMetricFamily("c", "h", labels=["a"])
    expected_counter.add_metric(["1"], 2.0)
    assert FamilyMetric(counter) == expected_counter
    untyped = Family("u", "untyped", "h")
    untyped.add([], 2.0)
    assert FamilyMetric(untyped) == UnknownMetricFamily("u", "h", value=2.0)
    sparse = Family("s", "gauge", "h", ("a", "b"), optional_labels=("b",))
    sparse.add(["1", ""], 2.0)
    sparse.add(["", "x"], 3.0)
    expected_sparse = Metric("s", "h", "gauge")
    expected_sparse.add_sample("s", {"a": "1"}, 2.0)
    expected_sparse.add_sample("s", {"a": "", "b": "x"}, 3.0)
    assert FamilyMetric(sparse) == expected_sparse
    with pytest.raises(ValueError, match="_total"):
        Family("c", "counter", "h")
    with pytest.raises(ValueError, match="kind"):
        Family("h", "histogram", "h")


@settings(max_examples=examples(2000))
@example(0.1)
@example(1e7)
@example(12345678.0)
@example(1e15)
@example(123456789012345.0)
@example(1e16)
@example(1e300)
@example(5e-324)
@example(-1e7)
@given(
    st.one_of(
        st.floats(), st.integers(min_value=-(10**20), max_value=10**20).map(float), st.integers(-(10**20), 10**20)
    )
)
def test_a_sample_value_is_written_as_prometheus_client_writes_it(value: float) -> None:
    """The daemon writes values without prometheus_client (it does not import it); the text is
    the same for every float: signs, infinities, NaN, and Go's exponent from 1e7 up (the examples:
    each side of that edge and of Python's own exponent at 1e16, the smallest and largest)."""
    assert go_float(value) == floatToGoString(value)


def test_the_openmetrics_content_type_is_prometheus_clients() -> None:
    assert openmetrics.CONTENT_TYPE == OPENMETRICS_CONTENT_TYPE_LATEST


def test_scrapes_of_one_snapshot_agree_and_the_next_polls_values_show_in_the_next_scrape() -> None:
    """Several scrapers (or concurrent scrapes) of one snapshot get the same text (what they cost is
    timed by benchmarks/bench_reuse.py); the next poll's values show in the next scrape."""
    clock = [1000.0]
    store = SnapshotStore()
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"temperature_celsius": [40.0, 41.0, 42.0]}}]})
    poller = Poller(backend, store, monotonic=lambda: clock[0], wall_clock=lambda: clock[0], host_figures=dict)
    collector = GpumonCollector(store, PollIntervals(), monotonic=lambda: clock[0])
    seen = []
    for _ in range(2):
        poller.poll()
        bodies = {collector.render() for _ in range(3)}
        assert len(bodies) == 1
        seen.append(samples(bodies.pop().decode(), "gpumon_temperature_celsius")[0][1])
        clock[0] += 1
    assert seen == [40.0, 41.0]


def test_openmetrics_scrapes_follow_each_snapshot_and_match_prometheus_client() -> None:
    from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

    clock = [1000.0]
    store = SnapshotStore()
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"temperature_celsius": [40.0, 41.0]}}]})
    poller = Poller(backend, store, monotonic=lambda: clock[0], wall_clock=lambda: clock[0], host_figures=dict)
    collector = GpumonCollector(store, PollIntervals(), monotonic=lambda: clock[0], processes=True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    for expected in ("40.0", "41.0"):
        poller.poll()
        ours = [collector.render_openmetrics().decode() for _ in range(2)]
        strip = "gpumon_collector_duration_seconds{"
        theirs = [line for line in openmetrics_latest(registry).decode().splitlines() if strip not in line]
        for text in ours:
            assert [line for line in text.splitlines() if strip not in line] == theirs
            uuid = backend.scripts[0].uuid
            assert f'gpumon_temperature_celsius{{gpu="0",sensor="gpu",uuid="{uuid}"}} {expected}' in text
        clock[0] += 1


def test_slow_tier_series_prepared_on_the_polling_thread_are_served_as_read() -> None:
    """Subscribed to the store, the collector prepares a slow read's series on the polling thread
    (benchmarks/bench_reuse.py times what a scrape costs then); the scrape that follows serves them as read."""
    store = SnapshotStore()
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"energy_joules_total": [1.0, 2.0]}}]})
    collector = GpumonCollector(store, PollIntervals())
    store.subscribe(collector.prepare)
    Poller(backend, store, host_figures=dict).poll()
    text = collector.render().decode()
    assert samples(text, "gpumon_energy_joules_total")[0][1] == 1.0
    fresh = GpumonCollector(store, PollIntervals()).render().decode()
    assert samples(text, "gpumon_energy_joules_total") == samples(fresh, "gpumon_energy_joules_total")


def test_a_slow_read_with_new_values_shows_them_and_one_with_the_same_values_keeps_the_text() -> None:
    seen = _energy_over_five_polls([1.0, 1.0, 1.0, 1.0, 2.0])
    assert seen == [1.0, 1.0, 1.0, 1.0, 2.0]
