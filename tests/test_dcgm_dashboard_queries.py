"""dcgm-exporter's published Grafana dashboard works on gpumon --compat dcgm, unchanged.

A real Prometheus scrapes ``gpumon run --backend fake:... --compat dcgm`` every second;
the queries below have the shape of NVIDIA's dashboard (grafana/dcgm-exporter-dashboard.json
in NVIDIA/dcgm-exporter): its variables come from ``label_values(DCGM_FI_DEV_GPU_TEMP,
instance)`` and ``label_values(DCGM_FI_DEV_GPU_TEMP, gpu)``, and every panel selects
``{instance=~"$instance", gpu=~"$gpu"}``. Each panel query must return data.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from tests.helpers import DaemonProcess, wait_for
from tests.prometheus_helpers import PrometheusServer, SharedPrometheus, needs_prometheus

pytestmark = [pytest.mark.integration, needs_prometheus]

SCENARIO = {
    "count": 2,
    "base": {
        "temperature_celsius": 55.0,
        "power_watts": 300.0,
        "utilization_ratio": 0.8,
        "memory_used_bytes": 40960 * 1024 * 1024,
        "clocks_hertz": {"sm": 1755e6, "memory": 3201e6, "graphics": 1755e6},
        # GPM (profiling) fields: the plausible fake GPUs have none, so the scenario sets them
        "tensor_active_ratio": 0.62,
        "sm_active_ratio": 0.9,
        "sm_occupancy_ratio": 0.4,
        "dram_active_ratio": 0.55,
    },
}

# (panel title, expression with the dashboard's variables, expected value of each series)
PANELS = [
    ("GPU Temperature", 'DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}', 55.0),
    ("GPU Avg. Temp", 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})', 55.0),
    ("GPU Power Usage", 'DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}', 300.0),
    ("GPU Power Total", 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})', 600.0),
    ("GPU SM Clocks", 'DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000', 1755e6),
    ("GPU Utilization", 'DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}', 80.0),
    ("GPU Framebuffer Mem Used", 'DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}', 40960.0),
    ("Tensor Core Utilization", 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}', 0.62),
]


@dataclass
class Stack:
    prometheus: PrometheusServer
    gpumon: DaemonProcess
    instances: list[str]
    gpus: list[str]


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable as Grafana writes it into a Prometheus regex matcher: (a|b), regex-escaped.

    Inside the PromQL string literal each backslash is doubled, as Grafana does.
    """
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", v).replace("\\", "\\\\") for v in values]
    return "(" + "|".join(escaped) + ")" if len(escaped) > 1 else escaped[0]


@pytest.fixture(scope="module")
def stack(shared_prometheus: SharedPrometheus, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("dcgm-dashboard")
    scenario = tmp / "two-gpus.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    gpumon = DaemonProcess(["--backend", f"fake:{scenario}", "--compat", "dcgm"], tmp)
    try:
        gpumon.wait_ready()
        wait_for(
            lambda: "DCGM_FI_DEV_GPU_TEMP{" in gpumon.metrics(),
            10,
            0.2,
            "DCGM_FI_* series on gpumon's /metrics with --compat dcgm (is DcgmCompatCollector wired in daemon.py?)",
        )
        prometheus = shared_prometheus  # it may scrape other gpumons too: only this one serves DCGM_FI_*
        instance = f"127.0.0.1:{gpumon.port}"
        prometheus.scrape("gpumon-dcgm", instance)
        prometheus.wait_instance_up("gpumon-dcgm", instance)
        prometheus.wait_query("DCGM_FI_DEV_GPU_TEMP")
        # the dashboard's variables: label_values(DCGM_FI_DEV_GPU_TEMP, instance) and (…, gpu)
        instances = prometheus.api("label/instance/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"})
        gpus = prometheus.api("label/gpu/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"})
        yield Stack(prometheus, gpumon, instances, gpus)
    finally:
        gpumon.stop()


def test_dashboard_variables_list_the_instance_and_both_gpus(stack: Stack) -> None:
    assert stack.instances == [f"127.0.0.1:{stack.gpumon.port}"]
    assert stack.gpus == ["0", "1"]


@pytest.mark.parametrize("variables", ["all", "one gpu"])
@pytest.mark.parametrize(("title", "expr", "expected"), PANELS, ids=[p[0] for p in PANELS])
def test_each_dashboard_panel_returns_data(
    stack: Stack, title: str, expr: str, expected: float, variables: str
) -> None:
    gpus = stack.gpus if variables == "all" else stack.gpus[-1:]
    query = expr.replace("$instance", grafana_regex(stack.instances)).replace("$gpu", grafana_regex(gpus))
    series = stack.prometheus.wait_query(query, timeout=15)
    aggregated = query.startswith(("avg(", "sum("))
    assert len(series) == (1 if aggregated else len(gpus)), f"{title}: {series}"
    if title == "GPU Power Total":
        expected = 300.0 * len(gpus)
    for s in series:
        assert float(s["value"][1]) == pytest.approx(expected), f"{title}: {s}"
        if not aggregated:
            assert s["metric"]["instance"] == stack.instances[0]
    # the graph panels use range queries over the dashboard's time range
    now = time.time()
    ranged = stack.prometheus.api("query_range", query=query, start=now - 30, end=now, step=1)["result"]
    assert ranged and all(r["values"] for r in ranged), f"{title}: no range data"


def test_series_carry_dcgm_exporters_identity_labels(stack: Stack) -> None:
    (series,) = stack.prometheus.query('DCGM_FI_DEV_GPU_TEMP{gpu="1"}')
    labels = series["metric"]
    assert labels["device"] == "nvidia1"
    assert labels["modelName"] == "NVIDIA H200"
    assert labels["UUID"].startswith("GPU-")
    assert labels["pci_bus_id"] == "00000000:28:00.0"
    assert labels["Hostname"]
