"""gpumon as Slurm's HealthCheckProgram / prolog, against a real slurmctld + slurmd + munge on loopback.

What an operator sees: a GPU fault drains the node with a reason naming GPU, finding and action;
a job cannot start there; once the fault is cleared gpumon resumes the node and the job runs;
someone else's drain is left alone; the circuit breaker refuses to drain when too much of the
partition is already drained by gpumon; a controller that does not answer is UNKNOWN, not a crash.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.health.slurm_cluster import NODE, PARTITION, SlurmCluster
from tests.helpers import run_cli, wait_for

REASON = "gpumon: GPU 1 xid 79 fallen off the bus: reboot node"


def _config(tmp_path: Path, **slurm: object) -> Path:
    # g2-g4 are DOWN and count as unable to take work: only a share of 1 lets gpumon drain g1.
    settings = {"enabled": True, "node_name": NODE, "partition": PARTITION, "max_drained_share": 1.0, **slurm}
    lines = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in settings.items())
    path = tmp_path / "gpumon.yaml"
    path.write_text(f"kernel_log: false\nhealth:\n  slurm:\n{lines}\n")
    return path


def _health(cluster: SlurmCluster, config: Path, state: Path, backend: str, *extra: str):  # type: ignore[no-untyped-def]
    env = {"SLURM_CONF": str(cluster.conf)}
    return run_cli(
        "health", "--local", "--config", str(config), "--state-dir", str(state), "--backend", backend, *extra, env=env
    )


def _actions(state: Path) -> list[dict[str, object]]:
    path = state / "health" / "actions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_gpu_fault_drains_the_node_a_job_waits_and_the_cleared_fault_resumes_it(
    cluster: SlurmCluster, tmp_path: Path, xid79_scenario: Path
) -> None:
    config, state = _config(tmp_path), tmp_path / "state"

    fault = _health(cluster, config, state, f"fake:{xid79_scenario}", "--slurm")
    assert fault.returncode == 2, fault.stdout + fault.stderr  # CRITICAL
    assert "slurm: drain" in fault.stdout
    node = cluster.node()
    assert "DRAIN" in node["State"].split("+")
    assert node["Reason"] == REASON
    assert REASON in cluster.run("sinfo", "-R", "-h", "-o", "%E").stdout

    marker = tmp_path / "job-ran"
    job = cluster.run(
        "sbatch", "--parsable", "-p", PARTITION, "-w", NODE, "-o", "/dev/null", "--wrap", f"touch {marker}"
    ).stdout.strip()

    def pending_reason() -> tuple[str, str] | None:
        state, reason = cluster.job(job)
        return (state, reason) if reason not in ("", "None") else None

    state_reason = wait_for(pending_reason, 20, 0.1, "the job's pending reason")
    assert state_reason[0] == "PENDING" and "ReqNodeNotAvail" in state_reason[1], state_reason
    assert not marker.exists()

    # The GPU comes back but nothing proves it was repaired: XID 79 needs a reboot, so the node stays drained.
    # (The same scenario file, now without the fault: a simulated node keeps its state per scenario.)
    xid79_scenario.write_text("count: 2\n")
    back = f"fake:{xid79_scenario}"
    still = _health(cluster, config, state, back, "--slurm")
    assert still.returncode == 2 and "stays drained" not in still.stdout  # still CRITICAL
    assert "already drained by gpumon" in still.stdout
    assert cluster.drained()

    cleared = run_cli("health", "clear", "--gpu", "1", "--reason", "reseated the GPU", "--state-dir", str(state))
    assert cleared.returncode == 0, cleared.stderr
    ok = _health(cluster, config, state, back, "--slurm")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "slurm: resume" in ok.stdout
    wait_for(lambda: not cluster.drained(), 10, 0.1, "node resumed")
    wait_for(marker.exists, 30, 0.1, "the pending job to run on the resumed node")

    steps = [(a["step"], a["reason"]) for a in _actions(state)]
    assert steps == [("drain", REASON), ("resume", None)]


def test_prolog_drains_and_fails_the_job_start_fast(
    cluster: SlurmCluster, tmp_path: Path, xid79_scenario: Path
) -> None:
    config, state = _config(tmp_path), tmp_path / "state"
    done = _health(cluster, config, state, f"fake:{xid79_scenario}", "--slurm-prolog")
    assert done.returncode == 1, done.stdout + done.stderr  # Slurm requeues the job
    assert cluster.node()["Reason"] == REASON
    healthy = _health(cluster, config, tmp_path / "other-state", "fake", "--slurm-prolog")
    assert healthy.returncode == 0


def test_as_slurm_prolog_a_faulty_node_is_drained_and_the_job_requeued(
    cluster: SlurmCluster, tmp_path: Path, xid79_scenario: Path
) -> None:
    """slurmd itself runs gpumon (Prolog= in slurm.conf) when the job starts."""
    config, state = _config(tmp_path), tmp_path / "state"
    args = cluster.dir / "prolog.args"
    args.write_text(f"--local --config {config} --state-dir {state} --backend fake:{xid79_scenario}")
    try:
        job = cluster.run("sbatch", "--parsable", "-p", PARTITION, "-o", "/dev/null", "--wrap", "true").stdout.strip()
        wait_for(cluster.drained, 30, 0.1, "the prolog to drain the node")
        assert cluster.node()["Reason"] == REASON  # Slurm keeps gpumon's reason, not "Prolog error"
        state_reason = wait_for(lambda: (s := cluster.job(job))[0] == "PENDING" and s, 20, 0.1, "the job requeued")
        assert "requeued" in state_reason[1], state_reason
    finally:
        args.unlink()
    cluster.run("scancel", job)


def test_a_drain_by_someone_else_is_left_alone(cluster: SlurmCluster, tmp_path: Path, xid79_scenario: Path) -> None:
    cluster.run("scontrol", "update", f"nodename={NODE}", "state=drain", "reason=memory test by ops")
    config = _config(tmp_path)

    healthy = _health(cluster, config, tmp_path / "s1", "fake", "--slurm")
    assert healthy.returncode == 0
    assert "slurm: none: OK: nothing to do" in healthy.stdout  # not resumed: the drain is not gpumon's
    fault = _health(cluster, config, tmp_path / "s2", f"fake:{xid79_scenario}", "--slurm")
    assert fault.returncode == 2
    assert "drained by someone else (memory test by ops): left alone" in fault.stdout
    node = cluster.node()
    assert node["Reason"] == "memory test by ops" and "DRAIN" in node["State"]
    assert _actions(tmp_path / "s1") == [] and _actions(tmp_path / "s2") == []


def test_circuit_breaker_counts_down_and_drained_nodes_and_refuses_to_drain_beyond_the_share(
    cluster: SlurmCluster, tmp_path: Path, xid79_scenario: Path
) -> None:
    # g2-g4 are DOWN (nothing answers for them); g2 is also drained as if gpumon on that node had.
    cluster.run("scontrol", "update", "nodename=g2", "state=drain", "reason=gpumon: GPU 0 lost: reboot node")
    state = tmp_path / "state"
    done = _health(cluster, _config(tmp_path, max_drained_share=0.5), state, f"fake:{xid79_scenario}", "--slurm")
    assert done.returncode == 2  # the verdict is still CRITICAL
    assert "circuit breaker: 3 of 4 nodes of gpu cannot take work" in done.stdout
    assert "circuit breaker" in done.stderr  # logged loudly (ERROR)
    assert not cluster.drained()
    assert [a["step"] for a in _actions(state)] == ["refused"]

    # A share that allows all 4 drains.
    again = tmp_path / "state-2"  # a fresh state: the same XID again would escalate (2 in a week)
    done = _health(cluster, _config(tmp_path, max_drained_share=1.0), again, f"fake:{xid79_scenario}", "--slurm")
    assert "slurm: drain" in done.stdout
    assert cluster.node()["Reason"] == REASON


def test_a_controller_that_does_not_answer_is_unknown_for_the_slurm_step(tmp_path: Path, xid79_scenario: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort=9\nNodeName=g1 CPUs=1\n"
        "PartitionName=gpu Nodes=g1\n"
    )
    config = _config(tmp_path, timeout_seconds=5)
    done = run_cli(
        "health", "--local", "--config", str(config), "--state-dir", str(tmp_path / "s"),
        "--backend", f"fake:{xid79_scenario}", "--slurm", env={"SLURM_CONF": str(conf)},
    )  # fmt: skip
    assert done.returncode == 2  # the verdict (CRITICAL) is unaffected
    assert "slurm: unknown: Slurm step UNKNOWN" in done.stdout
    assert "Traceback" not in done.stderr


def test_slurm_modes_refuse_to_run_unless_configured(tmp_path: Path) -> None:
    done = run_cli("health", "--local", "--backend", "fake", "--state-dir", str(tmp_path), "--slurm")
    assert done.returncode == 3  # UNKNOWN: a check that cannot judge never says CRITICAL
    assert "health.slurm.enabled is not true" in done.stdout
