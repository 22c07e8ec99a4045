"""Every number in the health section is finite and bounded, in check-config and in run alike (issue 42, item 13).

``health.poll_timeout_seconds: .inf`` passed check-config, then ``gpumon health`` exited 1 (WARNING to
Nagios, a problem to NPD, a drain from the Slurm epilog). Now check-config names the setting (exit 2),
and ``gpumon health`` cannot judge (UNKNOWN, exit 3 in Nagios mode) instead of failing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.config.file import ConfigError, load
from gpumon.health.config import HIGHEST
from tests.helpers import run_cli

SETTINGS: dict[str, tuple[tuple[str, ...], bool]] = {
    "expected_gpu_count": (("expected_gpu_count",), True),
    "defer_window_seconds": (("defer_window_seconds",), False),
    "transient_window_seconds": (("transient_window_seconds",), False),
    "poll_timeout_seconds": (("poll_timeout_seconds",), False),
    "count": (("xid_escalation", 48, "count"), True),
    "window_seconds": (("xid_escalation", 48, "window_seconds"), False),
    "timeout_seconds": (("slurm", "timeout_seconds"), False),
    "prolog_timeout_seconds": (("slurm", "prolog_timeout_seconds"), False),
    "max_drained_share": (("slurm", "max_drained_share"), False),
    "max_drained_nodes": (("slurm", "max_drained_nodes"), True),
    "stuck_process_seconds": (("stuck_process_seconds",), False),
}
"""Each bounded number of the health section: where it sits, and whether it is a count."""


def health_with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    health: dict[Any, Any] = {"xid_escalation": {48: {"count": 3, "window_seconds": 86400, "action": "replace"}}}
    node = health
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return {"health": health}


def problems_of(tmp_path: Path, doc: dict[str, Any]) -> list[str]:
    config = tmp_path / "gpumon.yaml"
    config.write_text(yaml.safe_dump(doc))
    try:
        load(config, env={}, path_must_exist=True)
    except ConfigError as exc:
        return exc.problems
    return []


OUT_OF_RANGE = st.one_of(
    st.sampled_from([math.inf, -math.inf, math.nan, 0, -1, 1e300, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda v: not 0 < v <= 1e6),
)


@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(sorted(SETTINGS)), bad=OUT_OF_RANGE)
def test_a_number_that_is_not_finite_or_out_of_its_range_is_a_problem_named_by_its_key(
    tmp_path_factory: pytest.TempPathFactory, key: str, bad: Any
) -> None:
    path, _count = SETTINGS[key]
    if bad != bad or not 0 < bad <= HIGHEST[key]:  # NaN, or outside the range (the test keeps in-range ones)
        problems = problems_of(tmp_path_factory.mktemp("cfg"), health_with(path, bad))
        assert any(f".{key} must be" in p for p in problems), problems


@pytest.mark.parametrize("key", sorted(SETTINGS))
def test_each_bound_itself_is_accepted(tmp_path: Path, key: str) -> None:
    path, _count = SETTINGS[key]
    assert problems_of(tmp_path, health_with(path, HIGHEST[key])) == []


def test_an_infinite_poll_timeout_fails_check_config_and_health_cannot_judge_rather_than_fail(tmp_path: Path) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text("health:\n  poll_timeout_seconds: .inf\n")
    checked = run_cli("check-config", str(config))
    assert checked.returncode == 2 and "poll_timeout_seconds" in checked.stderr
    health = run_cli(
        "health", "--config", str(config), "--local", "--backend", "fake", "--state-dir", str(tmp_path / "state")
    )
    assert health.returncode == 3, health.stdout + health.stderr  # UNKNOWN: nothing drained, no WARNING
    assert "UNKNOWN" in health.stdout
