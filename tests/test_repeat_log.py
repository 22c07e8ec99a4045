"""A failure that repeats every second is said when it starts, summed up once per period, and said when it ends."""

from __future__ import annotations

import logging

import pytest

from gpumon.util.repeat_log import RepeatLog


def test_a_repeating_failure_is_logged_when_it_starts_once_a_period_and_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    failures = RepeatLog(logging.getLogger("test.failures"), period_seconds=60, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="test.failures"):
        for second in range(0, 61):
            now[0] = float(second)
            failures.failed("writing the spool", f"disk full at {second}")
        now[0] = 90.0
        failures.succeeded("writing the spool")
        failures.succeeded("writing the spool")  # working on: nothing more
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "writing the spool failed: disk full at 0 (further failures are summed up every 60 s)"),
        ("ERROR", "writing the spool failed 60 more time(s) in the last 60 s; latest: disk full at 60"),
        ("WARNING", "writing the spool works again after 61 failure(s) over 90 s"),
    ]
