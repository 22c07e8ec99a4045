"""A notification's identity survives a restart and duplicates stay with the batch in flight (issue 42
item 12): a SIGKILL at any moment of a spool write left up to 2-3 deliveries of notifications sent long
before. A sender sends its next batch only once the spool holds the last one's delivery and every
notification queued so far: a restart at any moment sends again at most the batch in flight, as the same
notifications (the same ``notificationID``), never ones made afresh."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from gpumon.alerts.notification import Notification, rfc3339
from gpumon.alerts.service import AlertService
from gpumon.alerts.spool import Spool
from tests.alerts.helpers import FakeClock, TestReceiver, alerting, gpu, snap
from tests.helpers import wait_for

HOT = {"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85, "for": 0}
FAST_RETRY = {"initial_backoff": "50ms", "max_backoff": "200ms", "timeout": "2s"}
T0 = 1_800_000_000.0
GPUS = 6


def on_disk(spool: Path, url: str) -> list[dict[str, Any]]:
    """The receiver's queue as the spool file holds it now."""
    try:
        return list(json.loads(spool.read_text()).get("queues", {}).get(url, []))
    except (OSError, ValueError):
        return []


def key_of_queued(raw: dict[str, Any]) -> tuple[str, str, str]:
    return raw["fingerprint"], raw["status"], rfc3339(raw["starts_at"])


def key_of_sent(alert: dict[str, Any]) -> tuple[str, str, str]:
    return alert["fingerprint"], alert["status"], alert["startsAt"]


@pytest.fixture
def slow_spool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every spool write takes 50 ms more (a busy disk): a sender that does not wait for it races ahead."""
    real_save = Spool.save

    def save(self: Spool, data: dict[str, Any]) -> None:
        time.sleep(0.05)
        real_save(self, data)

    monkeypatch.setattr(Spool, "save", save)


def test_a_restart_at_any_moment_sends_again_only_the_batch_in_flight(tmp_path: Path, slow_spool: None) -> None:
    spool = tmp_path / "alerts" / "spool.json"
    disk_at_post: list[list[dict[str, Any]]] = []
    url = ""

    def respond(n: int) -> tuple[int, dict[str, str]]:
        disk_at_post.append(on_disk(spool, url))  # what a SIGKILL now would restart from
        return 200, {}

    receiver = TestReceiver(respond=respond).start()
    url = receiver.url
    clock = FakeClock(T0)
    config = alerting({"builtin_rules": False, "rules": [HOT], "retry": FAST_RETRY, "webhooks": [url]})
    service = AlertService(config, tmp_path, host="node1", clock=clock)
    service.start()
    try:
        for step in range(3 * GPUS):  # each step one GPU fires or resolves: a notification each
            temps = [90 if (step - i) % (2 * GPUS) < GPUS and step >= i else 40 for i in range(GPUS)]
            service.on_snapshot(snap(clock(), *(gpu(i, temperature_celsius=t) for i, t in enumerate(temps))))
            clock.advance(1)
            time.sleep(0.01)
        wait_for(lambda: service.receivers()[0]["queue_length"] == 0, 20, what="every notification delivered")
        assert service.sync(5)
    finally:
        service.stop(2)
        receiver.stop()
    posts = [[key_of_sent(a) for a in r.body["alerts"]] for r in receiver.received]
    assert sum(len(p) for p in posts) >= 2 * GPUS, "fired and resolved alerts were delivered"
    sent_before: set[tuple[str, str, str]] = set()
    for i, (post, disk) in enumerate(zip(posts, disk_at_post, strict=True)):
        queued = {key_of_queued(raw) for raw in disk}
        assert not queued & sent_before, f"a restart at POST {i} would send {queued & sent_before} again"
        sent_before |= set(post)


def test_a_notification_sent_again_after_a_restart_keeps_its_identity(tmp_path: Path) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    copied: list[bool] = []

    def respond(n: int) -> tuple[int, dict[str, str]]:
        if not copied:  # a SIGKILL while this POST is in flight: the next start begins from this spool
            shutil.copytree(first_dir, second_dir)
            copied.append(True)
        return 200, {}

    receiver = TestReceiver(respond=respond).start()
    clock = FakeClock(T0)
    config = alerting({"builtin_rules": False, "rules": [HOT], "retry": FAST_RETRY, "webhooks": [receiver.url]})
    try:
        first = AlertService(config, first_dir, host="node1", clock=clock)
        first.start()
        first.on_snapshot(snap(clock(), gpu(0, temperature_celsius=90)))
        wait_for(lambda: len(receiver.received) == 1, 10, what="the first delivery")
        first.stop(2)
        clock.advance(30)
        second = AlertService(config, second_dir, host="node1", clock=clock)
        second.start()
        wait_for(lambda: len(receiver.received) == 2, 10, what="the delivery again after the restart")
        second.stop(2)
    finally:
        receiver.stop()
    before, after = (r.body["alerts"] for r in receiver.received)
    assert [a["notificationID"] for a in after] == [a["notificationID"] for a in before]
    assert before[0]["notificationID"]


def test_different_states_of_one_alert_have_different_identities() -> None:
    firing = Notification("fp", "firing", {"alertname": "A"}, {}, T0)
    resolved = Notification("fp", "resolved", {"alertname": "A"}, {}, T0, ends_at=T0 + 60)
    refired = Notification("fp", "firing", {"alertname": "A"}, {}, T0 + 120)
    assert len({firing.identity, resolved.identity, refired.identity}) == 3
    assert Notification.from_json(json.loads(json.dumps(firing.to_json()))).identity == firing.identity
