"""The Slurm step's rules without a cluster: parsing scontrol, the decision, the epilog burn."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from gpumon.config import Config
from gpumon.findings.config import HealthConfig, SlurmConfig
from gpumon.findings.model import CRITICAL, Finding, verdict
from gpumon.findings.slurm_hooks import epilog_burn
from gpumon.integrations.slurm import NodeState, Scontrol, act, decide, parse_nodes

SHOW = (
    "NodeName=g1 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu,all "
    "Reason=gpumon: GPU 1 xid 79 fallen off the bus: reboot node [root@2026-11-23T01:20:05]\n"
    "NodeName=g2 State=DOWN+NOT_RESPONDING Partitions=gpu Reason=Not responding [slurm@2026-11-23T01:00:00]\n"
    "NodeName=g3 State=MIXED Partitions=gpu\n"
)
CONFIG = SlurmConfig(enabled=True, node_name="g1", max_drained_share=0.5)
FAULT = verdict(
    [Finding(kind="xid", severity=CRITICAL, action="reboot_node", summary="xid 79 fallen off the bus", gpu=1)],
    [],
    0.0,
    "local",
)
OK = verdict([], [(0, None)], 0.0, "local")


def test_parse_scontrol_show_node() -> None:
    nodes = parse_nodes(SHOW)
    assert nodes[0] == NodeState(
        name="g1",
        state="IDLE+DRAIN",
        reason="gpumon: GPU 1 xid 79 fallen off the bus: reboot node",
        partitions=("gpu", "all"),
    )
    assert nodes[0].drained and not nodes[1].drained and nodes[2].reason == ""


def test_decisions() -> None:
    idle = NodeState("g1", "IDLE", "", ("gpu",))
    ours = NodeState("g1", "IDLE+DRAIN", "gpumon: GPU 1 xid 79 fallen off the bus: reboot node", ("gpu",))
    foreign = NodeState("g1", "IDLE+DRAIN", "bad fan", ("gpu",))
    peers = [NodeState("g2", "IDLE", "", ("gpu",))]
    assert decide(FAULT, idle, [idle, *peers], CONFIG).step == "drain"
    assert decide(FAULT, ours, [ours, *peers], CONFIG).step == "none"
    assert decide(FAULT, foreign, [foreign, *peers], CONFIG).step == "none"
    assert decide(OK, ours, [ours, *peers], CONFIG).step == "resume"
    assert decide(OK, foreign, [foreign, *peers], CONFIG).step == "none"
    drained_peer = [NodeState("g2", "DOWN+DRAIN", "gpumon: node lost", ("gpu",))]
    refused = decide(FAULT, idle, [idle, *drained_peer], CONFIG)
    assert refused.step == "refused" and refused.message.startswith("circuit breaker: 1 of 2 nodes of gpu")
    other_partition = [NodeState("g9", "DOWN+DRAIN", "gpumon: node lost", ("cpu",))]
    assert decide(FAULT, idle, [idle, *other_partition], CONFIG).step == "drain"


def test_drain_reason_names_gpu_finding_and_action() -> None:
    decision = decide(FAULT, NodeState("g1", "IDLE", "", ("gpu",)), [], CONFIG)
    assert decision.reason == "gpumon: GPU 1 xid 79 fallen off the bus: reboot node"


def test_scontrol_that_hangs_is_unknown_and_recorded(tmp_path: Path) -> None:
    def hang(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    decision = act(FAULT, CONFIG, tmp_path, env={}, client=Scontrol(CONFIG, run=hang), clock=lambda: 5.0)
    assert decision.step == "unknown"
    assert decision.message == "Slurm step UNKNOWN: scontrol did not answer within 10 s"
    assert '"step": "unknown"' in (tmp_path / "health" / "actions.jsonl").read_text()


def test_scontrol_missing_is_unknown(tmp_path: Path) -> None:
    config = SlurmConfig(enabled=True, node_name="g1", scontrol=str(tmp_path / "no-scontrol"))
    assert act(FAULT, config, tmp_path, env={}).message.endswith("no-scontrol not found")


def test_epilog_burns_the_failed_jobs_gpus_only_when_enabled(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "")

    on = Config(health=HealthConfig(slurm=SlurmConfig(enabled=True, epilog_burn=True)))
    off = Config(health=HealthConfig(slurm=SlurmConfig(enabled=True)))
    failed = {"SLURM_JOB_EXIT_CODE": "256", "SLURM_JOB_GPUS": "2,3", "SLURM_JOB_ID": "7"}
    assert epilog_burn(off, tmp_path, failed, run) is None
    assert epilog_burn(on, tmp_path, {**failed, "SLURM_JOB_EXIT_CODE": "0"}, run) is None
    assert calls == []
    assert epilog_burn(on, tmp_path, failed, run) == 1
    assert calls[0][1:] == ["-m", "gpumon", "burn", "--quick", "--state-dir", str(tmp_path), "--gpus", "2,3"]
