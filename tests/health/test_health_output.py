"""What gpumon health says: the recommended action agrees with the headline, NPD's 80 bytes,
a clear for a GPU the node does not have, an epilog burn that could not run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_cli

HOT_AND_FALLEN = """
count: 2
gpus:
  - values: {temperature_celsius: 95, temperature_slowdown_threshold_celsius: 90}
  - values: {temperature_celsius: 95, temperature_slowdown_threshold_celsius: 90}
    xid_events: [{tick: 0, xid: 79}]
"""
"""GPU 0 too hot (WARNING, inspect the hardware); GPU 1 too hot and fallen off the bus (CRITICAL, reboot)."""


def _scenario(tmp_path: Path, text: str) -> str:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return f"fake:{path}"


def _health(tmp_path: Path, backend: str, *args: str, state: str = "state"):  # type: ignore[no-untyped-def]
    return run_cli("health", "--local", "--backend", backend, "--state-dir", str(tmp_path / state), *args, timeout=120)


def test_the_recommended_action_is_the_headlines(tmp_path: Path) -> None:
    done = _health(tmp_path, _scenario(tmp_path, HOT_AND_FALLEN))
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "gpumon health: CRITICAL - GPU 1 xid 79 fallen off the bus: reboot node (polled here)"
    assert lines[-1] == "recommended: reboot the node"
    gpu1 = next(line for line in lines if line.startswith("1 "))
    assert gpu1.split()[:3] == ["1", "CRITICAL", "reboot_node"] and gpu1.endswith(": reboot node")
    report = json.loads(_health(tmp_path, _scenario(tmp_path, HOT_AND_FALLEN), "--json", state="other").stdout)
    assert report["action"] == "reboot_node" and report["reason"].endswith(": reboot node")


def test_the_npd_line_is_cut_at_80_bytes_on_a_character_boundary(tmp_path: Path) -> None:
    """NPD cuts its plugin's output at max_output_length BYTES (Go string slicing)."""
    hot = "count: 1\ngpus:\n  - values: {temperature_celsius: 95, temperature_slowdown_threshold_celsius: 90}\n"
    done = run_cli(
        "health", "--local", "--mode", "npd", "--backend", _scenario(tmp_path, hot), "--state-dir", str(tmp_path / "s")
    )
    assert done.returncode == 0, done.stdout + done.stderr  # WARNING is no node problem to NPD
    raw = done.stdout.encode()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    line = raw.rstrip(b"\n")
    assert len(line) <= 80, (len(line), line)
    text = line.decode("utf-8")  # not cut inside a character
    assert text.startswith("WARNING: GPU 0 95 °C")


def test_clear_of_a_gpu_the_node_does_not_have_fails_and_records_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = run_cli(
        "health", "clear", "--gpu", "9", "--reason", "reseated", "--backend", "fake", "--state-dir", str(state)
    )
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.splitlines()
    assert "GPU 9" in line and "0, 1" in line  # names the GPUs there are
    assert not (state / "health" / "clears.json").exists()
    ok = run_cli(
        "health", "clear", "--gpu", "1", "--reason", "reseated", "--backend", "fake", "--state-dir", str(state)
    )
    assert ok.returncode == 0, ok.stderr


def test_clear_knows_the_gpus_of_the_baseline_while_one_is_missing(tmp_path: Path) -> None:
    """GPU 1 fell off the bus and is not listed now: it is still the node's GPU (the inventory baseline)."""
    state = tmp_path / "state"
    one = _scenario(tmp_path, "count: 2\n")  # one scenario file, so both runs share its simulated state
    assert run_cli("health", "accept-inventory", "--backend", one, "--state-dir", str(state)).returncode == 0
    _scenario(tmp_path, "count: 1\n")
    ok = run_cli("health", "clear", "--gpu", "1", "--reason", "reseated", "--backend", one, "--state-dir", str(state))
    assert ok.returncode == 0, ok.stderr
    bad = run_cli("health", "clear", "--gpu", "2", "--reason", "x", "--backend", one, "--state-dir", str(state))
    assert bad.returncode == 2 and "0, 1" in bad.stderr


def test_an_epilog_burn_that_could_not_run_is_not_ok(tmp_path: Path) -> None:
    """A failed job, epilog_burn on, and a burn that exits 2 (here: a bad fault-injection setting):
    the verdict is UNKNOWN, not OK; the epilog still exits 0 (a failed epilog drains the node)."""
    config = tmp_path / "gpumon.yaml"
    config.write_text("kernel_log: false\nhealth:\n  slurm: {enabled: true, epilog_burn: true}\n")
    conf = tmp_path / "slurm.conf"  # no controller there: the Slurm step is UNKNOWN, the verdict is what counts
    conf.write_text("ClusterName=none\nSlurmctldHost=none(127.0.0.1)\nSlurmctldPort=9\n")
    done = run_cli(
        "health", "--slurm-epilog", "--local", "--config", str(config), "--backend", "fake",
        "--state-dir", str(tmp_path / "s"),
        env={"SLURM_JOB_EXIT_CODE": "256", "SLURM_JOB_ID": "7", "GPUMON_BURN_INJECT": "explode:1", "SLURM_CONF": str(conf)},
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    headline = done.stdout.splitlines()[0]
    assert headline.startswith("gpumon health: UNKNOWN - ") and "burn" in headline, done.stdout
