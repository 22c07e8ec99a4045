"""The host-link test: a GPU on a slow or downtrained PCIe link is named, against its link, its model's floor and
its peers; the `slow-pcie:G` injection proves it end to end on CPU workers."""

from __future__ import annotations

from typing import Any

from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.thresholds import Thresholds
from tests.burn.conftest import CPU

H200 = "NVIDIA H200"
GEN5_X16 = {"generation_max": 5, "width_max": 16}


def _pcie(h2d_gbps: float, d2h_gbps: float | None = None) -> dict[str, Any]:
    rates = {
        "h2d_bytes_per_second": h2d_gbps * 1e9,
        "d2h_bytes_per_second": (d2h_gbps or h2d_gbps) * 1e9,
        "bidirectional_bytes_per_second": 2 * h2d_gbps * 1e9,
    }
    return {"model": H200, "bytes": 1 << 28, "pinned": True, "alone": rates, "together": rates}


def _node(results: dict[int, dict[str, Any]], links: dict[int, dict[str, int]]) -> dict[str, Any]:
    return {
        "agent": 0,
        "node": 0,
        "hostname": "h",
        "ranks": [
            {"rank": g, "gpu": g, "node": 0, "model": H200, "results": {"pcie": r}, "errors": [], "last_test": "pcie"}
            for g, r in results.items()
        ],
        "gpus_info": {str(g): {"uuid": f"GPU-{g}", "name": H200} for g in results},
        "pcie": {str(g): link for g, link in links.items()},
        "abort": None,
    }


def _judge(rates: dict[int, float], links: dict[int, dict[str, int]] | None = None) -> Any:
    node = _node({g: _pcie(r) for g, r in rates.items()}, links or dict.fromkeys(rates, GEN5_X16))
    return judge([node], Thresholds(), ("pcie",))


def test_a_gpu_whose_host_link_runs_at_a_quarter_is_named_with_its_link_and_its_peers():
    j = _judge({0: 53.0, 1: 54.0, 2: 13.5, 3: 52.0})
    assert [j.gpus[(0, g)]["tests"]["pcie"] for g in range(4)] == [True, True, False, True]
    (fault,) = j.faults
    assert fault.startswith("GPU 2 (GPU-2): pcie: host link slow: host-to-device 13.5 GB/s alone")
    assert "Gen5 x16" in fault and "device-to-host" in fault
    assert j.gpus[(0, 2)]["pcie"]["link"] == "Gen5 x16"


def test_a_lone_gpu_is_judged_against_its_link_and_its_model_floor():
    assert _judge({0: 53.0}).faults == []
    slow = _judge({0: 20.0})
    assert len(slow.faults) == 1 and "Gen5 x16 link 63.0 GB/s, 32% of it" in slow.faults[0]  # Gen5 x16: 63 GB/s
    gen4 = _judge({0: 26.0}, {0: {"generation_max": 4, "width_max": 16}})  # 82 % of its Gen4 link, below the floor
    assert len(gen4.faults) == 1 and "floor" in gen4.faults[0], gen4.faults


def test_slow_pcie_injection_names_the_gpu_end_to_end(burn):
    r = burn([*CPU, "--gpus", "0,1", "--tests", "pcie"], env={"GPUMON_BURN_INJECT": "slow-pcie:1"})
    assert r.code == 1, r.out + r.err
    assert r.report is not None
    assert [g["tests"]["pcie"] for g in r.report["gpus"]] == [True, False]
    assert r.report["faults"][0].startswith("GPU 1 (") and "pcie: host link slow" in r.report["faults"][0]
    alone = r.report["gpus"][0]["pcie"]["alone"]
    assert set(alone) == {"h2d_bytes_per_second", "d2h_bytes_per_second", "bidirectional_bytes_per_second"}
