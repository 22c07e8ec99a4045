"""OpenMetrics on /metrics: served when a scraper asks for it (as Prometheus does), byte for byte
what prometheus_client's OpenMetrics exposition writes for the same metrics, and read by a real
Prometheus 2.42."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller, PollIntervals
from gpumon.collect.store import SnapshotStore
from gpumon.exposition import openmetrics
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.text import Family
from gpumon.http.messages import wants_openmetrics
from gpumon.http.server import MetricsServer
from tests.helpers import RenderedBytes
from tests.prometheus_helpers import needs_prometheus, run_prometheus
from tests.test_exporter import golden_collector

PROMETHEUS_242_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TEXT = "text/plain; version=0.0.4; charset=utf-8"


class _Odd:
    """An extra source with what gpumon's own families never hold."""

    def families(self) -> Iterable[Family]:
        events = Family("gpumon_test_events_total", "counter", "Events, a counter.", ("kind",))
        events.add(['a "quoted"\\value\nnewline'], 3)
        yield events
        odd = Family("gpumon_test_odd", "gauge", 'Help with "quotes", a \\ and a\nnewline.', ("v",))
        odd.add(["x"], float("nan"))
        odd.add(["y"], float("inf"))
        yield odd
        untyped = Family("gpumon_test_untyped", "untyped", "Untyped, as DCGM's counters without _total.")
        untyped.add([], 1.0)
        yield untyped


def collectors() -> list[GpumonCollector]:
    store = SnapshotStore()
    Poller(FakeBackend.plausible(9), store).poll()
    plausible = GpumonCollector(store, PollIntervals(), monotonic=lambda: 5.0, processes=True)
    plausible.add("odd", _Odd())
    return [golden_collector(), plausible]


class _Registry:
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> list[Metric]:
        return list(self._collect())


def test_openmetrics_renderer_matches_prometheus_client_byte_for_byte() -> None:
    for collector in collectors():
        expected = openmetrics_generate_latest(_Registry(collector.collect))
        assert openmetrics.render(collector.families()) == expected
        assert collector.render_openmetrics() == expected
        assert expected.endswith(b"# EOF\n")
    assert b'gpumon_test_events_total{kind="a \\"quoted\\"\\\\value\\nnewline"} 3.0' in expected
    assert b"# TYPE gpumon_test_untyped unknown\n" in expected


def test_openmetrics_output_parses_as_openmetrics() -> None:
    for collector in collectors():
        families = list(text_string_to_metric_families(collector.render_openmetrics().decode()))
        assert any(f.name == "gpumon_gpu_up" for f in families)


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (PROMETHEUS_242_ACCEPT, True),
        ("application/openmetrics-text;version=0.0.1", True),
        ("application/openmetrics-text; version=1.0.0; charset=utf-8", True),
        ("Application/OpenMetrics-Text", True),
        ("application/openmetrics-text;version=2.0.0", False),
        ("application/openmetrics-text;q=0", False),
        ("text/plain;version=0.0.4,application/openmetrics-text;q=0.5", False),
        ("text/plain", False),
        ("*/*", False),
        ("", False),
    ],
)
def test_openmetrics_is_chosen_as_the_accept_header_prefers(accept: str, expected: bool) -> None:
    assert wants_openmetrics(accept) is expected


@pytest.fixture
def served() -> Iterator[tuple[str, GpumonCollector, dict[str, int]]]:
    collector = collectors()[1]
    calls = {"text": 0, "openmetrics": 0}

    def render() -> bytes:
        calls["text"] += 1
        return collector.render()

    def collect() -> Iterable[Family]:
        calls["openmetrics"] += 1
        return collector.families()

    server = MetricsServer(("127.0.0.1", 0), RenderedBytes(render, collect), SnapshotStore(), stale_after_seconds=5)
    server.start()
    try:
        yield f"127.0.0.1:{server.port}", collector, calls
    finally:
        server.stop()


def test_prometheus_accept_header_gets_openmetrics_and_others_the_classic_text(
    served: tuple[str, GpumonCollector, dict[str, int]],
) -> None:
    address, collector, _ = served
    om = requests.get(f"http://{address}/metrics", headers={"Accept": PROMETHEUS_242_ACCEPT}, timeout=5)
    assert om.headers["Content-Type"] == OPENMETRICS
    assert om.content == openmetrics_generate_latest(_Registry(collector.collect))
    assert "Accept" in om.headers["Vary"]
    for headers in ({}, {"Accept": "text/plain"}, {"Accept": "*/*"}):
        text = requests.get(f"http://{address}/metrics", headers=headers, timeout=5)
        assert text.headers["Content-Type"] == TEXT
        assert text.content == generate_latest(_Registry(collector.collect))  # type: ignore[arg-type]


@needs_prometheus
@pytest.mark.integration
def test_real_prometheus_scrapes_openmetrics(
    served: tuple[str, GpumonCollector, dict[str, int]], tmp_path: Path
) -> None:
    address, _, calls = served
    jobs = [{"job_name": "gpumon", "static_configs": [{"targets": [address]}]}]
    with run_prometheus(tmp_path, jobs) as prom:
        prom.wait_target_health("gpumon", "up")
        assert prom.wait_query('gpumon_test_events_total{job="gpumon"}')[0]["value"][1] == "3"
        assert prom.wait_query('gpumon_gpu_up{job="gpumon",gpu="8"}')[0]["value"][1] == "1"
    assert calls["openmetrics"] >= 1
    assert calls["text"] == 0, "Prometheus asks for OpenMetrics first and gets it"


def test_each_request_gets_the_format_and_encoding_its_own_headers_ask_for_request_after_request() -> None:
    collector = golden_collector()
    server = MetricsServer(("127.0.0.1", 0), collector, SnapshotStore(), stale_after_seconds=5)
    server.start()
    asks = [
        (PROMETHEUS_242_ACCEPT, "gzip", OPENMETRICS, "gzip"),
        (None, None, TEXT, None),
        (PROMETHEUS_242_ACCEPT, "identity", OPENMETRICS, None),
        ("text/plain", "gzip", TEXT, "gzip"),
    ]
    many = [(f"text/plain;q=0.{i % 9 + 1}", None, TEXT, None) for i in range(80)]  # more sets than are kept
    try:
        with requests.Session() as session:
            for accept, encoding, content_type, content_encoding in [*asks, *many, *asks]:
                headers = {"Accept": accept or "", "Accept-Encoding": encoding or ""}
                response = session.get(f"http://127.0.0.1:{server.port}/metrics", headers=headers, timeout=10)
                assert response.headers["Content-Type"] == content_type
                assert response.headers.get("Content-Encoding") == content_encoding
                expected = collector.render_openmetrics() if content_type == OPENMETRICS else collector.render()
                assert response.content == expected
                assert response.headers["Date"].endswith(" GMT")
    finally:
        server.stop()
