"""The dashboards' queries on replayed real hosts: ``gpumon run --backend replay:`` of each recording
(tests/data/recordings), scraped by a real Prometheus, with per-process series and both DCGM compat sets.

Every panel query of gpumon's dashboards must run, and return data unless it asks for a family this
host does not have (a one-GPU host has no NVLink peers; no burn ran there); dcgm-exporter's dashboard
queries (tests/test_dcgm_dashboard_queries.py) must return data and agree with nvidia-smi's readings
of that host.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.helpers import DaemonProcess, wait_for
from tests.prometheus_helpers import PrometheusServer, SharedPrometheus, needs_prometheus
from tests.replayed import nvidia_smi_facts, recordings
from tests.test_dashboards import queries, served_families, substitute
from tests.test_dcgm_dashboard_queries import PANELS as DCGM_PANELS

pytestmark = [pytest.mark.integration, pytest.mark.slow, needs_prometheus]


@dataclass
class Stack:
    prometheus: PrometheusServer
    exposition: str
    instance: str
    recording: Path


@pytest.fixture(scope="module", params=recordings(), ids=[p.stem for p in recordings()])
def stack(
    shared_prometheus: SharedPrometheus, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    recording: Path = request.param
    tmp: Path = tmp_path_factory.mktemp("replay-dashboards")
    args = ["--backend", f"replay:{recording}", "--processes", "--compat", "dcgm,dcgm-4.9"]
    gpumon = DaemonProcess(args, tmp)
    try:
        gpumon.wait_ready()
        instance = f"127.0.0.1:{gpumon.port}"
        shared_prometheus.scrape("gpumon-replay", instance)
        shared_prometheus.wait_instance_up("gpumon-replay", instance)
        wait_for(  # two samples in a window for rate() and increase()
            lambda: shared_prometheus.query(f'count_over_time(gpumon_gpu_up{{instance="{instance}"}}[1m]) >= 4'),
            60, 0.5, "4 scrapes of the replayed host",
        )  # fmt: skip
        yield Stack(shared_prometheus, gpumon.metrics(), instance, recording)
    finally:
        gpumon.stop()


def run_query(stack: Stack, expr: str) -> dict:  # type: ignore[type-arg]
    return requests.get(f"{stack.prometheus.url}/api/v1/query", params={"query": expr}, timeout=10).json()  # type: ignore[no-any-return]


def test_every_dashboard_query_runs_and_shows_what_the_host_has(stack: Stack) -> None:
    served = served_families(stack.exposition)
    failed, unexplained, with_data = [], [], 0
    for dashboard, panel, expr in queries():
        response = run_query(stack, substitute(expr, stack.instance))
        if response["status"] != "success":
            failed.append(f"{dashboard} / {panel}: {response.get('error')}")
        elif response["data"]["result"]:
            with_data += 1
        else:
            asked = set(re.findall(r"\bgpumon_[a-z0-9_]+", expr))
            if all(n in served or n.removesuffix("_total") in served or f"{n}_total" in served for n in asked):
                unexplained.append(f"{dashboard} / {panel}: {expr}")
    assert failed == []
    assert unexplained == [], "no data though the replayed host serves every family the query asks for"
    assert with_data >= len(queries()) // 2, f"only {with_data} of {len(queries())} panel queries show the host"


def test_dcgm_exporters_dashboard_shows_the_recorded_host(stack: Stack) -> None:
    smi = nvidia_smi_facts(stack.recording)["gpus"][0]
    values = {}
    for title, expr, _ in DCGM_PANELS:
        if "PROF_" in expr:  # GPM needs two samples GPM_SECONDS apart: the golden compat bodies have them
            continue
        query = expr.replace("$instance", re.escape(stack.instance).replace("\\", "\\\\")).replace("$gpu", ".*")
        result = run_query(stack, query)["data"]["result"]
        assert result, f"{title}: no data"
        values[title] = float(result[0]["value"][1])
    assert smi["temperature_c"][0] - 4 <= values["GPU Temperature"] <= smi["temperature_c"][1] + 4
    low, high = smi["power_draw_average_watts"]
    assert 0.7 * low <= values["GPU Power Usage"] <= 1.3 * high
    assert values["GPU SM Clocks"] <= smi["max_sm_clock_mhz"] * 1e6
    low, high = smi["utilization_gpu_percent"]
    assert low - 20 <= values["GPU Utilization"] <= high + 20
    assert abs(values["GPU Framebuffer Mem Used"] - smi["memory_used_mib"][0]) <= 64
