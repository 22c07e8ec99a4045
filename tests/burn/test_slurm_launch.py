"""``srun -N3 gpumon burn``: each task finds its rank, the world and the rendezvous in Slurm's
environment, with nothing to type; a batch script or a one-task step stays a single-host burn.
(The real 3-node run is in tests/fleet/test_fleet_box.py.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpumon.burn import command as cli
from gpumon.burn.orchestration import slurm_launch
from gpumon.burn.orchestration.options import BurnOptions
from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.thresholds import Thresholds

# What srun gives task 1 of `srun -N3` in job 7 (as seen on a real slurmd, Slurm 22.05).
STEP_TASK_1 = {
    "SLURM_JOB_ID": "7",
    "SLURM_JOB_NODELIST": "n[1-3]",
    "SLURM_NNODES": "3",
    "SLURM_NTASKS": "3",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "n[1-3]",
    "SLURM_STEP_NUM_NODES": "3",
    "SLURM_STEP_NUM_TASKS": "3",
    "SLURMD_NODENAME": "n2",
}
# A batch script of `sbatch -N3 -n3` (no step: the script runs once, on the first node).
BATCH = {k: v for k, v in STEP_TASK_1.items() if not k.startswith("SLURM_STEP")} | {"SLURM_PROCID": "0"}


def _first(nodelist: str) -> str:
    assert nodelist == "n[1-3]"
    return "10.0.0.11"


def _options(env: dict[str, str]) -> tuple[BurnOptions, list[str]]:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--device", "cpu", "--backend", "fake"])
    opts, backend, problems = cli.build_options(args, env)
    if backend is not None:
        backend.shutdown()
    assert opts is not None, problems
    return opts, problems


def test_an_srun_task_takes_rank_world_and_rendezvous_from_slurm() -> None:
    launch, problems = slurm_launch.launch_from_slurm(STEP_TASK_1, None, None, _first)
    assert problems == []
    assert (launch.mode, launch.agent_index, launch.agent_count, launch.node_index, launch.node_count) == (
        "slurm",
        1,
        3,
        1,
        3,
    )
    assert (launch.master_addr, launch.master_port) == ("10.0.0.11", slurm_launch.port_for(7, 0))
    assert not launch.is_leader and not launch.store_is_master and launch.node_name == "n2"
    leader, _ = slurm_launch.launch_from_slurm(
        STEP_TASK_1 | {"SLURM_PROCID": "0", "SLURM_NODEID": "0"}, None, None, _first
    )
    assert leader.is_leader and leader.store_is_master and leader.run_id == launch.run_id


def test_every_task_of_a_step_agrees_on_the_port_and_two_steps_side_by_side_do_not() -> None:
    ports = {slurm_launch.port_for(7, 0) for _ in range(3)}
    assert len(ports) == 1 and slurm_launch.port_for(7, 1) not in ports
    assert all(20000 <= slurm_launch.port_for(job, step) < 30000 for job in (1, 10**6, 2**32) for step in (0, 5))


def test_master_addr_and_port_given_by_the_user_win() -> None:
    env = STEP_TASK_1 | {"MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "29555"}
    launch, problems = slurm_launch.launch_from_slurm(env, None, None, _first)
    assert problems == [] and (launch.master_addr, launch.master_port) == ("192.0.2.1", 29555)
    launch, _ = slurm_launch.launch_from_slurm(STEP_TASK_1, "192.0.2.2", 29600, _first)
    assert (launch.master_addr, launch.master_port) == ("192.0.2.2", 29600)


def test_several_tasks_per_node_and_an_unresolvable_first_node_are_one_line_problems() -> None:
    _, problems = slurm_launch.launch_from_slurm(STEP_TASK_1 | {"SLURM_STEP_NUM_TASKS": "6"}, None, None, _first)
    assert len(problems) == 1 and "--ntasks-per-node=1" in problems[0]

    def broken(_nodelist: str) -> str:
        raise ValueError("scontrol not found")

    _, problems = slurm_launch.launch_from_slurm(STEP_TASK_1, None, None, broken)
    assert problems == ["cannot find the first node of the Slurm step (scontrol not found): give --master-addr"]


def test_gpumon_burn_in_an_srun_step_runs_as_a_slurm_fleet_and_in_a_batch_script_on_its_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(slurm_launch, "first_node_address", _first)
    opts, problems = _options(STEP_TASK_1)
    assert problems == [] and opts.launch.mode == "slurm"
    assert opts.world_size == 3 * 2  # three nodes of two simulated GPUs
    opts, problems = _options(BATCH)
    assert problems == [] and opts.launch.mode == "local"
    opts, problems = _options(STEP_TASK_1 | {"SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"})
    assert problems == [] and opts.launch.mode == "local"


def test_the_first_nodes_address_is_its_slurm_node_addr(tmp_path: Path) -> None:
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(
        """#!/bin/sh
case "$2" in
  hostnames) printf 'n1\\nn2\\nn3\\n';;
  node) echo "NodeName=$3 Arch=x86_64 NodeAddr=198.18.7.11 NodeHostName=$3 State=IDLE";;
esac
"""
    )
    scontrol.chmod(0o755)
    assert slurm_launch.first_node_address("n[1-3]", str(scontrol)) == "198.18.7.11"
    with pytest.raises(ValueError, match="empty"):
        slurm_launch.first_node_address("", str(scontrol))


def test_a_fleet_report_names_the_slow_node_by_its_name_when_nodes_have_names() -> None:
    def node(index: int, hostname: str, tflops: float) -> dict[str, object]:
        return {
            "agent": index,
            "node": index,
            "hostname": hostname,
            "ranks": [
                {
                    "rank": index,
                    "gpu": 0,
                    "node": index,
                    "model": "NVIDIA H200",
                    "results": {
                        "matmul": {
                            "model": "NVIDIA H200",
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
                    },
                    "errors": [],
                    "ready": True,
                    "done": True,
                    "exit_code": 0,
                    "last_test": "matmul",
                }
            ],
            "gpus_info": {"0": {"uuid": f"GPU-{index}", "name": "NVIDIA H200"}},
            "abort": None,
        }

    j = judge([node(0, "n1", 700), node(1, "n2", 610), node(2, "n3", 700)], Thresholds(), ("matmul",))
    assert len(j.faults) == 1 and j.faults[0].startswith("node 1 (n2) GPU 0 (GPU-1): matmul:"), j.faults
    same_host = judge([node(0, "h", 700), node(1, "h", 610), node(2, "h", 700)], Thresholds(), ("matmul",))
    assert same_host.faults[0].startswith("node 1 GPU 0 (GPU-1): matmul:")


def test_a_lost_node_is_named_by_its_slurm_name_too() -> None:
    import time

    from gpumon.burn.orchestration.agent import Agent

    agent = Agent(
        [],
        node=0,
        agent_index=0,
        agent_count=3,
        store=None,
        heartbeat_timeout_seconds=5,
        startup_timeout_seconds=60,
        node_names={0: "n1", 1: "n2", 2: "n3"},
    )
    beat = [
        {"rank": 2, "gpu": 0, "node": 2, "test": "matmul", "collective": None, "age": 0.3, "ready": True, "done": False}
    ]
    agent.exchange.remote[1] = (7, time.monotonic(), [{**beat[0], "rank": 1, "node": 1}])
    agent.exchange.remote[2] = (7, time.monotonic() - 6, beat)
    agent._check_watchdog()
    assert agent.abort is not None and agent.abort.message.startswith("node 2 (n3) lost: its agent sent nothing")


def test_gloo_is_left_to_choose_when_told_or_when_every_node_is_on_this_host() -> None:
    from gpumon.burn.orchestration.network import gloo_interface

    assert gloo_interface({"GLOO_SOCKET_IFNAME": "ib0"}, "192.0.2.1") is None
    assert gloo_interface({}, "127.0.0.1") is None
