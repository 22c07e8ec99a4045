"""The fleet-wide SDC fingerprint: a GPU that computes the same wrong answer every time is named across nodes.

Its repeated GEMMs agree with each other (the matmul test's self-check passes), so only a
comparison with other GPUs given the same inputs finds it: here three "nodes" of one GPU each on
loopback, one of them made to flip the same bit every time (``sdc:G``, set on that node alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from gpumon.burn.verdict.judge_fingerprint import judge_fingerprint
from gpumon.burn.verdict.judgement import Judgement
from gpumon.exposition.burn_results import BurnResultsCollector
from gpumon.exposition.registry import MetricsOf
from gpumon.state.burn_record import StateFiles
from tests.helpers import free_port

H200_SW = "torch 2.9.0, CUDA 12.8, 132 SMs"


def _judgement(nodes: int) -> Judgement:
    j = Judgement(multi_node=nodes > 1)
    for n in range(nodes):
        j.gpus[(n, 0)] = {"node": n, "gpu": 0, "uuid": f"GPU-{n}", "model": "H200", "tests": {}}
    return j


def _result(bf16: str, software: str = H200_SW, model: str = "H200") -> dict:
    return {"model": model, "software": software, "n": 2048, "digests": {"bf16": bf16, "memory": "aa"}}


def test_the_gpu_outvoted_by_its_model_is_named_with_its_node_even_with_one_gpu_per_node():
    j = _judgement(3)
    judge_fingerprint(j, {(0, 0): _result("11"), (1, 0): _result("22"), (2, 0): _result("11")})
    assert j.faults == [
        "node 1 GPU 0 (GPU-1): fingerprint: bf16 results differ from the majority of the 2 other H200 GPUs "
        "given identical inputs: silent data corruption (a wrong answer every time)"
    ]
    failed = [(c["node"], c["check"]) for c in j.checks if c["passed"] is False]
    assert failed == [(1, "digest_bf16")]
    assert j.gpus[(1, 0)]["fingerprint"] == {"software": H200_SW, "digests": {"bf16": "22", "memory": "aa"}}


def test_two_gpus_that_disagree_are_both_named_and_a_lone_gpu_is_not_judged():
    j = _judgement(2)
    judge_fingerprint(j, {(0, 0): _result("11"), (1, 0): _result("22")})
    assert len(j.faults) == 1 and j.faults[0].startswith("node 0 GPU 0 (GPU-0), node 1 GPU 0 (GPU-1): fingerprint")
    assert "no majority" in j.faults[0]
    lone = _judgement(1)
    judge_fingerprint(lone, {(0, 0): _result("11")})
    assert lone.faults == [] and {c["passed"] for c in lone.checks} == {None}


def test_gpus_on_other_software_or_another_model_are_not_compared():
    """cuBLAS of another version may pick other kernels: different bits are not a fault there."""
    j = _judgement(3)
    other = "torch 2.8.0, CUDA 12.6, 132 SMs"
    judge_fingerprint(j, {(0, 0): _result("11"), (1, 0): _result("22", other), (2, 0): _result("11")})
    assert j.faults == []
    assert "not compared with 1 H200 GPUs on torch 2.8.0" in next(c["detail"] for c in j.checks if c["node"] == 0)


def _node(rank: int, port: int, state: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpumon.burn",
        *("--nnodes", "3", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port)),
        *("--device", "cpu", "--gpus", "0", "--tests", "fingerprint,matmul", "--duration", "1"),
        *("--state-dir", str(state), "--json", str(state / "report.json")),
    ]


def test_three_one_gpu_nodes_name_the_node_whose_gpu_computes_the_same_wrong_answer_every_time(tmp_path):
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_BURN_")}
    procs = [
        subprocess.Popen(
            _node(rank, port, tmp_path / f"node{rank}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**base, "GPUMON_BURN_INJECT": "sdc:0"} if rank == 1 else base,
        )
        for rank in range(3)
    ]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [1, 1, 1], outs
    report = json.loads((tmp_path / "node0" / "report.json").read_text())
    faults = report["faults"]
    assert faults[0].startswith("node 1 GPU 0") and "fingerprint: bf16, fp32, fp64, memory results differ" in faults[0]
    assert all(f.startswith("node 1 GPU 0") for f in faults), faults  # nodes 0 and 2 are not blamed
    verdicts = {g["node"]: g["tests"]["fingerprint"] for g in report["gpus"]}
    assert verdicts == {0: True, 1: False, 2: True}
    repeat = next(c for c in report["checks"] if c["check"] == "bit_exact_repeat" and c["node"] == 1)
    assert repeat["passed"] is True  # consistent: the repeated-GEMM self-check cannot see it
    digests = [g["fingerprint"]["digests"] for g in report["gpus"]]
    assert digests[0] == digests[2] and all(digests[1][k] != digests[0][k] for k in digests[0])
    assert "FAULT node 1 GPU 0" in outs[0][0]


def test_the_digests_are_exported_for_comparison_across_runs(tmp_path):
    report = {
        "node": 0,
        "finished_at": 1.0,
        "exit_code": 0,
        "gpus": [
            {
                "node": 0,
                "gpu": 0,
                "uuid": "GPU-a",
                "model": "NVIDIA H200",
                "tests": {"fingerprint": True},
                "fingerprint": {"software": H200_SW, "digests": {"bf16": "00ff00ff00ff00ff", "memory": "0a"}},
            }
        ],
    }
    StateFiles(str(tmp_path), warn=print).write_last(report)
    reg = CollectorRegistry()
    reg.register(MetricsOf(BurnResultsCollector(tmp_path)))
    text = generate_latest(reg).decode()
    assert (
        'gpumon_burn_fingerprint_info{digest="00ff00ff00ff00ff",dtype="bf16",gpu="0",model="NVIDIA H200",'
        f'software="{H200_SW}",uuid="GPU-a"}} 1.0'
    ) in text
    assert 'dtype="memory"' in text
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
