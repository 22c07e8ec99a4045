"""Two "nodes" on loopback: torchrun and the --nnodes flags both give one merged report on rank 0.

One run per launch path: torchrun on a healthy pair, the --nnodes flags with a node killed mid-run.
A hang on another node (its agent publishes the abort, ours adopts it) is tested through the store in
tests/burn/test_judge_rules.py, which rank is named over every node's views by the watchdog tests
there, and a hang end to end on one node in tests/burn/test_run_cpu.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpumon.util.state.files import health_dir
from tests.helpers import free_port


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


def _nnodes_burn(rank: int, port: int, state: Path, gpus: str, *options: str) -> list[str]:
    """One node of a two-node CPU burn started with the --nnodes flags (no torchrun), on loopback."""
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
        gpus,
        *options,
        "--state-dir",
        str(state),
    ]


def test_torchrun_two_nodes_one_merged_report(tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    if not Path(torchrun).exists():
        pytest.fail("torchrun not found next to the Python interpreter")
    port = free_port()

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
    # each node keeps the merged report for its own daemon (a simulated run's, apart from the node's own)
    simulated = health_dir(tmp_path / "node1", "fake").parent
    assert json.loads((simulated / "burn" / "last.json").read_text())["node"] == 1


def test_a_node_killed_mid_run_is_named_within_the_heartbeat_timeout_and_survivors_keep_their_results(tmp_path):
    """Node 1 (agent and workers) SIGKILLed during matmul: node 0 names it, stops, and reports its own GPU."""
    import json
    import signal
    import time

    port = free_port()

    def cmd(rank: int) -> list[str]:
        state = tmp_path / f"node{rank}"
        options = ("--tests", "matmul,allreduce", "--duration", "60", "--heartbeat-timeout", "5")
        return [*_nnodes_burn(rank, port, state, "0", *options), "--json", str(state / "report.json")]

    node0 = subprocess.Popen(cmd(0), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), bufsize=1)
    node1 = subprocess.Popen(
        cmd(1), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), start_new_session=True
    )
    try:
        seen = []
        for line in node0.stdout:  # node 0's progress lines: wait until its matmul rounds are under way
            seen.append(line)
            if "matmul" in line and "FLOP/s" in line:  # a rate: TFLOP/s, or GFLOP/s on CPU
                break
        assert seen and "FLOP/s" in seen[-1], "".join(seen)
        os.killpg(node1.pid, signal.SIGKILL)  # the whole node: agent and workers
        killed_at = time.monotonic()
        out, err = node0.communicate(timeout=60)
        out = "".join(seen) + out
        stopped_after = time.monotonic() - killed_at
    finally:
        node0.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node1.pid, signal.SIGKILL)
        node1.wait()
    print(out[-3000:], err[-2000:], f"node 0 stopped {stopped_after:.1f} s after the kill")
    assert node0.returncode == 1, err
    assert "Traceback" not in err
    assert stopped_after < 5 + 15  # the heartbeat timeout, then a clean stop (was: 140 s waiting for a result)
    report = json.loads((tmp_path / "node0" / "report.json").read_text())
    assert report["faults"][0].startswith("node 1 lost: its agent sent nothing for"), report["faults"]
    assert "rank 1 (GPU 0) went with it" in report["faults"][0]
    assert len(report["faults"]) == 1, report["faults"]  # node 0's own GPU is not blamed
    (gpu,) = report["gpus"]
    assert (gpu["node"], gpu["gpu"]) == (0, 0) and gpu["matmul"]["tflops"] > 0  # kept, not "—"


def test_nodes_that_would_burn_different_numbers_of_gpus_are_refused_with_exit_2(tmp_path):
    """Ranks are numbered node by node with the same GPU count on each (rank = node x GPUs + local): a
    node with 1 GPU and another with 2 would share or skip ranks. Both agents say it and exit 2, before
    any load."""
    port = free_port()

    def cmd(rank: int, state: Path) -> list[str]:
        return _nnodes_burn(rank, port, state, "0" if rank == 0 else "0,1", "--duration", "1")

    results = _two_nodes(cmd, tmp_path, _env(), timeout=120)
    for code, out, err in results:
        assert code == 2, out + err
        assert "every node must burn the same number of GPUs (got [1, 2])" in out + err
