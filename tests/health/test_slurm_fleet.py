"""gpumon on a real Slurm cluster of three nodes (tests/health/slurm_nodes.py): Slurm itself runs
``gpumon health --slurm`` as HealthCheckProgram on every node at once, each node asking its own
gpumon daemon (simulated GPUs, run as a service user).

What an operator sees: only the faulty node is drained, with a reason naming every bad GPU; with
every node faulty at once and a slow controller the circuit breaker still leaves exactly the
allowed share drained; DOWN nodes and admins' drains count as unable to take work; a Comment, an
admin's drain in gpumon's words or a ticket appended to gpumon's reason change nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.health import slurm_nodes
from tests.health.slurm_nodes import Fleet

fleet = pytest.fixture(scope="module")(slurm_nodes.fleet_fixture)

XID79_GPU1 = """
count: 2
gpus:
  - {}
  - xid_events: [{tick: 0, xid: 79}]
"""
TWO_BAD_GPUS = """
count: 2
gpus:
  - xid_events: [{tick: 0, xid: 79}]
  - xid_events: [{tick: 0, xid: 79}]
"""
REASON = "gpumon: GPU 1 xid 79 fallen off the bus: reboot node"
TRIALS = int(os.environ.get("FLEET_TEST_TRIALS", "5"))  # not GPUMON_*: gpumon reads those as its config


@pytest.fixture()
def cluster(fleet: Fleet) -> Fleet:
    fleet.reset()
    return fleet


def _critical(fleet: Fleet, *names: str) -> None:
    from tests.helpers import wait_for

    for name in names:
        wait_for(lambda n=name: fleet.verdict(n)["status"] == "CRITICAL", 30, 0.2, f"{name}'s daemon to say CRITICAL")


def _uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def test_slurm_runs_gpumon_on_every_node_and_only_the_faulty_node_is_drained_naming_both_bad_gpus(
    cluster: Fleet,
) -> None:
    cluster.prepare({"n1": cluster.scenario_file("two-bad", TWO_BAD_GPUS)}, max_drained_share=0.5)
    for node in cluster.nodes.values():  # each daemon runs as the service user, not root
        assert node.daemon is not None and _uid(node.daemon.pid) == cluster.uid != 0
    _critical(cluster, "n1")
    cluster.round()
    info = cluster.node_info()
    assert cluster.drained() == {"n1"}
    reason = info["n1"]["reason"]
    assert reason.startswith("gpumon: GPU 0 xid 79") and "GPU 1 xid 79" in reason, reason
    assert [a["step"] for a in cluster.nodes["n1"].actions()] == ["drain"]
    assert all(code == 0 for code, _ in cluster.nodes["n2"].runs()) and cluster.nodes["n2"].actions() == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_with_every_node_faulty_at_once_and_a_slow_controller_the_breaker_leaves_exactly_its_share(
    cluster: Fleet,
) -> None:
    """max_drained_share 0.5 of 3 nodes: 1 may be drained. Slurm checks all three at once; every
    sinfo/scontrol call gpumon makes waits 0.5 s first. Over TRIALS rounds, exactly 1 stays drained."""
    xid = cluster.scenario_file("xid79", XID79_GPU1)
    cluster.prepare(dict.fromkeys(cluster.nodes, xid), max_drained_share=0.5)
    _critical(cluster, *cluster.nodes)
    outcomes = []
    for _ in range(TRIALS):
        cluster.reset()
        cluster.set_delay(0.5)
        cluster.round()
        outcomes.append(sorted(cluster.drained()))
    counts = [len(o) for o in outcomes]
    assert counts == [1] * TRIALS, f"drained per trial: {outcomes}"
    refusals = sum(a["step"] == "refused" for node in cluster.nodes.values() for a in node.actions())
    assert refusals >= 2 * TRIALS  # each round the two others refused (or undid their drain) and said so


def test_down_and_admin_drained_nodes_count_as_unable_to_take_work(cluster: Fleet) -> None:
    """One node DOWN, one drained by an admin: at a share of 0.7 (2 of 3) the last usable node stays."""
    cluster.prepare({"n3": cluster.scenario_file("xid79", XID79_GPU1)}, max_drained_share=0.7)
    _critical(cluster, "n3")
    cluster.stop_slurmd("n1")  # n1 died
    cluster.run("scontrol", "update", "nodename=n1", "state=down", "reason=power supply failed")
    cluster.drain("n2", "memtest by ops")
    cluster.round("n3")
    info = cluster.node_info()
    states = {n: (sorted(slurm_nodes.flags(i)), i["reason"]) for n, i in info.items()}
    assert "DRAIN" not in slurm_nodes.flags(info["n3"]), (states, cluster.nodes["n3"].actions())
    steps = [a["step"] for a in cluster.nodes["n3"].actions()]
    assert steps and set(steps) == {"refused"}, steps
    assert "2 of 3 nodes of gpu cannot take work" in cluster.nodes["n3"].actions()[0]["message"]


def test_a_comment_an_admins_gpumon_worded_drain_and_an_appended_ticket_change_nothing(cluster: Fleet) -> None:
    cluster.prepare({"n1": cluster.scenario_file("xid79", XID79_GPU1)}, max_drained_share=0.7)
    _critical(cluster, "n1")
    cluster.drain("n2", "gpumon: GPU 0 xid 79 fallen off the bus: reboot node")  # an admin, in gpumon's words
    cluster.round()
    first = cluster.node_info()["n1"]
    assert first["reason"] == REASON

    cluster.run("scontrol", "update", "nodename=n1", "comment=ticket 42 Reason=see ops")
    cluster.round()
    cluster.round()
    again = cluster.node_info()
    assert (again["n1"]["reason"], again["n1"]["reason_changed_at"]) == (REASON, first["reason_changed_at"])
    assert [a["step"] for a in cluster.nodes["n1"].actions()] == ["drain"]  # never re-issued
    assert "DRAIN" in slurm_nodes.flags(again["n2"])  # n2 is healthy, but the drain is not gpumon's

    cluster.drain("n1", f"{REASON} INC-4711")  # an admin appends a ticket
    cluster.round()
    assert cluster.node_info()["n1"]["reason"] == f"{REASON} INC-4711"
    assert [a["step"] for a in cluster.nodes["n1"].actions()] == ["drain"]


def test_as_prolog_a_faulty_node_is_drained_and_its_job_requeued_while_a_healthy_node_runs_its_job(
    cluster: Fleet,
) -> None:
    from tests.helpers import wait_for

    cluster.prepare({"n1": cluster.scenario_file("xid79", XID79_GPU1)}, max_drained_share=0.7)
    _critical(cluster, "n1")
    cluster.enable("prolog")
    bad = cluster.run("sbatch", "--parsable", "-w", "n1", "-o", "/dev/null", "--wrap", "true").stdout.strip()
    marker = cluster.base / "ran-on-n2"
    cluster.run("sbatch", "--parsable", "-w", "n2", "-o", "/dev/null", "--wrap", f"touch {marker}")
    wait_for(lambda: "n1" in cluster.drained(), 60, 0.2, "the prolog to drain n1")
    assert cluster.node_info()["n1"]["reason"] == REASON
    wait_for(marker.exists, 60, 0.2, "the job on healthy n2 to run")

    def requeued() -> bool:
        out = cluster.run("squeue", "-h", "-j", bad, "-o", "%T|%r", check=False).stdout
        return out.startswith("PENDING|") and "requeued" in out

    wait_for(requeued, 60, 0.2, "the job on n1 to be requeued")
    assert [code for code, _ in cluster.nodes["n1"].runs("prolog")][:1] == [1]
    cluster.run("scancel", bad)
