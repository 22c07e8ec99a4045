"""How results are judged: peers, floors, majority outputs, links, watchdog, telemetry."""

from __future__ import annotations

from typing import Any

from gpumon.burn.orchestration.watchdog import RankView, decide
from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.report import exit_code
from gpumon.burn.verdict.thresholds import Thresholds, for_device


def _matmul(
    tflops: float,
    checksum: str = "42",
    bad_rounds: tuple[int, ...] = (),
    ref_ok: bool = True,
    model: str = "NVIDIA H200",
) -> dict[str, Any]:
    return {
        "model": model,
        "dtype": "bf16",
        "n": 8192,
        "rounds": 10,
        "tflops_median": tflops,
        "tflops_max": tflops,
        "checksum": checksum,
        "checksum_first": checksum,
        "checksum_mismatch_rounds": list(bad_rounds),
        "reference": {"size": 256, "tolerance": 2e-2, "max_rel_error": 1e-3 if ref_ok else 0.5, "passed": ref_ok},
    }


def _node(results: dict[int, dict[str, Any]], node: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "agent": node,
        "node": node,
        "hostname": "h",
        "ranks": [
            {
                "rank": g,
                "gpu": g,
                "node": node,
                "model": "NVIDIA H200",
                "results": r,
                "errors": [],
                "ready": True,
                "done": True,
                "exit_code": 0,
                "last_test": "allreduce",
            }
            for g, r in results.items()
        ],
        "gpus_info": {str(g): {"uuid": f"GPU-{g}", "name": "NVIDIA H200"} for g in results},
        "abort": None,
        **extra,
    }


TH = Thresholds()


def test_healthy_h200s_pass_with_exit_0():
    j = judge([_node({0: {"matmul": _matmul(700)}, 1: {"matmul": _matmul(690)}})], TH, ("matmul",))
    assert j.faults == []
    assert exit_code(j) == 0
    assert j.gpus[(0, 1)]["tests"]["matmul"] is True


def test_a_gpu_more_than_10_percent_below_its_peers_median_is_a_straggler():
    nodes = [_node({g: {"matmul": _matmul(700 if g != 2 else 610)} for g in range(4)})]
    j = judge(nodes, TH, ("matmul",))
    assert len(j.faults) == 1 and j.faults[0].startswith("GPU 2 (GPU-2): matmul:")
    assert "below the median" in j.faults[0]


def test_a_gpu_below_the_model_floor_fails_even_without_peers():
    j = judge([_node({0: {"matmul": _matmul(300)}})], TH, ("matmul",))
    assert any("floor 600" in f for f in j.faults)


def test_mixed_models_are_compared_only_within_their_model():
    nodes = [
        _node(
            {
                0: {"matmul": _matmul(700)},
                1: {"matmul": _matmul(700)},
                2: {"matmul": _matmul(250, model="NVIDIA A100-SXM4-80GB")},
                3: {"matmul": _matmul(255, model="NVIDIA A100-SXM4-80GB")},
            }
        )
    ]
    assert judge(nodes, TH, ("matmul",)).faults == []


def test_output_different_from_the_majority_names_the_gpu():
    nodes = [
        _node({0: {"matmul": _matmul(700, "42")}, 1: {"matmul": _matmul(700, "43")}, 2: {"matmul": _matmul(700, "42")}})
    ]
    j = judge(nodes, TH, ("matmul",))
    assert j.faults == ["GPU 1 (GPU-1): matmul: output differs from 2 NVIDIA H200 peers given identical inputs"]


def test_two_gpus_that_disagree_trust_the_self_consistent_one():
    nodes = [_node({0: {"matmul": _matmul(700, "42")}, 1: {"matmul": _matmul(700, "43", bad_rounds=(3,))}})]
    j = judge(nodes, TH, ("matmul",))
    assert all(f.startswith("GPU 1") for f in j.faults) and len(j.faults) == 2


def test_a_consistently_wrong_gpu_fails_the_float64_reference():
    j = judge([_node({0: {"matmul": _matmul(700, ref_ok=False)}})], TH, ("matmul",))
    assert any("relative error 5.00e-01 vs float64" in f for f in j.faults)


def test_p2p_gpu_whose_every_link_is_slow_is_named_instead_of_links():
    pairs = {
        s: {
            "p2p": {
                "pairs": [
                    {
                        "src_gpu": s,
                        "dst_gpu": d,
                        "bytes": 1,
                        "checksum_ok": True,
                        "bytes_per_second": (150e9 if 2 in (s, d) else 390e9),
                    }
                    for d in range(4)
                    if d != s
                ]
            }
        }
        for s in range(4)
    }
    topo = {str(g): {str(p): "nvlink" for p in range(4) if p != g} for g in range(4)}
    j = judge([_node(pairs, topology=topo)], TH, ("p2p",))
    assert j.faults == ["GPU 2: p2p: every link of this GPU is slow while most other links are fine"]


def test_p2p_one_slow_link_is_named_as_a_link():
    def bw(s: int, d: int) -> float:
        return 100e9 if (s, d) == (0, 1) else 390e9

    pairs = {
        s: {
            "p2p": {
                "pairs": [
                    {"src_gpu": s, "dst_gpu": d, "bytes": 1, "checksum_ok": True, "bytes_per_second": bw(s, d)}
                    for d in range(3)
                    if d != s
                ]
            }
        }
        for s in range(3)
    }
    topo = {str(g): {str(p): "nvlink" for p in range(3) if p != g} for g in range(3)}
    j = judge([_node(pairs, topology=topo)], TH, ("p2p",))
    assert j.faults == ["link GPU 0 <-> GPU 1: p2p: slow"]


def test_allreduce_wrong_sum_names_the_rank_and_slow_group_is_localised_by_pairs():
    def ar(g: int) -> dict[str, Any]:
        d: dict[str, Any] = {
            "dtype": "bf16",
            "world_size": 4,
            "sizes": [
                {
                    "bytes": 2**30,
                    "iterations": 10,
                    "seconds_per_op": 1,
                    "algbw_bytes_per_second": 1,
                    "busbw_bytes_per_second": 100e9,
                    "mismatched_elements": 5 if g == 3 else 0,
                }
            ],
        }
        if g == 0:
            d["pairwise"] = [
                {"ranks": [a, b], "busbw_bytes_per_second": 90e9 if 1 in (a, b) else 300e9}
                for a in range(4)
                for b in range(a + 1, 4)
            ]
        return {"allreduce": d}

    j = judge([_node({g: ar(g) for g in range(4)})], TH, ("allreduce",))
    text = "\n".join(j.faults)
    assert "5 elements of the all-reduce result wrong on rank 3" in text
    assert "all-reduce over 4 ranks: busbw 100.0 GB/s below the floor 240.0" in text
    assert "GPU 1: allreduce: every link of this GPU is slow while most other links are fine" in text


def test_thermal_slowdown_and_new_uncorrectable_ecc_errors_fail_the_gpu():
    tel = {
        "slowdowns_seen": ["hw_thermal_slowdown"],
        "clock_events_seen": ["hw_thermal_slowdown"],
        "ecc_errors_grown": {"uncorrected_volatile": 2},
    }
    j = judge([_node({0: {}}, telemetry={"0": tel})], TH, ("matmul",))
    assert any("hw_thermal_slowdown" in f for f in j.faults)
    assert any("2 uncorrectable ECC errors during the burn" in f for f in j.faults)


def test_cpu_thresholds_are_wider_and_floors_can_be_overridden():
    th, problems = for_device("cpu", "allreduce_busbw_gbps=5,matmul_tflops=x")
    assert th.straggler_fraction > for_device("cuda", None)[0].straggler_fraction
    assert th.allreduce_floor_bytes_per_second("cpu", True) == 5e9
    assert problems == ["GPUMON_BURN_FLOORS: matmul_tflops needs a number, got 'x'"]


def _v(rank: int, test: str, collective: str | None, age: float, ready: bool = True) -> RankView:
    return RankView(
        rank=rank, gpu=rank, node=0, test=test, collective=collective, age_seconds=age, ready=ready, done=False
    )


def test_watchdog_names_the_computing_rank_not_the_ones_waiting_for_it():
    hang = decide([_v(0, "allreduce", "all_reduce", 30), _v(1, "matmul", None, 25)], 20, 180)
    assert hang is not None and hang.ranks == (1,)
    assert hang.message.startswith("rank 1 (GPU 1) hung in matmul: no progress for 25 s")
    assert hang.message.endswith("waiting for it: rank 0"), hang.message


def test_watchdog_names_ranks_that_stopped_together_not_only_the_first_past_the_limit():
    views = [_v(0, "matmul", None, 21), _v(1, "matmul", None, 19), _v(2, "matmul", None, 0.4)]
    hang = decide(views, 20, 180)
    assert hang is not None and hang.ranks == (0, 1)


def test_watchdog_waits_while_a_peer_still_makes_progress():
    assert decide([_v(0, "allreduce", "barrier", 60), _v(1, "matmul", None, 0.3)], 20, 180) is None


def test_watchdog_names_every_rank_of_a_hung_collective():
    hang = decide([_v(0, "allreduce", "all_reduce", 25), _v(1, "allreduce", "all_reduce", 21)], 20, 180)
    assert hang is not None and hang.ranks == (0, 1) and "collective hung" in hang.message


def test_watchdog_gives_start_up_its_own_limit():
    assert decide([_v(0, "start", "init_process_group", 100, ready=False)], 20, 180) is None
    hang = decide([_v(0, "start", "init_process_group", 200, ready=False)], 20, 180)
    assert hang is not None and "starting up" in hang.message


def test_errors_raised_while_a_hung_run_is_stopped_are_not_faults_and_the_hang_comes_first():
    hung = _node({0: {}, 1: {}}, node=0)
    hung["ranks"][0]["errors"] = [
        {
            "test": "allreduce",
            "kind": "error",
            "message": "RuntimeError: Connection closed by peer",
            "after_abort": True,
        }
    ]
    hung["ranks"][1]["errors"] = [{"test": "matmul", "kind": "error", "message": "CUDA error: boom"}]
    hung["abort"] = {"kind": "hang", "message": "rank 1 (GPU 1) hung in matmul: no progress for 5 s", "ranks": [1]}
    j = judge([hung], TH, ("matmul", "allreduce"))
    assert j.faults == ["rank 1 (GPU 1) hung in matmul: no progress for 5 s", "CUDA error: boom"]
    fallout = [c for c in j.checks if c["gpu"] == 0 and c["check"] == "error"]
    assert fallout and fallout[0]["passed"] is None and "after the stop" in fallout[0]["detail"]
    assert j.gpus[(0, 0)]["tests"]["allreduce"] is not False
    assert exit_code(j) == 1


class _DictStore:
    """The three TCPStore calls the agent makes, on a dict."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value

    def get(self, key: str) -> bytes:
        return self.data[key].encode()

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)


def test_an_error_that_follows_another_nodes_abort_is_marked_as_fallout():
    from gpumon.burn.orchestration.agent import Agent

    store = _DictStore()
    agent = Agent(
        [], node=0, agent_index=0, agent_count=2, store=store, heartbeat_timeout_seconds=4, startup_timeout_seconds=60
    )
    from gpumon.burn.orchestration.agent import RankState

    agent.states[0] = RankState(rank=0, gpu=0, node=0)
    agent.states[0].ready = True
    # node 1's agent found the hang, wrote the abort, then killed its workers: our rank 0 lost its peer
    store.set("abort", '{"kind": "hang", "message": "rank 3 (node 1 GPU 1) hung in matmul", "ranks": [3]}')
    agent._handle({"rank": 0, "type": "error", "test": "allreduce", "kind": "error", "message": "Connection closed"})
    assert agent.abort is not None and agent.abort.message == "rank 3 (node 1 GPU 1) hung in matmul"
    assert agent.states[0].errors[0]["after_abort"] is True


def _ar(busbw: float) -> dict[str, Any]:
    size = {
        "bytes": 2**30,
        "iterations": 10,
        "seconds_per_op": 1,
        "algbw_bytes_per_second": 1,
        "busbw_bytes_per_second": busbw,
        "mismatched_elements": 0,
    }
    return {"allreduce": {"dtype": "bf16", "world_size": 2, "sizes": [size]}}


def test_a_slow_group_all_reduce_is_marked_on_the_gpu_other_tests_name_not_on_rank_0():
    # GPU 1 shared with a competing process (--force): slow in matmul, and the all-reduce is slow too
    busy = {"name": "processes", "gpu": 1, "severity": "busy", "detail": "1 other compute process(es): 2422 (python3)"}
    results = {g: {"matmul": _matmul(700 if g == 0 else 400), **_ar(100e9)} for g in (0, 1)}
    j = judge([_node(results, sw=[busy])], TH, ("sw", "matmul", "allreduce"))
    busbw = [c for c in j.checks if c["check"] == "busbw"]
    assert [(c["gpu"], c["passed"]) for c in busbw] == [(1, False)]
    assert j.gpus[(0, 0)]["tests"]["allreduce"] is True
    assert j.gpus[(0, 1)]["tests"]["allreduce"] is False
    line = next(f for f in j.faults if f.startswith("all-reduce over 2 ranks"))
    assert "likely cause: GPU 1 shared with other compute processes, failed matmul" in line


def test_a_slow_group_all_reduce_nobody_else_explains_belongs_to_the_whole_group():
    j = judge([_node({g: _ar(100e9) for g in (0, 1)})], TH, ("allreduce",))
    (busbw,) = [c for c in j.checks if c["check"] == "busbw"]
    assert busbw["gpu"] is None and busbw["group"] == [[0, 0], [0, 1]] and busbw["passed"] is False
    assert [j.gpus[(0, g)]["tests"]["allreduce"] for g in (0, 1)] == [False, False]
    assert any("(GPU 0, GPU 1: no other test names one of them)" in f for f in j.faults)


def _pcie_host(model: str, gen: int, busbw: float) -> Any:
    results = {g: _ar(busbw) for g in (0, 1)}
    node = _node(
        results,
        topology={"0": {"1": "hostbridge"}, "1": {"0": "hostbridge"}},
        pcie={str(g): {"generation_max": gen, "width_max": 16} for g in (0, 1)},
    )
    for r in node["ranks"]:
        r["model"] = model
    return judge([node], TH, ("allreduce",))


def test_a_healthy_pcie_only_host_passes_the_all_reduce_floor_of_its_pcie_links():
    # two H100 PCIe / A100 PCIe cards without NVLink: ~40 / ~20 GB/s busbw is what their PCIe gives
    h100 = _pcie_host("NVIDIA H100 PCIe", 5, 40e9)
    a100 = _pcie_host("NVIDIA A100 80GB PCIe", 4, 20e9)
    assert h100.faults == [] and a100.faults == []
    (check,) = [c for c in h100.checks if c["check"] == "busbw"]
    assert "over PCIe gen5 x16" in check["detail"] and abs(check["threshold"] - 0.3 * 3.938 * 16e9) < 1
    # a PCIe path far below its link rate still fails
    assert any("below the floor 9.5 over PCIe gen4 x16" in c["detail"] for c in _pcie_host("A100", 4, 5e9).checks)


def test_an_nvlink_pair_keeps_the_model_floor():
    results = {g: _ar(100e9) for g in (0, 1)}
    j = judge([_node(results, topology={"0": {"1": "nvlink"}, "1": {"0": "nvlink"}})], TH, ("allreduce",))
    assert any("below the floor 240.0 over NVLink" in c["detail"] for c in j.checks)


def test_a_gpu_shared_with_another_process_takes_the_slow_all_reduce_even_without_the_sw_test():
    j = judge([_node({g: _ar(100e9) for g in (0, 1)}, busy_gpus=[1])], TH, ("allreduce",))
    assert [(c["gpu"], c["passed"]) for c in j.checks if c["check"] == "busbw"] == [(1, False)]
    assert j.gpus[(0, 0)]["tests"]["allreduce"] is True


def _pairwise_judged(gpus: int, busbw_of_pair: dict[tuple[int, int], float]) -> list[str]:
    """A group all-reduce of ``gpus`` ranks below its floor, then its pairwise runs with these busbw."""

    def ar(g: int) -> dict[str, Any]:
        d: dict[str, Any] = {
            "dtype": "bf16",
            "world_size": gpus,
            "sizes": [
                {
                    "bytes": 2**30,
                    "iterations": 10,
                    "seconds_per_op": 1,
                    "algbw_bytes_per_second": 1,
                    "busbw_bytes_per_second": 100e9,
                    "mismatched_elements": 0,
                }
            ],
        }
        if g == 0:
            d["pairwise"] = [{"ranks": [a, b], "busbw_bytes_per_second": bw} for (a, b), bw in busbw_of_pair.items()]
        return {"allreduce": d}

    return judge([_node({g: ar(g) for g in range(gpus)})], TH, ("allreduce",)).faults


def test_one_slow_gpu_of_three_is_named_by_its_pairs():
    """Two of the three pairs hold the slow GPU: their median is a slow pair, not what a link reaches."""
    faults = _pairwise_judged(3, {(0, 1): 30e9, (0, 2): 300e9, (1, 2): 30e9})
    assert "GPU 1: allreduce: every link of this GPU is slow while most other links are fine" in faults, faults


def test_a_slow_gpu_is_named_though_one_of_the_other_pairs_measured_slow_too():
    """Four GPUs, GPU 2 slow on its three pairs; one pair of the others is noisy on a loaded host (CPU
    runs in CI): half the pairs hold GPU 2, so the median fell between the slow and the fine pairs."""
    pairs = {(0, 1): 300e9, (0, 2): 30e9, (0, 3): 300e9, (1, 2): 90e9, (1, 3): 110e9, (2, 3): 35e9}
    faults = _pairwise_judged(4, pairs)
    assert "GPU 2: allreduce: every link of this GPU is slow while most other links are fine" in faults, faults
