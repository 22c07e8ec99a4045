"""Delivery to Alertmanager-style and webhook receivers: retries, drops, coalescing, resends.

A local http.server on 127.0.0.1 plays the receiver; waits poll a condition with a deadline."""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpumon.alerts.config import AlertingConfig, RetryConfig
from gpumon.alerts.notification import Notification
from gpumon.alerts.notify import Receiver
from gpumon.alerts.service import AlertService
from gpumon.exposition.registry import MetricsOf
from tests.alerts.helpers import (
    UUID0,
    FakeClock,
    TestReceiver,
    alerting,
    free_port,
    gpu,
    needs_alertmanager,
    run_alertmanager,
    snap,
    wait_for,
)
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


def test_a_sender_makes_its_http_session_for_its_first_alert(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    service = start(services, config(alertmanagers=[receiver.url]), tmp_path)
    [sender] = service._receivers.values()
    made: list[requests.Session] = []
    sender._session_factory = lambda: made.append(requests.Session()) or made[-1]
    time.sleep(0.3)  # the worker runs and waits for alerts
    assert made == [], "no session (so no requests import in a daemon) before there is an alert to send"
    fire(service)
    wait_for(lambda: receiver.received, 5, what="the alert at the receiver")
    fire(service, temperature=70)
    wait_for(lambda: len(receiver.received) == 2, 5, what="the resolution")
    assert len(made) == 1, "one session for the sender's life"


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
    assert "connection refused" in service.receivers()[0]["last_error"]
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
    assert set(alert) == {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
        "notificationID",
    }
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
    wait_for(lambda: "TLS failed" in (service.receivers()[0]["last_error"] or ""), 5, what="a TLS error")
    [r] = service.receivers()
    assert "TLS failed: certificate verify failed: " in r["last_error"] and "set ca_file" in r["last_error"]
    assert r["queue_length"] == 1
    assert not tls_receiver.received


# ---- a sender that never dies, and says when it is stuck -------------------------------------------
def metric(service: AlertService, name: str, **labels: str) -> float | None:
    """The value of one sample of the alert collector's metrics, None when absent."""
    for family in MetricsOf(service.collector()).collect():
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def cli_output(service: AlertService, capsys: pytest.CaptureFixture[str]) -> str:
    from rich.console import Console

    from gpumon.commands import alerts as cli

    status, _, body = service.routes()["/api/alerts"]()
    assert status == 200
    capsys.readouterr()
    cli.print_table(Console(width=200), json.loads(body))
    return capsys.readouterr().out


@pytest.mark.faults
@needs_alertmanager
@pytest.mark.integration
def test_alertmanager_down_for_thousands_of_attempts_then_up_gets_the_alert_once(
    tmp_path: Path, services: list[AlertService]
) -> None:
    """More than 1,024 failed deliveries (2.0 ** 1024 overflowed the backoff) and the sender still delivers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    retry = {"initial_backoff": "1ms", "max_backoff": "2ms", "timeout": "1s"}
    service = start(services, config(alertmanagers=[url], retry=retry), tmp_path)
    fire(service)
    wait_for(lambda: service.receivers()[0]["notifications"]["failed"] > 2000, 120, what="> 2,000 failed attempts")
    assert metric(service, "gpumon_alert_notifications_total", receiver=url, outcome="failed") > 2000  # type: ignore[operator]
    [r] = service.receivers()
    assert r["sender"] == "up" and r["sender_errors"] == 0 and "connection refused" in r["last_error"]
    assert metric(service, "gpumon_alert_sender_up", receiver=url) == 1.0
    hook = TestReceiver().start()
    try:
        with run_alertmanager(tmp_path, hook.url, port) as am:
            [alert] = wait_for(am.alerts, 15, what="the alert in Alertmanager")
            assert alert["labels"]["alertname"] == "GpuHot"
            wait_for(hook.alerts, 10, what="Alertmanager's notification")
            time.sleep(1.5)  # a duplicate would be notified within group_interval (1 s)
            assert [a["labels"]["alertname"] for a in hook.alerts()] == ["GpuHot"], "notified exactly once"
            [r] = service.receivers()
            assert r["queue_length"] == 0 and r["notifications"]["sent"] == 1
            assert r["last_error"] == "", "a success clears the last error"
    finally:
        hook.stop()


@pytest.mark.faults
def test_an_exception_inside_the_sender_is_logged_once_counted_and_the_sender_goes_on(
    receiver: TestReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_on_change() -> None:
        raise RuntimeError("spool trigger broke")

    r = Receiver(
        "alertmanager",
        receiver.url,
        retry=RetryConfig(0.01, 0.02, 1.0),
        capacity=10,
        valid_for_seconds=240,
        on_change=broken_on_change,
    )
    r.start()
    try:
        for n in range(3):
            r.enqueue(Notification(f"fp{n}", "firing", {"alertname": f"A{n}"}, {}, time.time()), time.time())
            wait_for(lambda n=n: len(receiver.alerts()) == n + 1, 5, what=f"alert {n} delivered after the error")
        wait_for(lambda: r.stats.errors == 3, 5, what="three errors counted")
        assert r.health().state == "up"
        assert r.stats.outcomes["sent"] == 3
    finally:
        r.stop(2)
    logged = [rec for rec in caplog.records if "alert sender for" in rec.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR, "one line per distinct error, not per attempt"
    assert "RuntimeError: spool trigger broke" in logged[0].getMessage()


def test_the_backoff_is_capped_for_any_number_of_attempts() -> None:
    r = Receiver("webhook", "http://127.0.0.1:9/", RetryConfig(0.001, 0.002, 1.0), 10, 240, rng=lambda: 1.0)
    assert [r._backoff(n) for n in (1, 2, 1025, 10**9)] == [0.001, 0.002, 0.002, 0.002]


class _HangingSession(requests.Session):
    """A session whose POST hangs until released (as a receiver that never answers and ignores timeouts)."""

    release = threading.Event()

    def post(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.release.wait(30)
        raise requests.ConnectionError("released")


@pytest.mark.faults
def test_a_stuck_sender_shows_in_metrics_api_and_cli_but_not_as_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    cfg = config(alertmanagers=[url], retry={"initial_backoff": "10ms", "max_backoff": "50ms", "timeout": "50ms"})
    service = AlertService(cfg, tmp_path, host="node1")
    _HangingSession.release.clear()
    [receiver] = service._receivers.values()
    receiver._session_factory = _HangingSession
    service.start()
    try:
        assert metric(service, "gpumon_alert_sender_up", receiver=url) == 1.0
        fire(service)
        wait_for(lambda: service.receivers()[0]["sender"] == "stuck", 5, what="the sender seen stuck")
        [r] = service.receivers()
        assert r["sender_problem"].startswith("no delivery attempt for ") and "1 alert(s) queued" in r["sender_problem"]
        assert metric(service, "gpumon_alert_sender_up", receiver=url) == 0.0
        assert metric(service, "gpumon_alert_sender_last_attempt_timestamp_seconds", receiver=url) is not None
        out = cli_output(service, capsys)
        assert f"receiver {url}: 1 queued, sender stuck (no delivery attempt for" in out
        _HangingSession.release.set()
        wait_for(lambda: service.receivers()[0]["sender"] == "up", 5, what="the sender up again")
        assert metric(service, "gpumon_alert_sender_up", receiver=url) == 1.0
    finally:
        _HangingSession.release.set()
        service.stop(2)
    assert service.receivers()[0]["sender"] == "stopped"
