"""A GPU that failed the last gpumon burn is CRITICAL until a later burn passes or an operator clears it."""

from __future__ import annotations

import json
from pathlib import Path

from gpumon.util.state.files import health_dir
from tests.helpers import run_cli


def write_burn(state: Path, finished_at: float, passed: bool) -> None:
    (state / "burn").mkdir(parents=True, exist_ok=True)
    report = {
        "finished_at": finished_at,
        "exit_code": 0 if passed else 1,
        "gpus": [
            {"node": 0, "gpu": 0, "uuid": "GPU-0", "tests": {"matmul": True}},
            {"node": 0, "gpu": 1, "uuid": "GPU-1", "tests": {"matmul": passed, "memory": True}},
        ],
    }
    (state / "burn" / "last.json").write_text(json.dumps(report))


def health(state: Path):  # type: ignore[no-untyped-def]
    return run_cli("health", "--local", "--backend", "fake", "--state-dir", str(state))


def test_failed_burn_is_critical_until_cleared_or_passed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    burns = health_dir(state, "fake").parent  # the simulated node's own burn results (``--backend fake``)
    write_burn(burns, 1000.0, passed=False)
    failed = health(state)
    assert failed.returncode == 2
    assert "GPU 1 failed gpumon burn (matmul): inspect hardware" in failed.stdout

    assert run_cli("health", "clear", "--gpu", "1", "--reason", "reseated", "--state-dir", str(state)).returncode == 0
    assert health(state).returncode == 0

    write_burn(burns, 4_000_000_000.0, passed=False)  # a later failure counts again
    assert health(state).returncode == 2
    write_burn(burns, 4_000_000_100.0, passed=True)
    assert health(state).returncode == 0
