"""The command line as a user meets it."""

from __future__ import annotations

import json
import subprocess
import sys

from gpumon import __version__
from tests.helpers import run_cli


def test_version_and_help() -> None:
    assert run_cli("--version").stdout.strip() == f"gpumon {__version__}"
    help_text = run_cli("--help").stdout
    for command in ("run", "once", "check-config"):
        assert command in help_text


def test_python_dash_m_gpumon_works() -> None:
    result = subprocess.run([sys.executable, "-m", "gpumon", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and __version__ in result.stdout


def test_no_command_prints_help_and_exits_2() -> None:
    result = run_cli()
    assert result.returncode == 2 and "usage" in result.stdout


def test_once_prints_a_table_of_simulated_gpus() -> None:
    result = run_cli("once", "--backend", "fake", "--fake-gpus", "2")
    assert result.returncode == 0, result.stderr
    assert "NVIDIA H200" in result.stdout and "Driver 580.159.04" in result.stdout


def test_once_json_holds_every_gpu() -> None:
    result = run_cli("once", "--backend", "fake", "--fake-gpus", "2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [g["index"] for g in data["gpus"]] == [0, 1]
    assert data["nvml_up"] is True
    assert data["gpus"][0]["memory_total_bytes"] > 100 * 2**30


def test_once_without_nvml_is_one_line_and_exit_1() -> None:
    """This machine has no NVIDIA driver: the real backend must say so in one line."""
    result = run_cli("once")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("gpumon: NVML unavailable"), result.stderr
    assert "Traceback" not in result.stderr


def test_the_daemon_never_loads_torch() -> None:
    code = "import sys, gpumon.cli, gpumon.daemon; gpumon.cli.build_parser(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr
