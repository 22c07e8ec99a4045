"""The verdict table fits 80 columns with every test, `--wide` shows every column, and its cells agree with the
findings (issue 43.5, 41.11, 46.1): the p2p cell with two GPUs, the lost GPU's telemetry."""

from __future__ import annotations

import io
import re
from typing import Any

from rich.console import Console

from gpumon.burn.verdict import report
from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.thresholds import Thresholds

ALL_TESTS = ("sw", "fingerprint", "pcie", "matmul", "memory", "p2p", "allreduce")
H200 = "NVIDIA H200"


def _gpu(gpu: int, tests: dict[str, bool | None], node: int = 0) -> dict[str, Any]:
    return {
        "node": node,
        "gpu": gpu,
        "rank": gpu,
        "model": H200,
        "tests": tests,
        "matmul": {"tflops": 655.43},
        "memory": {"bandwidth_bytes_per_second": 4.1e12},
        "allreduce": {"busbw_bytes_per_second": 3.5e11},
        "telemetry": {"power_sustained_watts": 690.0, "power_limit_watts": 700.0, "temperature_peak_celsius": 71.0},
    }


def _report(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {"gpus": gpus, "faults": [], "could_not_run": [], "exit_code": 0, "duration_seconds": 20.0}


def _render(rep: dict[str, Any], width: int, wide: bool = False) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None)
    if wide:
        report.render(rep, console, ALL_TESTS, wide=True)
    else:
        report.render(rep, console, ALL_TESTS)
    return out.getvalue()


def test_every_test_on_two_nodes_fits_80_columns_without_a_cut_cell():
    verdicts = dict.fromkeys(ALL_TESTS, True) | {"telemetry": True}
    failing = verdicts | {"matmul": False, "fingerprint": False}
    gpus = [_gpu(g, failing if (n, g) == (1, 1) else verdicts, node=n) for n in range(2) for g in range(8)]
    text = _render(_report(gpus), 80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "…" not in text, text  # was: mod…, TF…, 0.… at 80
    row = next(line for line in text.splitlines() if line.strip().startswith("1:1"))
    assert "FAIL" in row and "fingerprint" in text and "H200" in row and "655.4" in row
    assert "PASS" in next(line for line in text.splitlines() if line.strip().startswith("0:0"))


def test_wide_shows_a_column_per_test_and_the_model_in_full_even_at_80_columns():
    text = _render(_report([_gpu(0, dict.fromkeys(ALL_TESTS, True) | {"telemetry": True})]), 80, wide=True)
    header = next(line for line in text.splitlines() if "fingerprint" in line)
    for column in (*ALL_TESTS, "telemetry", "power W (limit)"):
        assert column in header, header
    assert "NVIDIA H200" in text and "…" not in text


def test_a_lost_gpu_fails_in_the_telemetry_column():
    """A burn on fake:gpu-lost showed PASS in every column: the fault is in telemetry, which had none."""
    lost = _gpu(1, dict.fromkeys(ALL_TESTS, True) | {"telemetry": False})
    text = _render(_report([_gpu(0, dict.fromkeys(ALL_TESTS, True) | {"telemetry": True}), lost]), 200)
    header = next(line for line in text.splitlines() if "telemetry" in line)
    row = next(line for line in text.splitlines() if re.match(r"^\W*1\s", line))
    cells = [c.strip() for c in row.split("│")]
    assert cells[[c.strip() for c in header.split("┃")].index("telemetry")] == "FAIL", (header, row)


def _node(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return {
        "agent": 0,
        "node": 0,
        "hostname": "h",
        "ranks": [
            {"rank": g, "gpu": g, "node": 0, "model": H200, "results": r, "errors": [], "last_test": "p2p"}
            for g, r in results.items()
        ],
        "gpus_info": {str(g): {"uuid": f"GPU-{g}", "name": H200} for g in results},
        "topology": {"0": {"1": "nvlink"}, "1": {"0": "nvlink"}},
        "abort": None,
    }


def _matmul(tflops: float) -> dict[str, Any]:
    return {
        "model": H200,
        "dtype": "bf16",
        "n": 8192,
        "rounds": 10,
        "tflops_median": tflops,
        "tflops_max": tflops,
        "checksum_first": "42",
        "checksum_mismatch_rounds": [],
        "reference": {"size": 256, "tolerance": 2e-2, "max_rel_error": 1e-3, "passed": True},
    }


def test_with_two_gpus_the_one_slow_link_goes_to_the_gpu_the_other_tests_name():
    """2 x H200 with GPU 1 slowed: matmul names GPU 1; the one p2p link (below its floor both ways) was charged
    to both ends, so GPU 0's p2p cell said FAIL while the findings named GPU 1 alone."""
    results = {
        g: {
            "matmul": _matmul(60.0 if g == 1 else 660.0),
            "p2p": {"pairs": [{"dst_gpu": 1 - g, "bytes": 1, "checksum_ok": True, "bytes_per_second": 40e9}]},
        }
        for g in (0, 1)
    }
    j = judge([_node(results)], Thresholds(), ("matmul", "p2p"))
    assert [j.gpus[(0, g)]["tests"]["p2p"] for g in (0, 1)] == [True, False]
    assert "GPU 1" in j.gpus[(0, 0)]["notes"]["p2p"]
    p2p_faults = [f for f in j.faults if "p2p" in f]
    assert p2p_faults == ["link GPU 0 <-> GPU 1: p2p: slow; likely cause: GPU 1 (failed matmul)"]


def test_a_memory_fault_on_a_small_cpu_buffer_gives_its_size_in_mib_not_zero_gib():
    """Issue 46.6: "1 words read back wrong ... in 0.0 GiB"."""
    memory = {
        "model": H200,
        "bytes_tested": 28 << 20,
        "patterns": ["0x00000000"],
        "mismatched_words": 1,
        "first_mismatch": {"pattern": "0xAAAAAAAA", "chunk": 6, "words": 1},
        "bandwidth_bytes_per_second": 1e9,
    }
    j = judge([_node({0: {"memory": memory}})], Thresholds(), ("memory",))
    fault = next(f for f in j.faults if "read back wrong" in f)
    assert "1 word read back wrong" in fault and fault.endswith("in 28 MiB"), fault
