"""The node-problem-detector custom plugin contract: the shipped config runs gpumon health --mode npd,
whose exit codes (0 OK, 1 problem, 2 unknown) and one line (<= max_output_length) NPD understands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumon.commands.health import NPD_MAX_OUTPUT
from tests.helpers import REPO, run_cli

NPD_FILE = REPO / "deploy" / "kubernetes" / "npd-gpumon.yaml"


def plugin_config() -> dict[str, Any]:
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(NPD_FILE.read_text())}
    return dict(json.loads(docs["npd-gpumon-plugin"]["data"]["gpumon-health.json"]))


def test_plugin_runs_gpumon_health_in_npd_mode_within_npd_limits() -> None:
    config = plugin_config()
    assert config["plugin"] == "custom"
    assert config["pluginConfig"]["max_output_length"] == NPD_MAX_OUTPUT
    [rule] = config["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == "GpuUnhealthy"
    assert rule["path"].endswith("/gpumon")
    assert rule["args"][:3] == ["health", "--mode", "npd"]
    assert [c["type"] for c in config["conditions"]] == ["GpuUnhealthy"]


def test_the_daemonset_mounts_the_plugin_config() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(NPD_FILE.read_text())}
    pod = docs[("DaemonSet", "npd-gpumon")]["spec"]["template"]["spec"]
    assert "--config.custom-plugin-monitor=/config/gpumon-health.json" in pod["containers"][0]["command"]
    assert docs[("Service", "gpumon-local")]["spec"]["internalTrafficPolicy"] == "Local"


@pytest.mark.parametrize(
    ("scenario", "code", "starts"),
    [
        ("count: 1\n", 0, "OK: all GPUs healthy"),
        ("count: 1\ngpus: [{xid_events: [{tick: 0, xid: 31}]}]\n", 0, "WARNING: GPU 0 xid 31"),
        ("count: 2\ngpus: [{}, {lost_at_tick: 0}]\n", 1, "CRITICAL: GPU 1 lost"),
        ("count: 1\nnvml_missing_inits: 99\n", 2, "UNKNOWN: node: NVML unavailable"),
    ],
)
def test_the_plugin_command_as_npd_runs_it(tmp_path: Path, scenario: str, code: int, starts: str) -> None:
    """The rule's own args, polling the (simulated) GPUs here instead of asking the gpumon pod
    (a daemon named with --daemon-url that does not answer is UNKNOWN: test_health_cannot_judge)."""
    path = tmp_path / "scenario.yaml"
    path.write_text(scenario)
    rule = plugin_config()["rules"][0]["args"]
    at = rule.index("--daemon-url")
    args = [*rule[:at], "--local", *rule[at + 2 :]]
    args = [a if a != "/tmp/gpumon" else str(tmp_path / "state") for a in args]
    done = run_cli(*args, env={"GPUMON_BACKEND": f"fake:{path}"})
    assert done.returncode == code, done.stdout + done.stderr
    assert done.stdout.endswith("\n") and done.stdout.count("\n") == 1
    line = done.stdout.rstrip("\n")
    assert len(line.encode()) <= NPD_MAX_OUTPUT and line.startswith(starts), line


def test_npd_mode_also_writes_the_json_file_asked_for(tmp_path: Path) -> None:
    """--json PATH with --mode npd: the file holds the verdict, stdout stays NPD's one line."""
    out = tmp_path / "verdict.json"
    done = run_cli(
        "health", "--mode", "npd", "--local", "--backend", "fake:gpu-lost", "--json", str(out),
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.startswith("CRITICAL: GPU 1") and len(done.stdout.splitlines()) == 1
    assert json.loads(out.read_text())["status"] == "CRITICAL"


def test_npd_mode_writes_the_json_file_also_when_it_cannot_judge(tmp_path: Path) -> None:
    out = tmp_path / "verdict.json"
    done = run_cli("health", "--mode", "npd", "--daemon-url", "http://127.0.0.1:9", "--json", str(out))
    assert done.returncode == 2, done.stdout + done.stderr
    assert json.loads(out.read_text())["status"] == "UNKNOWN"
