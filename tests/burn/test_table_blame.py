"""The burn table and JSON say what each GPU did: a slow link is charged to the GPU the evidence names
(every link of it slow), and its healthy peers show PASS with a note, never FAIL."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from gpumon.burn.verdict import report
from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.thresholds import Thresholds

TH = Thresholds()
GPUS = range(4)


def _matmul(tflops: float) -> dict[str, Any]:
    return {
        "model": "NVIDIA H100 80GB HBM3",
        "dtype": "bf16",
        "n": 8192,
        "rounds": 10,
        "tflops_median": tflops,
        "tflops_max": tflops,
        "checksum": "42",
        "checksum_first": "42",
        "checksum_mismatch_rounds": [],
        "reference": {"size": 256, "tolerance": 2e-2, "max_rel_error": 1e-3, "passed": True},
    }


def _p2p(src: int, slow_gpu: int | None) -> dict[str, Any]:
    pairs = [
        {
            "src_gpu": src,
            "dst_gpu": dst,
            "bytes": 1,
            "checksum_ok": True,
            "bytes_per_second": 150e9 if slow_gpu in (src, dst) else 390e9,
        }
        for dst in GPUS
        if dst != src
    ]
    return {"pairs": pairs}


def _allreduce(rank: int, busbw: float, slow_gpu: int | None) -> dict[str, Any]:
    size = {
        "bytes": 2**30,
        "iterations": 10,
        "seconds_per_op": 1,
        "algbw_bytes_per_second": 1,
        "busbw_bytes_per_second": busbw,
        "mismatched_elements": 0,
    }
    d: dict[str, Any] = {"dtype": "bf16", "world_size": 4, "sizes": [size]}
    if rank == 0 and slow_gpu is not None:
        d["pairwise"] = [
            {"ranks": [a, b], "busbw_bytes_per_second": 60e9 if slow_gpu in (a, b) else 300e9}
            for a in GPUS
            for b in GPUS
            if a < b
        ]
    return d


def _node(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return {
        "agent": 0,
        "node": 0,
        "hostname": "h",
        "ranks": [
            {
                "rank": g,
                "gpu": g,
                "node": 0,
                "model": "NVIDIA H100 80GB HBM3",
                "results": r,
                "errors": [],
                "ready": True,
                "done": True,
                "exit_code": 0,
                "last_test": "allreduce",
            }
            for g, r in results.items()
        ],
        "gpus_info": {str(g): {"uuid": f"GPU-{g}", "name": "NVIDIA H100 80GB HBM3"} for g in results},
        "topology": {str(g): {str(p): "nvlink" for p in GPUS if p != g} for g in GPUS},
        "abort": None,
    }


def _gpu3_slow(*, matmul_too: bool) -> dict[int, dict[str, Any]]:
    """GPU 3 slow on every link (p2p and the pairwise all-reduce runs), and in matmul when ``matmul_too``
    (a competing process on it, the shape measured on 4 x H100); the group all-reduce below its floor."""
    return {
        g: {
            "matmul": _matmul(400 if (g == 3 and matmul_too) else 700),
            "p2p": _p2p(g, 3),
            "allreduce": _allreduce(g, 100e9, 3),
        }
        for g in GPUS
    }


TESTS = ("matmul", "p2p", "allreduce")


def _verdicts(results: dict[int, dict[str, Any]]) -> tuple[Any, dict[str, list[bool | None]]]:
    j = judge([_node(results)], TH, TESTS)
    return j, {t: [j.gpus[(0, g)]["tests"].get(t) for g in GPUS] for t in TESTS}


def test_a_gpu_slow_on_every_link_fails_alone_in_p2p_and_all_reduce() -> None:
    for matmul_too in (True, False):
        j, verdicts = _verdicts(_gpu3_slow(matmul_too=matmul_too))
        assert verdicts["p2p"] == [True, True, True, False], matmul_too
        assert verdicts["allreduce"] == [True, True, True, False], matmul_too
        text = "\n".join(j.faults)
        assert "GPU 3: p2p: every link of this GPU is slow while most other links are fine" in text
        assert "GPU 3: allreduce: every link of this GPU is slow while most other links are fine" in text
        assert "GPU 0" not in text and "GPU 1" not in text and "GPU 2" not in text


def test_the_healthy_peers_carry_a_note_naming_the_slow_gpu_in_the_json() -> None:
    j, _ = _verdicts(_gpu3_slow(matmul_too=True))
    built = report.build(j, options={}, thresholds={}, started_at=0.0, finished_at=1.0, injection="")
    by_gpu = {g["gpu"]: g for g in built["gpus"]}
    for gpu in (0, 1, 2):
        notes = by_gpu[gpu].get("notes") or {}
        assert "GPU 3" in notes.get("p2p", ""), by_gpu[gpu]
        assert "GPU 3" in notes.get("allreduce", ""), by_gpu[gpu]
    assert not by_gpu[3].get("notes")
    charged = [c for c in built["checks"] if c["test"] == "p2p" and c["passed"] is False]
    assert charged and all(c["charged_to"] == [[0, 3]] for c in charged)


def test_the_table_marks_fail_only_on_the_slow_gpu() -> None:
    j, _ = _verdicts(_gpu3_slow(matmul_too=True))
    built = report.build(j, options={}, thresholds={}, started_at=0.0, finished_at=1.0, injection="")
    out = io.StringIO()
    report.render(built, Console(file=out, width=200, color_system=None), TESTS)
    rows = {line.split("│")[1].strip(): line for line in out.getvalue().splitlines() if line.count("│") > 3}
    assert "FAIL" in rows["3"]
    for gpu in ("0", "1", "2"):
        assert "FAIL" not in rows[gpu] and "PASS*" in rows[gpu], rows[gpu]
        assert f"* GPU {gpu} p2p: slow only on its links to GPU 3" in out.getvalue()


def test_one_slow_link_between_healthy_gpus_still_fails_both_of_its_ends() -> None:
    results = {g: {"p2p": _p2p(g, None)} for g in GPUS}
    for pair in results[0]["p2p"]["pairs"]:
        if pair["dst_gpu"] == 1:
            pair["bytes_per_second"] = 100e9
    j = judge([_node(results)], TH, ("p2p",))
    assert j.faults == ["link GPU 0 <-> GPU 1: p2p: slow"]
    assert [j.gpus[(0, g)]["tests"]["p2p"] for g in GPUS] == [False, False, True, True]


def test_a_slow_group_nobody_names_still_fails_together() -> None:
    results = {g: {"allreduce": _allreduce(g, 100e9, None)} for g in GPUS}
    j = judge([_node(results)], TH, ("allreduce",))
    assert [j.gpus[(0, g)]["tests"]["allreduce"] for g in GPUS] == [False] * 4
