"""gpumon as Slurm Prolog, Epilog and HealthCheckProgram on a real slurmctld + slurmd + munge:
a failed job's epilog burn runs and drains a faulty node, a hung GPU does not stall the prolog,
a typo in the config drains nothing, scontrol finds the controller through the config's slurm.conf."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpumon.util.state.files import health_dir
from tests.health.slurm_cluster import NODE, PARTITION, SlurmCluster
from tests.helpers import REPO, run_cli, wait_for

TWO_GPUS = "count: 2\n"
HUNG_GPU = "count: 2\ngpus: [{}, {hang_at_tick: 0, hang_seconds: 3600}]\n"


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _config(tmp_path: Path, extra_health: str = "", **slurm: object) -> Path:
    settings = {"enabled": True, "node_name": NODE, "partition": PARTITION, "max_drained_share": 1.0, **slurm}
    lines = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in settings.items())
    return _file(tmp_path, "gpumon.yaml", f"kernel_log: false\nhealth:\n{extra_health}  slurm:\n{lines}\n")


def test_a_failed_jobs_epilog_burn_runs_and_a_gpu_that_fails_it_drains_the_node(
    cluster: SlurmCluster, tmp_path: Path
) -> None:
    """slurmd runs the Epilog after a job that exited 3; the simulated node's burn runs on CPU, with
    GPU 1's results corrupted (GPUMON_BURN_INJECT), so GPU 1 fails it and gpumon drains the node."""
    config = _config(tmp_path, epilog_burn=True)
    scenario = _file(tmp_path, "two.yaml", TWO_GPUS)
    state = tmp_path / "state"
    args, env = cluster.dir / "epilog.args", cluster.dir / "epilog.env"
    args.write_text(f"--local --config {config} --state-dir {state} --backend fake:{scenario}")
    env.write_text("export GPUMON_BURN_INJECT=corrupt:1\n")
    try:
        cluster.run("sbatch", "--parsable", "-p", PARTITION, "-w", NODE, "-o", "/dev/null", "--wrap", "exit 3")
        wait_for(cluster.drained, 150, 0.5, f"the epilog to drain the node; {_log(cluster, 'epilog')}")
    finally:
        args.unlink()
        env.unlink()
    reason = cluster.node()["Reason"]
    assert reason.startswith("gpumon: GPU 1 failed gpumon burn") and reason.endswith(": inspect hardware"), reason
    simulated = health_dir(state, f"fake:{scenario}").parent  # a simulated burn keeps its results apart
    report = json.loads((simulated / "burn" / "last.json").read_text())
    assert report["exit_code"] == 1
    assert not (state / "burn" / "last.json").exists()


def test_prolog_with_a_hung_gpu_answers_in_time_and_the_job_runs(cluster: SlurmCluster, tmp_path: Path) -> None:
    """GPU 1's driver calls hang. The prolog answers UNKNOWN within its budget, so srun is not cut off
    by Slurm's MessageTimeout (5 s in this cluster) and the job runs; nothing is drained."""
    config = _config(tmp_path, prolog_timeout_seconds=2)
    scenario = _file(tmp_path, "hang.yaml", HUNG_GPU)
    args = cluster.dir / "prolog.args"
    args.write_text(f"--local --config {config} --state-dir {tmp_path / 'state'} --backend fake:{scenario}")
    try:
        done = cluster.run("srun", "-p", PARTITION, "-w", NODE, "echo", "ran", check=False, timeout=120)
    finally:
        args.unlink()
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stdout + done.stderr
    assert not cluster.drained()
    assert "UNKNOWN" in _log(cluster, "prolog")


def test_a_typo_in_the_shared_config_drains_nothing_and_jobs_run(
    cluster: SlurmCluster, tmp_path: Path, xid79_scenario: Path
) -> None:
    typo = _config(tmp_path, max_drained_share=3)  # one bad value; GPU 1 has even fallen off the bus
    state = tmp_path / "state"
    check = run_cli(
        "health", "--slurm", "--local", "--config", str(typo), "--state-dir", str(state),
        "--backend", f"fake:{xid79_scenario}", env={"SLURM_CONF": str(cluster.conf)},
    )  # fmt: skip
    assert check.returncode == 3, check.stdout + check.stderr  # UNKNOWN, as HealthCheckProgram
    assert not cluster.drained()

    marker = tmp_path / "job-ran"
    args = cluster.dir / "prolog.args"
    args.write_text(f"--local --config {typo} --state-dir {state} --backend fake:{xid79_scenario}")
    try:
        cluster.run("sbatch", "-p", PARTITION, "-w", NODE, "-o", "/dev/null", "--wrap", f"touch {marker}")
        wait_for(marker.exists, 60, 0.2, f"the job to run; {_log(cluster, 'prolog')}")
    finally:
        args.unlink()
    assert not cluster.drained()
    assert "max_drained_share" in _log(cluster, "prolog")


def test_scontrol_finds_the_controller_through_the_configs_slurm_conf(
    cluster: SlurmCluster, tmp_path: Path, xid79_scenario: Path
) -> None:
    """slurmd gives HealthCheckProgram no SLURM_CONF; health.slurm.slurm_conf names it."""
    config = _config(tmp_path, slurm_conf=str(cluster.conf))
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF" and not k.startswith("GPUMON_")}
    done = subprocess.run(
        [sys.executable, "-m", "gpumon", "health", "--slurm", "--local", "--config", str(config), "--state-dir", str(tmp_path / "s"),
         "--backend", f"fake:{xid79_scenario}"],
        capture_output=True, text=True, timeout=60, env=env, cwd=str(REPO),
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr  # CRITICAL
    assert "slurm: drain" in done.stdout
    assert cluster.node()["Reason"] == "gpumon: GPU 1 xid 79 fallen off the bus: reboot node"


def _log(cluster: SlurmCluster, hook: str) -> str:
    path = cluster.dir / f"{hook}.log"
    return path.read_text() if path.exists() else f"(no {hook}.log)"
