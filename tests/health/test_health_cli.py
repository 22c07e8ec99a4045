"""gpumon health as a user runs it: table, JSON, exit codes per mode, clear, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumon.commands.health import NPD_MAX_OUTPUT, npd_line
from gpumon.model.findings import Finding, verdict
from tests.helpers import run_cli

LOST_GPU = """
count: 2
gpus:
  - {}
  - lost_at_tick: 0
    lost_reason: "GPU is lost"
"""
XID13 = """
count: 1
gpus:
  - xid_events: [{tick: 0, xid: 13}]
"""
NVML_MISSING = """
count: 1
nvml_missing_inits: 1000
"""


def health(tmp_path: Path, scenario: str | None, *args: str):  # type: ignore[no-untyped-def]
    backend = "fake"
    if scenario is not None:
        path = tmp_path / "scenario.yaml"
        path.write_text(scenario)
        backend = f"fake:{path}"
    return run_cli("health", "--local", "--backend", backend, "--state-dir", str(tmp_path / "state"), *args)


@pytest.mark.parametrize(
    ("scenario", "nagios", "npd", "status"),
    [
        (None, 0, 0, "OK"),
        (XID13, 1, 0, "WARNING"),
        (LOST_GPU, 2, 1, "CRITICAL"),
        (NVML_MISSING, 3, 2, "UNKNOWN"),
    ],
)
def test_exit_codes_per_mode(tmp_path: Path, scenario: str | None, nagios: int, npd: int, status: str) -> None:
    done = health(tmp_path, scenario)
    assert done.returncode == nagios, done.stdout + done.stderr
    assert done.stdout.startswith(f"gpumon health: {status} - ")
    plugin = health(tmp_path, scenario, "--mode", "npd")
    assert plugin.returncode == npd
    line = plugin.stdout.rstrip("\n")
    assert "\n" not in line and len(line) <= NPD_MAX_OUTPUT and line.startswith(status)


def test_table_names_gpu_reason_and_action(tmp_path: Path) -> None:
    done = health(tmp_path, LOST_GPU)
    assert done.stdout.splitlines() == [
        "gpumon health: CRITICAL - GPU 1 lost: GPU is lost: reboot node (polled here)",
        "GPU  STATUS    ACTION            REASON",
        "0    OK        none              ok",
        "1    CRITICAL  reboot_node       GPU 1 lost: GPU is lost: reboot node",
        "recommended: reboot the node",
    ]


def test_json_has_the_verdict_and_the_findings(tmp_path: Path) -> None:
    report = json.loads(health(tmp_path, LOST_GPU, "--json").stdout)
    assert report["status"] == "CRITICAL" and report["action"] == "reboot_node"
    assert [(f["kind"], f["gpu"], f["severity"]) for f in report["findings"]] == [("gpu_lost", 1, "CRITICAL")]
    assert [g["status"] for g in report["gpus"]] == ["OK", "CRITICAL"]


def test_json_follows_the_one_convention_of_every_command(tmp_path: Path) -> None:
    """``--json -`` is stdout (JSON only); ``--json PATH`` writes the file and still prints the table."""
    to_stdout = health(tmp_path, LOST_GPU, "--json", "-")
    assert json.loads(to_stdout.stdout)["status"] == "CRITICAL" and not (tmp_path / "-").exists()
    path = tmp_path / "verdict.json"
    to_file = health(tmp_path, LOST_GPU, "--json", str(path))
    assert to_file.returncode == 2 and to_file.stdout.startswith("gpumon health: CRITICAL - ")
    assert json.loads(path.read_text())["status"] == "CRITICAL"


def test_npd_line_is_cut_to_the_plugin_limit() -> None:
    long = Finding(kind="xid", severity="CRITICAL", action="replace", summary="x" * 200, gpu=3)
    line = npd_line(verdict([long], [(3, None)], 0.0, "local"))
    assert len(line) == NPD_MAX_OUTPUT and line.endswith("...") and line.startswith("CRITICAL: GPU 3 x")


def test_clear_records_who_why_and_when(tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = run_cli("health", "clear", "--gpu", "1", "--reason", "reseated", "--state-dir", str(state))
    assert done.returncode == 0 and "cleared GPU 1" in done.stdout
    [path] = (state / "health" / "clears.d").glob("*.json")
    entry = json.loads(path.read_text())
    assert entry["gpu"] == 1 and entry["reason"] == "reseated" and entry["user"] and entry["at_seconds"] > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu", "-1", "--reason", "x"], "--gpu must be a GPU index"),
        (["--gpu", "0", "--reason", "  "], "--reason must say what was done"),
        (["--gpu", "one", "--reason", "x"], "invalid int value"),
        (["--reason", "x"], "the following arguments are required: --gpu"),
    ],
)
def test_clear_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    done = run_cli("health", "clear", *args, "--state-dir", str(tmp_path))
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "health" / "clears.json").exists()


def test_config_problems_are_all_listed_at_once(tmp_path: Path) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text(
        """
health:
  expected_gpu_count: -1
  colour: blue
  xid_escalation:
    48: {count: 3, window_seconds: 86400, action: explode}
    abc: {count: 1}
  slurm:
    enabled: "yes"
    max_drained_share: 3
"""
    )
    done = run_cli("check-config", str(config))
    assert done.returncode == 2
    for problem in (
        "health.expected_gpu_count must be greater than 0",
        "health: unknown key 'colour'",
        "health.xid_escalation.48.action must be one of none, restart_job, reset_gpu, reboot_node, inspect_hardware, replace",
        "health.xid_escalation: key 'abc' is not an integer XID code",
        "health.slurm.enabled must be true or false",
        "health.slurm.max_drained_share must be a share between 0 and 1",
    ):
        assert problem in done.stderr, done.stderr
    assert "6 problem(s)" in done.stderr


def test_bad_scenario_is_unknown(tmp_path: Path) -> None:
    """A check that cannot judge is UNKNOWN (3), never CRITICAL (2): test_health_cannot_judge.py."""
    done = health(tmp_path, "gpus: 3\n")
    assert done.returncode == 3 and "gpus must be a list" in done.stdout and "Traceback" not in done.stderr


def test_a_poll_that_hangs_is_critical_without_waiting_forever(tmp_path: Path) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text("health:\n  poll_timeout_seconds: 1\n")
    scenario = tmp_path / "hang.yaml"
    scenario.write_text("count: 2\ngpus: [{}, {hang_at_tick: 0, hang_seconds: 3600}]\n")
    done = run_cli(
        "health", "--local", "--config", str(config), "--backend", f"fake:{scenario}", "--state-dir", str(tmp_path / "s"),
        timeout=30,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith(
        "gpumon health: CRITICAL - node: the NVIDIA driver did not answer within 1 s "
        "(a GPU may have fallen off the bus): reboot node"
    )
