"""A health check that cannot judge says UNKNOWN, names the problem in one line and never drains.

Nagios / NHC / HealthCheckProgram: exit 3; node-problem-detector (--mode npd): exit 2; Slurm
prolog and epilog: exit 0 (the job goes through), a line on stderr and a count the daemon exports
(gpumon_health_unjudged_total{hook}). The admin commands (clear, accept-inventory) keep exit 2.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, free_port, run_cli, wait_for

TYPO = "health:\n  slurm:\n    enabled: true\n    max_drained_share: 3\n"
"""One bad value in an otherwise good config (a share above 1)."""


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpumon.yaml"
    path.write_text(text)
    return path


def _health(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60):  # type: ignore[no-untyped-def]
    return run_cli(
        "health", "--backend", "fake", "--state-dir", str(tmp_path / "state"), *args, env=env, timeout=timeout
    )


def test_a_config_typo_is_unknown_with_the_problem_in_one_line(tmp_path: Path) -> None:
    config = _config(tmp_path, TYPO)
    done = _health(tmp_path, "--local", "--config", str(config))
    assert done.returncode == 3, done.stdout + done.stderr
    [headline, *_] = done.stdout.splitlines()
    assert headline.startswith("gpumon health: UNKNOWN - ") and "max_drained_share" in headline
    assert "Traceback" not in done.stderr


def test_a_config_typo_is_unknown_to_node_problem_detector(tmp_path: Path) -> None:
    done = _health(tmp_path, "--local", "--mode", "npd", "--config", str(_config(tmp_path, TYPO)))
    assert done.returncode == 2, done.stdout + done.stderr  # NPD: unknown
    assert done.stdout.count("\n") == 1 and done.stdout.startswith("UNKNOWN: ")
    assert len(done.stdout.rstrip("\n").encode()) <= 80


def test_a_config_typo_lets_the_prolog_job_through_logged_and_counted(
    tmp_path: Path, start_daemon: Callable[..., DaemonProcess]
) -> None:
    daemon = start_daemon("--backend", "fake")
    done = run_cli(
        "health", "--slurm-prolog", "--config", str(_config(tmp_path, TYPO)), "--state-dir", str(daemon.state_dir),
        env={"SLURM_JOB_ID": "42"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr  # the job runs
    lines = [line for line in done.stderr.splitlines() if "UNKNOWN" in line]
    assert len(lines) == 1 and "max_drained_share" in lines[0] and "prolog" in lines[0], done.stderr
    wait_for(
        lambda: 'gpumon_health_unjudged_total{hook="prolog"} 1.0' in daemon.metrics(), 10, 0.2, "the prolog counted"
    )
    assert 'gpumon_health_unjudged_total{hook="epilog"} 0.0' in daemon.metrics()


def test_a_config_typo_in_the_epilog_exits_0(tmp_path: Path) -> None:
    """A failing epilog makes slurmd drain the node ("Epilog error"): gpumon must not, when it cannot judge."""
    done = run_cli(
        "health", "--slurm-epilog", "--config", str(_config(tmp_path, TYPO)), "--state-dir", str(tmp_path / "s"),
        env={"SLURM_JOB_EXIT_CODE": "256"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert any("UNKNOWN" in line and "max_drained_share" in line for line in done.stderr.splitlines())


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--bogus"], 3),
        (["--mode", "nagois"], 3),
        (["--mode", "npd", "--bogus"], 2),
        (["--slurm-prolog", "--bogus"], 0),
        (["--slurm-epilog", "--bogus"], 0),
        (["--slurm", "--slurm-prolog"], 0),
    ],
)
def test_a_bad_command_line_is_unknown(tmp_path: Path, args: list[str], code: int) -> None:
    done = _health(tmp_path, *args)
    assert done.returncode == code, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "UNKNOWN" in said and "Traceback" not in said
    assert args[-1].lstrip("-") in said  # names the offending word


def test_a_state_directory_that_cannot_be_written_is_unknown(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    done = run_cli("health", "--local", "--backend", "fake", "--state-dir", str(not_a_dir / "state"))
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.startswith("gpumon health: UNKNOWN - ") and str(not_a_dir) in done.stdout


def test_a_slurm_mode_without_slurm_enabled_is_unknown(tmp_path: Path) -> None:
    done = _health(tmp_path, "--local", "--slurm")
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.startswith("gpumon health: UNKNOWN - ") and "health.slurm.enabled" in done.stdout


def test_admin_commands_keep_exit_2_for_bad_input(tmp_path: Path) -> None:
    """clear and accept-inventory are not checks: a usage or config error is exit 2 there."""
    typo = _config(tmp_path, TYPO)
    assert run_cli("health", "clear", "--gpu", "0", "--bogus", "--state-dir", str(tmp_path)).returncode == 2
    cleared = run_cli(
        "health", "clear", "--gpu", "0", "--reason", "x", "--config", str(typo), "--state-dir", str(tmp_path)
    )
    assert cleared.returncode == 2 and "max_drained_share" in cleared.stderr
    accepted = run_cli("health", "accept-inventory", "--config", str(typo), "--state-dir", str(tmp_path))
    assert accepted.returncode == 2 and "max_drained_share" in accepted.stderr


# ---- item 9: the prolog answers within Slurm's budget ----------------------------------------
HUNG_GPU = "count: 2\ngpus: [{}, {hang_at_tick: 0, hang_seconds: 3600}]\n"


def test_prolog_with_a_hung_gpu_answers_within_its_budget_and_lets_the_job_through(tmp_path: Path) -> None:
    """A poll that would be given 120 s (poll_timeout_seconds) is cut at the prolog's own budget
    (default 5 s, well inside Slurm's default 10 s MessageTimeout): UNKNOWN, the job goes through."""
    scenario = tmp_path / "hang.yaml"
    scenario.write_text(HUNG_GPU)
    config = _config(tmp_path, "kernel_log: false\nhealth:\n  poll_timeout_seconds: 120\n  slurm: {enabled: true}\n")
    started = time.monotonic()
    done = run_cli(
        "health", "--slurm-prolog", "--local", "--config", str(config), "--backend", f"fake:{scenario}",
        "--state-dir", str(tmp_path / "s"), timeout=90,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    assert any("UNKNOWN" in line and "prolog" in line for line in done.stderr.splitlines()), done.stderr
    assert elapsed < 60, elapsed  # the budget is 5 s; the poll alone would have had 120 s


# ---- item 10: --daemon-url ----------------------------------------------------------------------
def test_daemon_url_takes_the_base_url_like_every_command(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--backend", "fake")
    for url in (daemon.url, f"{daemon.url}/", f"{daemon.url}/api/health"):  # the full URL still works
        done = run_cli("health", "--daemon-url", url, "--backend", "fake", "--state-dir", str(daemon.state_dir))
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[0] == "gpumon health: OK - all GPUs healthy (from the daemon)", url


def test_a_named_daemon_that_does_not_answer_is_unknown_never_a_local_poll(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = _health(tmp_path, "--daemon-url", url)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.startswith("gpumon health: UNKNOWN - ") and url in done.stdout.splitlines()[0]
    assert "polled here" not in done.stdout
    npd = _health(tmp_path, "--daemon-url", url, "--mode", "npd")
    assert npd.returncode == 2 and npd.stdout.startswith("UNKNOWN: ")


def test_a_named_daemon_url_with_a_wrong_path_is_unknown(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--backend", "fake")
    done = run_cli(
        "health", "--daemon-url", f"{daemon.url}/metrics", "--backend", "fake", "--state-dir", str(daemon.state_dir)
    )
    assert done.returncode == 3, done.stdout + done.stderr
    headline = done.stdout.splitlines()[0]
    assert headline.startswith("gpumon health: UNKNOWN - ") and "404" in headline and "polled here" not in headline
