"""A newcomer's first contact, second round: every command's first screen fits 80 columns, ends
quietly when its reader goes away, and says what it shows (issue: first contact, second round)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumon.cli import MODULE_COMMANDS
from tests.helpers import DaemonProcess

REPO = Path(__file__).resolve().parent.parent
COMMANDS = ("run", "once", "check-config", "scenarios", *MODULE_COMMANDS)


def gpumon_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    env.update({"PYTHONPATH": str(REPO), "COLUMNS": "80", **extra})
    return env


def run_gpumon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args], capture_output=True, text=True, timeout=120, env=gpumon_env()
    )


# ---- item 8: every --help says what the command does, in 80 columns --------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_says_what_it_does_in_80_columns(command: str) -> None:
    result = run_gpumon(command, "--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    wide = [line for line in lines if len(line) > 80]
    assert not wide, wide
    usage_end = next(i for i, line in enumerate(lines) if not line.strip())
    first_after_usage = lines[usage_end + 1]
    assert first_after_usage and not first_after_usage.startswith(("options:", "positional arguments:")), (
        f"gpumon {command} --help has no description:\n{result.stdout}"
    )


# ---- item 2: a reader that goes away -----------------------------------------------------------------
PRINTING = [
    ("scenarios",),
    ("--help",),
    ("once", "--backend", "fake", "--fake-gpus", "8"),
    ("once", "--backend", "fake", "--fake-gpus", "8", "--json"),
    ("scenarios", "--help"),
    ("health", "--local", "--backend", "fake"),
]


@pytest.mark.parametrize("args", PRINTING, ids=" ".join)
def test_a_command_whose_reader_went_away_ends_quietly_with_141(args: tuple[str, ...], tmp_path: Path) -> None:
    """The pipe's read end is closed before gpumon starts, so every write meets a closed pipe (the
    race of `| head -1` made certain). 141 is what a shell reports for a command SIGPIPE ended."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gpumon", *args, "--state-dir", str(tmp_path)] if args[0] == "health"
            else [sys.executable, "-m", "gpumon", *args],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120, env=gpumon_env(),
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr and "Errno" not in result.stderr
    assert "gpumon:" not in result.stderr, result.stderr  # no error line either: a reader going away is no error
    assert result.returncode == 141


def test_head_dash_1_of_scenarios_is_one_line_and_no_traceback() -> None:
    """The user's own pipe, repeated: it failed 1 try in 3 before."""
    for _ in range(6):
        shell = subprocess.run(
            f"set -o pipefail; {sys.executable} -m gpumon scenarios | head -1",
            shell=True, executable="/bin/bash", capture_output=True, text=True, timeout=120, env=gpumon_env(),
        )  # fmt: skip
        assert len(shell.stdout.splitlines()) == 1
        assert "Traceback" not in shell.stderr and "BrokenPipe" not in shell.stderr, shell.stderr
        assert shell.returncode in (0, 141)  # 0 where head read before gpumon's last write


def test_the_project_speaks_of_itself_only() -> None:
    """No shipped text names an internal work item ("issue 3"): a reader cannot look it up."""
    texts = [REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("benchmarks/*.py"), *REPO.glob("gpumon/**/*.py")]
    named = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for path in texts
        for line in path.read_text().splitlines()
        if re.search(r"\bissue #?\d+\b", line, re.IGNORECASE)
    ]
    assert not named, named


# ---- item 5: simulated GPUs are marked -------------------------------------------------------------
def test_the_fake_backend_marks_its_gpus_simulated_on_metrics(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "2")
    assert "\ngpumon_simulated 1.0\n" in daemon.metrics()


def test_real_gpus_are_not_marked_simulated() -> None:
    from gpumon.exposition.simulated import SimulatedSource
    from gpumon.exposition.text import render

    assert "\ngpumon_simulated 0.0\n" in render(SimulatedSource(False).families())


def test_a_cpu_burn_does_not_show_simulated_power_as_measured(tmp_path: Path) -> None:
    result = run_gpumon(
        "burn", "--device", "cpu", "--quick", "--state-dir", str(tmp_path), "--json", str(tmp_path / "burn.json")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not re.search(r"\d+ W\b|\(700\)|\d+ °C", result.stdout), result.stdout
    assert "sim." in result.stdout and "not measured" in result.stdout
    report = json.loads((tmp_path / "burn.json").read_text())
    assert all(gpu["telemetry"]["simulated"] is True for gpu in report["gpus"])


# ---- item 4: the burn's install hint does not pull PyPI's default multi-GB CUDA torch ----------------
def test_the_torch_hint_names_the_build_for_the_device_and_driver() -> None:
    from gpumon.burn.torch_hint import torch_install_hint

    cpu = torch_install_hint("cpu", "13.0")
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu
    cuda = torch_install_hint("cuda", "12.4")
    assert "--index-url https://download.pytorch.org/whl/cu" in cuda and "CUDA 12.4" in cuda
    for line in (cpu, cuda, torch_install_hint("cuda", None)):
        assert "[burn]" not in line and "\n" not in line


def test_no_doc_tells_users_to_pip_install_the_burn_extra_without_choosing_torch() -> None:
    """Where a doc installs the burn extra, the PyTorch build to install first is said (or linked) within
    a few lines."""
    for path in [REPO / "README.md", *REPO.glob("docs/*.md")]:
        lines = path.read_text().splitlines()
        for number, line in enumerate(lines):
            if "[burn]" in line:
                near = "\n".join(lines[max(0, number - 8) : number + 3])
                assert "download.pytorch.org" in near or "burn.md#install" in near, (
                    f"{path.name}:{number + 1}: the burn extra without the PyTorch build to choose: {line}"
                )


def test_the_scenarios_list_fits_80_columns() -> None:
    result = run_gpumon("scenarios")
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 80, result.stdout
    assert "gpu-lost" in result.stdout and "xid-storm" in result.stdout
