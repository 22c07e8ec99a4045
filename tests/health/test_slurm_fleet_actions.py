"""Node actions proven on the real three-node Slurm cluster (tests/health/slurm_nodes.py), issue 28's
"Done when ... On the cluster": Slurm runs ``gpumon health --slurm`` as HealthCheckProgram on every
node at once (and as Prolog), each node's gpumon daemon runs as the service user.

What an operator sees: a typo in the config every node shares drains nothing, every node's check
says UNKNOWN and jobs still run; an XID already in the kernel log when a node's daemon starts drains
that node through the daemon; root's ``gpumon health clear`` resumes a node whose daemon runs as the
service user; a demo on simulated GPUs run on a node leaves its next verdict OK.

Nodes that stand for GPU hosts run their daemon ``--backend nvml`` on a fake NVML whose kernel log is
a file (tests/health/nvml_node.py): their health state is the node's own, as on real hardware.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import requests

from tests.health import slurm_nodes
from tests.health.slurm_nodes import Fleet, Node
from tests.helpers import REPO, value, wait_for

fleet = pytest.fixture(scope="module")(slurm_nodes.fleet_fixture)

XID79_GPU1 = """
count: 2
gpus:
  - {}
  - xid_events: [{tick: 0, xid: 79}]
"""
BOOT_LINE = "6,1,1000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04\n"
GPU_BUS = {0: "0000:18:00", 1: "0000:28:00"}
"""The fake NVML's GPUs as the driver names them in the kernel log (tests/fake_pynvml.py)."""


GPUMON = (sys.executable, "-m", "gpumon")


def node_files(node: Node) -> list[str]:
    """The node's config and state directory, as an operator on the node names them."""
    return ["--config", str(node.config), "--state-dir", str(node.state)]


def kmsg_xid(seq: int, xid: int, gpu: int, usec: int = 5_000_000) -> str:
    return f"4,{seq},{usec},-;NVRM: Xid (PCI:{GPU_BUS[gpu]}): {xid}, pid=1234, name=python, GPU error.\n"


@pytest.fixture()
def cluster(fleet: Fleet) -> Iterator[Fleet]:
    fleet.reset()
    yield fleet
    fleet.extra_config.clear()
    for node in fleet.nodes.values():
        node.kmsg = None
        node.nvml_init_delay_seconds = 0.0
        for hook in slurm_nodes.HOOKS:
            node.set_hook_args(hook)


def gpu_host(fleet: Fleet, name: str, *lines: str, init_delay_seconds: float = 0.0) -> Node:
    """Node ``name`` stands for a GPU host (fake NVML, the node's own state) whose kernel log holds
    ``lines`` before its daemon starts (at the next ``prepare``)."""
    node = fleet.nodes[name]
    node.kmsg = fleet.base / f"{name}.kmsg"
    node.kmsg.write_text(BOOT_LINE + "".join(lines))
    node.kmsg.chmod(0o644)
    node.nvml_init_delay_seconds = init_delay_seconds
    return node


def state(info: Mapping[str, Any]) -> set[str]:
    """A node's Slurm state and flags, e.g. {"IDLE", "DRAIN"}."""
    return slurm_nodes.flags(info)


def last_line(node: Node, hook: str = "health") -> str:
    lines = (node.dir / f"{hook}.log").read_text().splitlines()
    return next(line for line in reversed(lines) if line.startswith("gpumon health:"))


def metric(node: Node, name: str, **labels: str) -> float:
    return value(requests.get(f"{node.url}/metrics", timeout=5).text, name, **labels) or 0.0


def test_a_typo_in_the_shared_config_drains_no_node_every_check_says_unknown_and_jobs_still_run(
    cluster: Fleet,
) -> None:
    # n1 really is faulty: even so, a check that cannot read its config judges nothing.
    cluster.prepare({"n1": cluster.scenario_file("xid79", XID79_GPU1)}, max_drained_share=0.7)
    wait_for(lambda: cluster.verdict("n1")["status"] == "CRITICAL", 30, 0.2, "n1's daemon to say CRITICAL")
    cluster.slurm["max_drained_share"] = 3  # one bad value in the config every node uses
    cluster.write_configs()

    cluster.round()
    info = cluster.node_info()
    assert cluster.drained() == set(), {n: (sorted(state(i)), i["reason"]) for n, i in info.items()}
    for node in cluster.nodes.values():
        assert [code for code, _ in node.runs()] and {code for code, _ in node.runs()} == {3}, node.runs()
        line = last_line(node)
        assert line.startswith("gpumon health: UNKNOWN") and "max_drained_share" in line, line
        assert node.actions() == []

    # As Prolog, with an unknown key instead: the job goes through on every node, counted as unjudged.
    del cluster.slurm["max_drained_share"]
    cluster.extra_config["helth"] = {"slurm": {"enabled": True}}
    cluster.write_configs()
    cluster.enable("prolog")
    done = cluster.run("srun", "-N3", "-w", "n1,n2,n3", "hostname", timeout=60)
    assert len(done.stdout.splitlines()) == 3, done.stdout
    cluster.disable("prolog")
    assert cluster.drained() == set()
    for node in cluster.nodes.values():
        assert [code for code, _ in node.runs("prolog")] == [0]
        assert "helth" in (node.dir / "prolog.log").read_text()
        wait_for(
            lambda n=node: metric(n, "gpumon_health_unjudged_total", hook="prolog") >= 1,
            15,
            0.2,
            f"{node.name}'s daemon to count the unjudged prolog",
        )


def test_an_xid_in_the_kernel_log_before_the_daemon_starts_drains_its_node_through_the_daemon(
    cluster: Fleet,
) -> None:
    """n2's kernel log holds an XID 79 on GPU 1 from before its daemon started, and its NVML takes a
    second to come up: the kernel-log backfill arrives before the first poll has mapped any bus id."""
    n2 = gpu_host(cluster, "n2", kmsg_xid(2, 79, gpu=1), init_delay_seconds=1.0)
    gpu_host(cluster, "n3")  # a GPU host with a clean log
    cluster.prepare({}, max_drained_share=0.7)
    for node in cluster.nodes.values():  # the check asks the node's daemon, named explicitly
        node.set_hook_args("health", "--daemon-url", node.url)

    wait_for(lambda: cluster.verdict("n2")["status"] == "CRITICAL", 30, 0.2, "n2's daemon to say CRITICAL")
    wait_for(
        lambda: metric(n2, "gpumon_xid_errors_total", gpu="1", xid="79") == 1, 15, 0.2, "the XID on GPU 1 in /metrics"
    )
    cluster.round()
    info = cluster.node_info()
    assert cluster.drained() == {"n2"}, {n: (sorted(state(i)), i["reason"]) for n, i in info.items()}
    assert info["n2"]["reason"] == "gpumon: GPU 1 xid 79 fallen off the bus: reboot node"
    assert [code for code, _ in n2.runs()] == [2]
    assert last_line(n2).endswith("(from the daemon)"), last_line(n2)
    assert all([code for code, _ in cluster.nodes[n].runs()] == [0] for n in ("n1", "n3"))


def test_a_clear_made_as_root_resumes_a_node_whose_daemon_runs_as_the_service_user(cluster: Fleet) -> None:
    n3 = gpu_host(cluster, "n3", kmsg_xid(2, 48, gpu=0))  # double-bit ECC: reset the GPU
    cluster.prepare({}, max_drained_share=0.7)
    assert n3.daemon is not None and os.stat(n3.state).st_uid == cluster.uid != 0
    wait_for(lambda: cluster.verdict("n3")["status"] == "CRITICAL", 30, 0.2, "n3's daemon to say CRITICAL")
    cluster.round("n3")
    assert cluster.drained() == {"n3"}
    assert cluster.node_info()["n3"]["reason"].startswith("gpumon: GPU 0 xid 48")

    done = subprocess.run(  # as root, as an operator would after the repair
        [*GPUMON, "health", "clear", "--gpu", "0", "--reason", "reset by ops, burn passed", *node_files(n3)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    wait_for(lambda: cluster.verdict("n3")["status"] == "OK", 30, 0.2, "n3's daemon to apply root's clear")
    cluster.round("n3")
    info = cluster.node_info()["n3"]
    assert not state(info) & {"DRAIN", "DOWN"} and info["reason"] == "", (sorted(state(info)), info["reason"])
    wait_for(lambda: state(cluster.node_info()["n3"]) == {"IDLE"}, 30, 0.2, "n3 to be IDLE")
    assert [a["step"] for a in n3.actions()] == ["drain", "resume"]
    assert [code for code, _ in n3.runs()] == [2, 0]
    health = cluster.verdict("n3")
    assert health["status"] == "OK" and [f for f in health["findings"] if f["kind"] == "xid"] == [], health
    audit = list((n3.state / "health" / "clears.d").iterdir())  # root's clear, kept as the audit trail
    assert len(audit) == 1 and audit[0].name.endswith("-root.json"), audit


def test_a_simulated_scenario_run_on_a_node_leaves_its_verdict_ok(cluster: Fleet) -> None:
    """On healthy GPU host n1 an operator stops the service and, as root, tries the README's demo on
    simulated GPUs with the node's state directory; then the service comes back."""
    n1 = gpu_host(cluster, "n1")
    cluster.prepare({}, max_drained_share=0.7)
    cluster.stop_daemon("n1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo_log = (n1.dir / "demo.log").open("wb")
    demo = subprocess.Popen(
        [
            *GPUMON,
            "run",
            "--backend",
            "fake:xid-storm",
            *node_files(n1),
            "--listen",
            f"127.0.0.1:{port}",
            "--interval-seconds",
            "0.2",
        ],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=demo_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    demo_log.close()

    def demo_says(status: str) -> bool:
        if demo.poll() is not None:
            raise AssertionError(f"the demo exited {demo.returncode}: {(n1.dir / 'demo.log').read_text()[-2000:]}")
        return bool(requests.get(f"http://127.0.0.1:{port}/api/health", timeout=5).json()["status"] == status)

    try:
        wait_for(lambda: demo_says("CRITICAL"), 30, 0.2, "the demo's simulated XID 48 to make it CRITICAL")
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(15)

    cluster.start_daemon("n1")  # the service, as its user, on the state the demo left
    cluster.round("n1")
    assert [code for code, _ in n1.runs()] == [0], last_line(n1)
    assert "n1" not in cluster.drained()
    assert cluster.verdict("n1")["status"] == "OK"
    assert n1.actions() == []
