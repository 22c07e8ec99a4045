"""Delivery to Alertmanager-style and webhook receivers: retries, drops, coalescing, resends.

A local http.server on 127.0.0.1 plays the receiver; waits poll a condition with a deadline."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpumon.alerts.config import AlertingConfig
from gpumon.alerts.service import AlertService
from tests.alerts.helpers import UUID0, FakeClock, TestReceiver, alerting, free_port, gpu, snap, wait_for
from tests.pki import Pki

FAST_RETRY = {"initial_backoff": "50ms", "max_backoff": "200ms", "timeout": "500ms"}
HOT = {"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85, "for": 0}


def config(**raw: Any) -> AlertingConfig:
    return alerting({"builtin_rules": False, "rules": [HOT], "retry": FAST_RETRY, **raw})


@pytest.fixture
def services() -> Iterator[list[AlertService]]:
    started: list[AlertService] = []
    yield started
    for s in started:
        s.stop(2)


def start(services: list[AlertService], cfg: AlertingConfig, state_dir: Path, **kw: Any) -> AlertService:
    service = AlertService(cfg, state_dir, host="node1", **kw)
    service.start()
    services.append(service)
    return service


def fire(service: AlertService, at: float | None = None, temperature: float = 90.0) -> None:
    service.on_snapshot(snap(at if at is not None else time.time(), gpu(temperature_celsius=temperature)))


def test_alertmanager_gets_the_alert_with_labels_annotations_and_times(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    clock = FakeClock(1_800_000_000.0)
    service = start(services, config(alertmanagers=[receiver.url], host="gpu-node-1"), tmp_path, clock=clock)
    fire(service, clock.now)
    wait_for(lambda: receiver.received, 5, what="the alert at the receiver")
    got = receiver.received[0]
    assert got.path == "/api/v2/alerts"
    [alert] = got.body
    assert alert["labels"] == {
        "alertname": "GpuHot",
        "severity": "warning",
        "gpu": "0",
        "uuid": UUID0,
        "host": "gpu-node-1",
    }
    assert "summary" in alert["annotations"]
    assert alert["startsAt"] == "2027-01-15T08:00:00.000Z"
    assert alert["endsAt"] == "2027-01-15T08:04:00.000Z", "valid for 4 resend intervals"
    clock.advance(5)
    fire(service, clock.now, temperature=70)
    wait_for(lambda: len(receiver.received) == 2, 5, what="the resolution")
    [resolved] = receiver.received[1].body
    assert resolved["startsAt"] == alert["startsAt"]
    assert resolved["endsAt"] == "2027-01-15T08:00:05.000Z"


@pytest.mark.parametrize(
    "failure",
    [(500, {}), (503, {}), (429, {}), "close", ("sleep", 1.5)],
    ids=["500", "503", "429", "connection-dropped", "timeout"],
)
def test_retryable_failures_are_retried_until_delivered(
    failure: Any, tmp_path: Path, services: list[AlertService]
) -> None:
    receiver = TestReceiver(respond=lambda n: failure if n < 3 else (200, {})).start()
    try:
        service = start(services, config(alertmanagers=[receiver.url]), tmp_path)
        fire(service)
        wait_for(lambda: service.receivers()[0]["notifications"]["sent"] == 1, 10, what="delivery after 3 failures")
        assert receiver.requests_seen >= 4
        # A request that timed out may still have been processed late by the receiver: at-least-once,
        # and the same alert (Alertmanager deduplicates by label set).
        assert {alert["labels"]["alertname"] for alert in receiver.alerts()} == {"GpuHot"}
        stats = service.receivers()[0]
        assert stats["notifications"]["failed"] >= 3 and stats["notifications"]["sent"] == 1
        assert stats["queue_length"] == 0
    finally:
        receiver.stop()


def test_retry_after_is_honoured(tmp_path: Path, services: list[AlertService]) -> None:
    receiver = TestReceiver(respond=lambda n: (429, {"Retry-After": "1"}) if n == 0 else (200, {})).start()
    try:
        service = start(services, config(alertmanagers=[receiver.url]), tmp_path)
        fire(service)
        began = time.monotonic()
        wait_for(lambda: receiver.received, 10, what="delivery after Retry-After")
        assert receiver.received[0].at - began >= 0.9, "backoff alone (max 200 ms) would have retried sooner"
    finally:
        receiver.stop()


def test_connection_refused_until_the_receiver_starts(tmp_path: Path, services: list[AlertService]) -> None:
    port = free_port()
    service = start(services, config(alertmanagers=[f"http://127.0.0.1:{port}"]), tmp_path)
    fire(service)
    wait_for(lambda: service.receivers()[0]["notifications"]["failed"] >= 2, 5, what="failed attempts")
    assert "connection failed" in service.receivers()[0]["last_error"]
    receiver = TestReceiver().start(port)
    try:
        wait_for(lambda: receiver.alerts(), 10, what="delivery once the receiver is up")
    finally:
        receiver.stop()


def test_other_4xx_is_dropped_not_retried(tmp_path: Path, services: list[AlertService]) -> None:
    receiver = TestReceiver(respond=lambda n: (400, {})).start()
    try:
        service = start(services, config(alertmanagers=[receiver.url]), tmp_path)
        fire(service)
        wait_for(lambda: service.receivers()[0]["notifications"]["dropped"] == 1, 5, what="the drop")
        assert service.receivers()[0]["queue_length"] == 0
        assert "HTTP 400" in service.receivers()[0]["last_error"]
        fire(service)  # still firing: nothing new to send
        time_limit = time.monotonic() + 0.5
        while time.monotonic() < time_limit:
            assert receiver.requests_seen == 1
            time.sleep(0.05)
    finally:
        receiver.stop()


def test_a_dead_receiver_does_not_hold_back_another(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    service = start(services, config(alertmanagers=[dead, receiver.url]), tmp_path)
    fire(service)
    wait_for(lambda: receiver.alerts(), 5, what="the live receiver's delivery")
    queues = {r["name"]: r["queue_length"] for r in service.receivers()}
    assert queues == {dead: 1, receiver.url: 0}


def test_only_the_latest_state_of_an_alert_is_delivered_after_an_outage(
    tmp_path: Path, services: list[AlertService]
) -> None:
    receiver = TestReceiver(respond=lambda n: (503, {"Retry-After": "1"}) if n == 0 else (200, {})).start()
    try:
        service = start(services, config(alertmanagers=[receiver.url]), tmp_path)
        fire(service)
        wait_for(lambda: service.receivers()[0]["notifications"]["failed"] == 1, 5, what="a failed first attempt")
        fire(service, temperature=60)  # resolved while the receiver is down
        wait_for(lambda: receiver.alerts(), 10, what="delivery after the outage")
        [alert] = receiver.alerts()
        assert alert["endsAt"] < time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1)), "resolved"
    finally:
        receiver.stop()


def test_firing_alerts_are_resent_every_resend_interval(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    clock = FakeClock()
    service = start(
        services, config(alertmanagers=[receiver.url], resend_interval="30s"), tmp_path, clock=clock, tick_seconds=3600
    )
    fire(service, clock.now)
    wait_for(lambda: len(receiver.received) == 1, 5, what="the first send")
    clock.advance(29)
    service.tick()
    clock.advance(1)
    service.tick()
    wait_for(lambda: len(receiver.received) == 2, 5, what="the resend")
    [first], [second] = receiver.received[0].body, receiver.received[1].body
    assert first["startsAt"] == second["startsAt"]
    assert second["endsAt"] > first["endsAt"]


def test_webhook_gets_alertmanagers_webhook_body(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    clock = FakeClock()
    service = start(
        services,
        config(webhooks=[receiver.url + "/hook"], external_url="http://node1:10480"),
        tmp_path,
        clock=clock,
        tick_seconds=3600,
    )
    fire(service, clock.now)
    wait_for(lambda: receiver.received, 5, what="the webhook")
    body = receiver.received[0].body
    assert receiver.received[0].path == "/hook"
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["receiver"] == "gpumon"
    assert body["externalURL"] == "http://node1:10480"
    assert body["groupLabels"] == {}
    assert body["commonLabels"]["alertname"] == "GpuHot"
    assert "summary" in body["commonAnnotations"]
    [alert] = body["alerts"]
    assert set(alert) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
    assert alert["status"] == "firing" and len(alert["fingerprint"]) == 16
    assert alert["generatorURL"] == "http://node1:10480/api/alerts"
    clock.advance(100)
    service.tick()
    time.sleep(0.2)
    assert len(receiver.received) == 1, "webhooks are not re-sent on the resend interval, only on change"
    fire(service, clock.now, temperature=50)
    wait_for(lambda: len(receiver.received) == 2, 5, what="the resolved webhook")
    assert receiver.received[1].body["status"] == "resolved"
    assert receiver.received[1].body["alerts"][0]["status"] == "resolved"


@pytest.fixture
def tls_receiver(pki: Pki) -> Iterator[TestReceiver]:
    """A webhook receiver on HTTPS with a certificate from the test CA, asking for client certificates."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_OPTIONAL
    r = TestReceiver().start(tls=context)
    yield r
    r.stop()


def test_https_webhook_with_private_ca_client_certificate_and_bearer_token(
    tls_receiver: TestReceiver, pki: Pki, tmp_path: Path, services: list[AlertService]
) -> None:
    token = tmp_path / "hooks.token"
    token.write_text("s3cret-token\n")
    hook = {
        "url": tls_receiver.url + "/hook",
        "ca_file": str(pki.ca),
        "cert_file": str(pki.client_cert),
        "key_file": str(pki.client_key),
        "bearer_token_file": str(token),
    }
    service = start(services, config(webhooks=[hook]), tmp_path)
    fire(service)
    wait_for(lambda: tls_receiver.received, 5, what="the alert over HTTPS")
    got = tls_receiver.received[0]
    assert got.path == "/hook" and got.body["alerts"][0]["labels"]["alertname"] == "GpuHot"
    assert got.headers["Authorization"] == "Bearer s3cret-token"


def test_https_webhook_whose_certificate_is_not_trusted_is_retried_with_the_reason(
    tls_receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    service = start(services, config(webhooks=[tls_receiver.url + "/hook"]), tmp_path)  # no ca_file
    fire(service)
    wait_for(lambda: (service.receivers()[0]["last_error"] or "").startswith("TLS failed"), 5, what="a TLS error")
    [r] = service.receivers()
    assert r["last_error"].startswith("TLS failed: certificate verify failed: ") and "set ca_file" in r["last_error"]
    assert r["queue_length"] == 1
    assert not tls_receiver.received
