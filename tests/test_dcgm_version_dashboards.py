"""Dashboards and alerts of each dcgm-exporter version return data from the gpumon set made for it.

A real Prometheus scrapes each of four gpumon daemons (fake GPUs, one scenario):

* ``--compat dcgm``: dcgm-exporter <= 4.8.2 (tests/data/dcgm/queries-4.8.2.yaml);
* ``--compat dcgm --compat-hostname-label hostname``: 4.8.3 and later 4.8.x (queries-4.8.3.yaml);
* ``--compat dcgm-4.9``: 4.9 with DCGM 4.7's names and units (queries-4.9.yaml);
* ``--compat dcgm,dcgm-4.9``: a fleet in migration, where the dashboards of <= 4.8.2 and of 4.9
  both work, and a sum over a family both sets share counts each GPU once.

Each panel is evaluated as Grafana does (the dashboard's variables from ``label_values``, then
``$instance``/``$gpu`` as regexes), as an instant and a range query; each alert expression must
return data.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import DATA, DaemonProcess, wait_for
from tests.prometheus_helpers import PrometheusServer, needs_prometheus, run_prometheus

pytestmark = [pytest.mark.integration, needs_prometheus]

SCENARIO = {
    "count": 2,
    "base": {
        "temperature_celsius": 55.0,
        "power_watts": 300.0,
        "utilization_ratio": 0.8,
        "memory_used_bytes": 40960 * 1024 * 1024,
        "clocks_hertz": {"sm": 1755e6, "memory": 3201e6, "graphics": 1755e6},
        "tensor_active_ratio": 0.62,
        "sm_active_ratio": 0.9,
        "dram_active_ratio": 0.55,
    },
}

STACKS = {
    "dcgm": ["--compat", "dcgm"],
    "dcgm-hostname": ["--compat", "dcgm", "--compat-hostname-label", "hostname"],
    "dcgm-4.9": ["--compat", "dcgm-4.9"],
    "both": ["--compat", "dcgm,dcgm-4.9"],
}
NODE_NAME = "k8s-gpu-node-7"
"""What dcgm-exporter's Helm chart puts in $NODE_NAME (the pod's spec.nodeName)."""
CASES = [
    ("dcgm", "4.8.2"),
    ("dcgm-hostname", "4.8.3"),
    ("dcgm-4.9", "4.9"),
    ("both", "4.8.2"),
    ("both", "4.9"),
]


def queries(version: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DATA / "dcgm" / f"queries-{version}.yaml").read_text())
    return loaded


@dataclass
class Stack:
    prometheus: PrometheusServer
    gpumon: DaemonProcess


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable as Grafana writes it into a regex matcher: (a|b), regex-escaped."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", v).replace("\\", "\\\\") for v in values]
    return "(" + "|".join(escaped) + ")" if len(escaped) > 1 else escaped[0]


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Stack]]:
    tmp = tmp_path_factory.mktemp("dcgm-versions")
    scenario = tmp / "two-gpus.yaml"
    scenario.write_text(yaml.safe_dump(SCENARIO))
    with contextlib.ExitStack() as stack:
        daemons: dict[str, DaemonProcess] = {}
        for name, args in STACKS.items():
            where = tmp / name
            where.mkdir()
            daemon = DaemonProcess(["--backend", f"fake:{scenario}", *args], where, env={"NODE_NAME": NODE_NAME})
            stack.callback(daemon.stop)
            daemons[name] = daemon
        out: dict[str, Stack] = {}
        for name, daemon in daemons.items():
            daemon.wait_ready()
            scrape = [{"job_name": "gpumon", "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"]}]}]
            prometheus = stack.enter_context(run_prometheus(Path(tmp / name), scrape))
            out[name] = Stack(prometheus, daemon)
        for s in out.values():
            s.prometheus.wait_target_health("gpumon", "up")
        yield out


def _variables(stack: Stack, version: str) -> tuple[list[str], list[str]]:
    found = []
    for query in queries(version)["variables"]:
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", query).groups()  # type: ignore[union-attr]
        values = wait_for(
            lambda metric=metric, label=label: stack.prometheus.api(f"label/{label}/values", **{"match[]": metric}),
            30,
            0.2,
            f"{query}: values",
        )
        found.append(values)
    return found[0], found[1]


@pytest.mark.parametrize(("stack_name", "version"), CASES)
def test_the_dashboard_variables_list_the_instance_and_both_gpus(
    stacks: dict[str, Stack], stack_name: str, version: str
) -> None:
    stack = stacks[stack_name]
    instances, gpus = _variables(stack, version)
    assert instances == [f"127.0.0.1:{stack.gpumon.port}"]
    assert gpus == ["0", "1"]


@pytest.mark.parametrize(("stack_name", "version"), CASES)
def test_each_panel_returns_the_value_of_each_gpu(stacks: dict[str, Stack], stack_name: str, version: str) -> None:
    stack = stacks[stack_name]
    instances, gpus = _variables(stack, version)
    for panel in queries(version)["panels"]:
        expr = panel["expr"].replace("$instance", grafana_regex(instances)).replace("$gpu", grafana_regex(gpus))
        series = stack.prometheus.wait_query(expr, timeout=15)
        aggregated = expr.startswith(("avg(", "sum("))
        assert len(series) == (1 if aggregated else len(gpus)), f"{panel['title']}: {series}"
        expected = float(panel["expected"]) * (len(gpus) if panel.get("sum") else 1)
        for s in series:
            assert float(s["value"][1]) == pytest.approx(expected), f"{panel['title']}: {s}"
        now = time.time()
        ranged = stack.prometheus.api("query_range", query=expr, start=now - 30, end=now, step=1)["result"]
        assert ranged and all(r["values"] for r in ranged), f"{panel['title']}: no range data"


@pytest.mark.parametrize(("stack_name", "version"), CASES)
def test_each_alert_expression_returns_data(stacks: dict[str, Stack], stack_name: str, version: str) -> None:
    stack = stacks[stack_name]
    for alert in queries(version)["alerts"]:
        series = stack.prometheus.wait_query(alert["expr"], timeout=15)
        if alert.get("aggregated"):
            assert len(series) == 1, f"{alert['title']}: {series}"
        else:
            assert len(series) == 2, f"{alert['title']}: {series}"
        if alert["expected"] is not None:
            for s in series:
                assert float(s["value"][1]) == pytest.approx(float(alert["expected"])), f"{alert['title']}: {s}"


def test_migration_serves_a_shared_family_once_per_gpu(stacks: dict[str, Stack]) -> None:
    """A family neither set renamed (DCGM_FI_PROF_PCIE_TX_BYTES) is one series per GPU carrying both
    sets' labels: sums do not double, and both dashboards' label selectors find it."""
    prometheus = stacks["both"].prometheus
    prometheus.wait_query("DCGM_FI_DEV_GPU_TEMP_CELSIUS")
    (count,) = prometheus.wait_query("count(DCGM_FI_DEV_PCIE_LINK_GEN)")
    assert float(count["value"][1]) == 2
    series = prometheus.query("DCGM_FI_DEV_PCIE_LINK_GEN")
    for s in series:
        assert s["metric"]["Hostname"] == s["metric"]["hostname"]
        assert s["metric"]["DCGM_FI_DRIVER_VERSION"] == s["metric"]["DCGM_FI_SYSTEM_DRIVER_VERSION"]


@pytest.mark.parametrize(
    ("stack_name", "label"), [("dcgm", "Hostname"), ("dcgm-hostname", "hostname"), ("dcgm-4.9", "hostname")]
)
def test_the_host_label_is_the_node_name_from_the_environment(
    stacks: dict[str, Stack], stack_name: str, label: str
) -> None:
    """As dcgm-exporter: $NODE_NAME when set (a pod's own host name is the pod's name)."""
    metric = "DCGM_FI_DEV_GPU_TEMP_CELSIUS" if stack_name == "dcgm-4.9" else "DCGM_FI_DEV_GPU_TEMP"
    values = stacks[stack_name].prometheus.api(f"label/{label}/values", **{"match[]": metric})
    assert values == [NODE_NAME]
