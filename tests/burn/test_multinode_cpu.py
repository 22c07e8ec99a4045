"""Two "nodes" on loopback: torchrun and the --nnodes flags both give one merged report on rank 0."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_BURN_")}
    env.update(extra or {})
    return env


def _two_nodes(cmd_for_node, tmp_path: Path, env: dict[str, str], timeout: float = 150) -> list[tuple[int, str, str]]:
    procs = [
        subprocess.Popen(
            cmd_for_node(rank, tmp_path / f"node{rank}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    out = []
    try:
        for p in procs:
            o, e = p.communicate(timeout=timeout)
            out.append((p.returncode, o, e))
    finally:
        for p in procs:
            p.kill()
    return out


def test_torchrun_two_nodes_one_merged_report(tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    if not Path(torchrun).exists():
        pytest.fail("torchrun not found next to the Python interpreter")
    port = _free_port()

    def cmd(rank: int, state: Path) -> list[str]:
        return [
            torchrun,
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(rank),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "-m",
            "gpumon.burn",
            "--device",
            "cpu",
            "--gpus",
            "0",
            "--duration",
            "1",
            "--state-dir",
            str(state),
            "--json",
            str(state / "report.json"),
        ]

    (c0, o0, e0), (c1, _o1, e1) = _two_nodes(cmd, tmp_path, _env())
    assert (c0, c1) == (0, 0), e0 + e1
    assert "burn: PASS — 2 GPU(s)" in o0
    import json

    report = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert [(g["node"], g["gpu"], g["rank"]) for g in report["gpus"]] == [(0, 0, 0), (1, 0, 1)]
    assert report["options"]["launch"] == "torchrun" and report["options"]["world_size"] == 2
    assert all(g["tests"]["allreduce"] for g in report["gpus"])
    # each node keeps the merged report for its own daemon
    assert json.loads((tmp_path / "node1" / "burn" / "last.json").read_text())["node"] == 1


def test_node_flags_two_nodes_hang_is_named_on_both(tmp_path):
    port = _free_port()

    def cmd(rank: int, state: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gpumon.burn",
            "--nnodes",
            "2",
            "--node-rank",
            str(rank),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--device",
            "cpu",
            "--gpus",
            "0,1",
            "--tests",
            "matmul,allreduce",
            "--duration",
            "1",
            "--heartbeat-timeout",
            "4",
            "--state-dir",
            str(state),
        ]

    (c0, o0, e0), (c1, _o1, e1) = _two_nodes(cmd, tmp_path, _env({"GPUMON_BURN_INJECT": "hang:1"}))
    assert (c0, c1) == (1, 1), e0 + e1
    fault = next(line for line in o0.splitlines() if line.startswith("FAULT"))
    assert "(node 0 GPU 1) hung in matmul" in fault or "(node 1 GPU 1) hung in matmul" in fault
    assert "Traceback" not in e0 + e1
