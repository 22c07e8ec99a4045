"""Alert delivery errors a person can act on (issue 46, item 4): which receiver, why in words (not a
library's internals), how many tries and when the next one is; the recovery is logged; and what a
receiver answered is shown as text by ``gpumon alerts`` (issue 42, item 14)."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpumon.alerts.service import AlertService
from gpumon.commands import alerts as cli
from gpumon.util.net_words import duration_words
from tests.alerts.helpers import TestReceiver, alerting, free_port, gpu, snap, wait_for

FAST_RETRY = {"initial_backoff": "50ms", "max_backoff": "200ms", "timeout": "500ms"}
HOT = {"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85, "for": 0}


def started(tmp_path: Path, url: str) -> AlertService:
    config = alerting({"builtin_rules": False, "rules": [HOT], "retry": FAST_RETRY, "alertmanagers": [url]})
    service = AlertService(config, tmp_path, host="node1")
    service.start()
    service.on_snapshot(snap(1_800_000_000.0, gpu(temperature_celsius=90)))
    return service


def test_a_refused_connection_says_so_with_tries_and_next_attempt_then_the_recovery_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service = started(tmp_path, url)
    try:
        wait_for(lambda: service.receivers()[0]["notifications"]["failed"] >= 3, 10, what="three failed tries")
        error = service.receivers()[0]["last_error"]
        assert re.fullmatch(rf"Alertmanager at {url}: connection refused \(\d+ tries, next in [\d.]+ s\)", error), error
        failures = [r.getMessage() for r in caplog.records if "alert delivery failed" in r.getMessage()]
        assert failures and all("urllib3" not in f and "Errno" not in f and "object at 0x" not in f for f in failures)
        assert f"Alertmanager at {url}: connection refused (1 try, next in" in failures[0]
        receiver = TestReceiver().start(port)
        try:
            wait_for(lambda: receiver.alerts(), 10, what="delivery once the receiver is up")
            recovered = wait_for(
                lambda: [r for r in caplog.records if "delivered again after" in r.getMessage()], 10, what="recovery"
            )
            assert recovered[0].levelno == logging.INFO
            assert re.search(rf"Alertmanager at {url}: delivered again after [\d.]+ s \(\d+ failed tries\)",
                             recovered[0].getMessage()), recovered[0].getMessage()  # fmt: skip
            assert service.receivers()[0]["last_error"] == ""
        finally:
            receiver.stop()
    finally:
        service.stop(2)


def test_durations_are_said_as_a_person_says_them() -> None:
    assert [duration_words(s) for s in (0.25, 8, 8.04, 45, 120, 3900, 7200, 200_000)] == [
        "0.2 s", "8 s", "8 s", "45 s", "2 min", "65 min", "2 h", "2 d 7 h"
    ]  # fmt: skip


# ---- issue 42, item 14: what a receiver answers is text, never markup -------------------------------------------
HOSTILE = ["[/]", "[bold red]fake[/bold red]", "\x1b[2J\x1b[31mred", "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"]


@pytest.mark.parametrize("body", HOSTILE)
def test_a_receivers_error_body_is_shown_as_text(body: str) -> None:
    data: dict[str, Any] = {
        "host": "node1" + body,
        "alerts": [{"state": "firing", "severity": "critical", "alertname": "GpuHot" + body, "gpu": "0" + body,
                    "labels": {"xid": body}, "annotations": {"summary": "hot " + body}, "starts_at": 0}],
        "receivers": [{"name": "am" + body, "queue_length": 1, "sender": "up", "last_error": f"HTTP 500 {body}"}],
    }  # fmt: skip
    out = io.StringIO()
    cli.print_table(Console(file=out, width=200, force_terminal=True, color_system="truecolor"), data, now=10.0)
    text = out.getvalue()
    assert "\x1b]8" not in text and "\x1b[2J" not in text, "escape sequences from outside never reach the terminal"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)  # rich's own colours
    shown_as = body.replace("\x1b", "\\x1b")
    assert plain.count(shown_as) >= 5, plain


def test_the_daemon_unreachable_is_said_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    parser = __import__("argparse").ArgumentParser()
    cli.configure(parser)
    assert cli.run(parser.parse_args(["--url", url])) == 1
    assert capsys.readouterr().err.strip() == f"gpumon alerts: no answer from a gpumon daemon at {url}/api/alerts: " \
        "connection refused"  # fmt: skip
