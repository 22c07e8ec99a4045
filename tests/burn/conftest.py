"""Helpers for running ``gpumon burn`` as a user would: a subprocess, its exit code and output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass
class BurnRun:
    code: int
    out: str
    err: str
    report: dict[str, Any] | None


def run_burn(args: list[str], tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 150) -> BurnRun:
    """``python -m gpumon.burn ARGS --state-dir tmp --json tmp/report.json``."""
    report_path = tmp_path / "report.json"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_BURN_")}
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "gpumon.burn", *args]
    if "--state-dir" not in args:
        cmd += ["--state-dir", str(tmp_path / "state")]
    if "--json" not in args:
        cmd += ["--json", str(report_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return BurnRun(proc.returncode, proc.stdout, proc.stderr, report)


CPU = ["--device", "cpu", "--duration", "1"]


@pytest.fixture
def burn(tmp_path: Path) -> Any:
    def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 150) -> BurnRun:
        return run_burn(args, tmp_path, env, timeout)

    return _run
