"""Errors a person can act on (issue 46, item 4): check-config points at the bad key and says what
was probably meant; a bad option or variable is said as the command line's or the environment's,
not the file's; the Slurm prolog run by hand says it is outside Slurm; NVML coming back is good
news, not a warning; the fake backend's log agrees with its gpumon_nvml_up."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from tests.helpers import DaemonProcess, run_cli, wait_for

BAD = """\
listen: 0.0.0.0:10480
intervall_seconds: 2
alerting:
  rules:
    - name: GpuHot
      field: temperature_celsius
      op: ">"
      threshold: 85
      severty: warning
    - name: GpuCold
      field: temperature_celsius
      op: "<"
      threshold: abc
health:
  slurm:
    enable: true
"""


def problems_of(result: object) -> list[str]:
    return [line.strip() for line in str(result).splitlines() if line.strip().startswith("- ")]


def test_check_config_points_at_the_bad_key_and_says_what_was_meant(tmp_path: Path) -> None:
    path = tmp_path / "gpumon.yaml"
    path.write_text(BAD)
    result = run_cli("check-config", str(path))
    assert result.returncode == 2
    lines = problems_of(result.stderr)
    [interval] = [p for p in lines if "intervall_seconds" in p]
    assert "line 2," in interval and "did you mean 'interval_seconds'" in interval
    [severity] = [p for p in lines if "severty" in p]
    assert "line 9," in severity and "did you mean 'severity'" in severity
    [threshold] = [p for p in lines if "threshold" in p and "abc" in p]
    assert "line 13," in threshold, "the bad value's line, not the rule's first line (10)"
    [enable] = [p for p in lines if "'enable'" in p]
    assert "line 16," in enable and "did you mean 'enabled'" in enable


def test_a_misspelt_variable_gets_a_suggestion() -> None:
    result = run_cli("once", "--backend", "fake", env={"GPUMON_INTERVALL_SECONDS": "3"})
    assert result.returncode == 2
    assert "did you mean 'GPUMON_INTERVAL_SECONDS'" in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (("--compat", "dcgm5"), {}, "command line: --compat: unknown mode 'dcgm5'"),
        (("--listen", "1.2.3.4:0"), {}, "command line: --listen must be"),
        ((), {"GPUMON_EXPORTER_COMPAT": "dcgm5"}, "environment: GPUMON_EXPORTER_COMPAT: unknown mode 'dcgm5'"),
        ((), {"GPUMON_INTERVAL_SECONDS": "0"}, "environment: GPUMON_INTERVAL_SECONDS must be"),
    ],
)
def test_a_bad_option_or_variable_is_not_called_a_config_problem(
    args: tuple[str, ...], env: dict[str, str], said: str, tmp_path: Path
) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text("listen: 127.0.0.1:10480\n")
    result = run_cli("run", "--backend", "fake", "--config", str(config), *args, env=env)
    assert result.returncode == 2
    [problem] = problems_of(result.stderr)
    assert problem == f"- {said}" or problem.startswith(f"- {said}"), result.stderr
    assert str(config) not in problem


def test_the_slurm_prolog_run_by_hand_says_it_is_outside_slurm(tmp_path: Path) -> None:
    result = run_cli("health", "--slurm-prolog", "--backend", "fake", "--state-dir", str(tmp_path))
    assert result.returncode == 0
    [line] = [line for line in result.stderr.splitlines() if "UNKNOWN" in line]
    assert "job ?" not in line and "SLURM_JOB_ID" in line and "not run by slurmd" in line, line


def test_nvml_coming_back_is_logged_as_information(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    poller = Poller(FakeBackend.from_mapping({"nvml_missing_inits": 1, "gpus": [{}]}), SnapshotStore(),
                    monotonic=lambda: now[0])  # fmt: skip
    caplog.set_level(logging.DEBUG)
    assert poller.poll().nvml_up is False
    now[0] += 3600
    assert poller.poll().nvml_up is True
    [back] = [r for r in caplog.records if "NVML is back" in r.getMessage()]
    assert back.levelno == logging.INFO


def test_the_fake_backends_log_agrees_with_its_nvml_up(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "2")
    wait_for(lambda: "simulated GPU(s)" in daemon.log(), what="the backend's start line")
    assert "gpumon_nvml_up 1.0" in daemon.metrics()
    [line] = [line for line in daemon.log().splitlines() if "simulated GPU(s)" in line]
    assert "simulated NVML" in line and "no NVML in use" not in line, line


BUILTIN = """\
alerting:
  builtin:
    GpuMemoryHigh:
      threshold: abc
    GpuMemHigh: false
health:
  xid_escalation:
    48: {count: 0, window_seconds: 86400, action: replace}
"""


def test_a_built_in_override_and_an_escalation_are_pointed_at_their_own_line(tmp_path: Path) -> None:
    path = tmp_path / "gpumon.yaml"
    path.write_text(BUILTIN)
    lines = problems_of(run_cli("check-config", str(path)).stderr)
    [threshold] = [p for p in lines if "abc" in p]
    assert "line 4," in threshold, threshold
    [misspelt] = [p for p in lines if "GpuMemHigh" in p]
    assert "line 5," in misspelt and "did you mean 'GpuMemoryHigh'" in misspelt, misspelt
    [count] = [p for p in lines if "count" in p]
    assert "line 8, column 17" in count, count
