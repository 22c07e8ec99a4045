"""Against a real Alertmanager (Debian prometheus-alertmanager) started on loopback by the test.

The AlertService is fed by the real Poller reading the fake backend, as in the daemon."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpumon.alerts.alert import fingerprint
from gpumon.alerts.service import AlertService
from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from tests.alerts.helpers import TestReceiver, alerting, free_port, needs_alertmanager, run_alertmanager, wait_for
from tests.pki import Pki

pytestmark = [needs_alertmanager, pytest.mark.integration]

FAST_RETRY = {"initial_backoff": "100ms", "max_backoff": "500ms", "timeout": "2s"}
RULES = [
    {
        "name": "GpuHot",
        "field": "temperature_celsius",
        "op": ">",
        "threshold": 85,
        "for": 0,
        "labels": {"team": "ml"},
        "annotations": {"summary": "GPU {{ gpu }} at {{ value }} °C"},
    }
]


def scenario(temperatures: list[list[float]]) -> FakeBackend:
    return FakeBackend.from_mapping({"gpus": [{"values": {"temperature_celsius": t}} for t in temperatures]})


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[AlertService] = []

    def make(alertmanager_url: str | dict[str, str], backend: FakeBackend, **raw: Any) -> tuple[AlertService, Poller]:
        config = alerting(
            {
                "builtin_rules": False,
                "rules": RULES,
                "alertmanagers": [alertmanager_url],
                "retry": FAST_RETRY,
                "host": "gpu-node-1",
                **raw,
            }
        )
        service = AlertService(config, tmp_path / "state", host="ignored")
        store = SnapshotStore()
        store.subscribe(service.on_snapshot)
        service.start()
        made.append(service)
        return service, Poller(backend, store)

    yield make
    for s in made:
        s.stop(3)


def test_alert_from_a_fake_scenario_appears_in_alertmanager_and_resolves(tmp_path: Path, service_factory: Any) -> None:
    hook = TestReceiver().start()
    try:
        with run_alertmanager(tmp_path, webhook_url=hook.url + "/am") as am:
            service, poller = service_factory(am.url, scenario([[60, 95, 95, 60], [60]]))
            poller.poll()
            assert am.alerts() == []
            poller.poll()  # GPU 0 crosses 85 °C
            [alert] = wait_for(am.alerts, 10, what="the alert in Alertmanager")
            uuid0 = FakeBackend.from_mapping({"count": 1}).uuid(0)
            assert alert["labels"] == {
                "alertname": "GpuHot",
                "severity": "warning",
                "gpu": "0",
                "uuid": uuid0,
                "host": "gpu-node-1",
                "team": "ml",
            }
            assert alert["annotations"]["summary"] == "GPU 0 at 95 °C"
            assert alert["status"]["state"] == "active"
            assert alert["fingerprint"] == fingerprint(alert["labels"]), "same identity as Alertmanager's"
            assert alert["fingerprint"] == service.active_alerts()[0]["fingerprint"]
            wait_for(
                lambda: [b for b in hook.received if b.body["status"] == "firing"],
                10,
                what="Alertmanager's firing notification",
            )
            poller.poll()
            poller.poll()  # back to 60 °C
            wait_for(lambda: am.alerts() == [], 10, what="the alert resolved in Alertmanager")
            resolved = wait_for(
                lambda: [b for b in hook.received if b.body["status"] == "resolved"],
                10,
                what="Alertmanager's resolved notification",
            )
            assert resolved[0].body["alerts"][0]["labels"]["alertname"] == "GpuHot"
    finally:
        hook.stop()


def test_alertmanager_down_for_a_while_gets_every_alert_once_it_is_up(tmp_path: Path, service_factory: Any) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    service, poller = service_factory(url, scenario([[95], [96], [60, 97]]))
    poller.poll()
    poller.poll()  # GPU 2 crosses on the second poll
    wait_for(lambda: service.receivers()[0]["notifications"]["failed"] >= 3, 10, what="failed deliveries")
    assert service.receivers()[0]["queue_length"] == 3
    hook = TestReceiver().start()
    try:
        with run_alertmanager(tmp_path, hook.url, port) as am:
            alerts = wait_for(lambda: len(am.alerts()) == 3 and am.alerts(), 15, what="3 alerts in Alertmanager")
            assert sorted(a["labels"]["gpu"] for a in alerts) == ["0", "1", "2"]
            notified = wait_for(
                lambda: len(hook.alerts()) >= 3 and hook.alerts(), 10, what="Alertmanager notifications"
            )
            time.sleep(1.5)  # a duplicate would be notified within group_interval (1 s)
            by_gpu = sorted(a["labels"]["gpu"] for a in hook.alerts())
            assert by_gpu == ["0", "1", "2"], f"each alert notified once, got {by_gpu} from {notified}"
            assert service.receivers()[0]["queue_length"] == 0
    finally:
        hook.stop()


def test_alertmanager_behind_tls_and_basic_auth_gets_the_alert(tmp_path: Path, service_factory: Any, pki: Pki) -> None:
    import bcrypt

    web_config = {
        "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)},
        "basic_auth_users": {"gpumon": bcrypt.hashpw(b"pager-pass", bcrypt.gensalt(4)).decode()},
    }
    client = {"verify": str(pki.ca), "auth": ("gpumon", "pager-pass")}
    with run_alertmanager(tmp_path, web_config=web_config, client=client) as am:
        assert am.url.startswith("https://")
        receiver = {"url": am.url.replace("https://", "https://gpumon:pager-pass@"), "ca_file": str(pki.ca)}
        service, poller = service_factory(receiver, scenario([[60, 95]]))
        poller.poll()
        poller.poll()
        [alert] = wait_for(am.alerts, 10, what="the alert in Alertmanager over TLS with basic auth")
        assert alert["labels"]["alertname"] == "GpuHot"
        [r] = service.receivers()
        assert r["name"] == am.url.replace("https://", "https://gpumon:***@") and not r["last_error"]
