"""One damaged entry in the alert spool never silences its receiver (issue 36, item 2).

A queued notification whose ``starts_at`` is Infinity, NaN or 1e20 is restored with a usable time
(one log line), and every queued alert reaches the receiver; a sender that makes no delivery
attempt for a while (every round fails inside gpumon) is not reported up."""

from __future__ import annotations

import json
import logging
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpumon.alerts.config import RetryConfig
from gpumon.alerts.metrics import sender_families
from gpumon.alerts.notification import Notification
from gpumon.alerts.notify import Receiver
from gpumon.alerts.service import AlertService
from gpumon.exposition.registry import MetricsOf
from tests.alerts.helpers import TestReceiver, alerting, receiver
from tests.helpers import wait_for

pytestmark = pytest.mark.faults
__all__ = ["receiver"]  # the fixture

FAST_RETRY = {"initial_backoff": "50ms", "max_backoff": "200ms", "timeout": "500ms"}
DAMAGED = {"infinity": math.inf, "nan": math.nan, "1e20": 1e20, "minus infinity": -math.inf}


def _queued(fp: str, starts_at: Any) -> dict[str, Any]:
    return {
        "fingerprint": fp,
        "status": "firing",
        "labels": {"alertname": f"Alert{fp}", "host": "node1"},
        "annotations": {},
        "starts_at": starts_at,
        "ends_at": None,
        "generator_url": "",
    }


def _write_spool(state_dir: Path, url: str, entries: list[dict[str, Any]]) -> None:
    (state_dir / "alerts").mkdir(parents=True)
    spool = {"version": 1, "queues": {url: entries}, "delivered": entries}
    (state_dir / "alerts" / "spool.json").write_text(json.dumps(spool))  # json writes Infinity and NaN


@pytest.mark.parametrize("kind", ["webhooks", "alertmanagers"])
def test_damaged_start_times_in_the_spool_still_reach_the_receiver(
    tmp_path: Path, receiver: TestReceiver, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    entries = [_queued("good1", time.time() - 60)]
    entries += [_queued(name.replace(" ", "-"), value) for name, value in DAMAGED.items()]
    entries += [_queued("good2", time.time() - 30), {"fingerprint": "no-labels"}, "not even a mapping"]
    _write_spool(tmp_path, receiver.url, entries)
    cfg = alerting({"builtin_rules": False, "retry": FAST_RETRY, kind: [receiver.url]})
    with caplog.at_level(logging.INFO, logger="gpumon.alerts"):
        service = AlertService(cfg, tmp_path, host="node1")
        service.start()
        try:
            expected = {"Alertgood1", "Alertgood2"} | {f"Alert{n.replace(' ', '-')}" for n in DAMAGED}
            wait_for(
                lambda: {a["labels"]["alertname"] for a in receiver.alerts()} == expected,
                timeout=10,
                what="every queued alert delivered",
            )
            for alert in receiver.alerts():
                started = datetime.fromisoformat(alert["startsAt"].replace("Z", "+00:00")).timestamp()
                assert 0 < started <= time.time() + 1, alert

            def sender() -> dict[str, Any]:
                [one] = json.loads(service.routes()["/api/alerts"]()[2])["receivers"]
                return dict(one)

            wait_for(lambda: sender()["queue_length"] == 0, timeout=10, what="the queue emptied")
            assert sender()["sender"] == "up"
        finally:
            service.stop(2)
    problems = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1, [r.getMessage() for r in problems]  # one line for the damaged entries


def _sender_up(r: Receiver) -> float:
    for family in MetricsOf(_Families([r])).collect():
        for sample in family.samples:
            if sample.name == "gpumon_alert_sender_up":
                return float(sample.value)
    raise AssertionError("no gpumon_alert_sender_up")


class _Families:
    def __init__(self, receivers: list[Receiver]) -> None:
        self._receivers = receivers

    def families(self) -> Any:
        return sender_families(self._receivers)


def test_a_sender_that_makes_no_delivery_attempt_is_not_up(receiver: TestReceiver) -> None:
    broken = [False]

    def clock() -> float:  # a clock that breaks: every round of the worker fails before it sends
        if broken[0]:
            raise OSError("clock broke")
        return time.time()

    r = Receiver("webhook", receiver.url, RetryConfig(0.01, 0.02, 0.05), 10, 240, clock=clock)
    r.start()
    try:
        assert _sender_up(r) == 1.0
        broken[0] = True
        r.enqueue(Notification("fp", "firing", {"alertname": "A"}, {}, time.time()), time.time())
        wait_for(lambda: _sender_up(r) == 0.0, timeout=10, what="the sender reported not up")
        assert r.sender_json()["sender"] != "up"
        assert receiver.alerts() == []
        broken[0] = False
        wait_for(lambda: receiver.alerts(), timeout=10, what="the alert delivered once the clock works")
        wait_for(lambda: _sender_up(r) == 1.0, timeout=10, what="the sender up again")
    finally:
        r.stop(2)
