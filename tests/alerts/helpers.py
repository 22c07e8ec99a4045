"""Helpers for the alerting tests: crafted snapshots, a scriptable HTTP receiver, a real Alertmanager."""

from __future__ import annotations

import json
import shutil
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpumon.alerts.config import AlertingConfig, parse
from gpumon.model.snapshot import GpuSnapshot, Snapshot
from tests.helpers import ServerProcess, free_port, run_server, wait_for

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-11111111-1111-4000-8000-111111111111"

HEALTHY: dict[str, Any] = {
    "name": "NVIDIA H200",
    "pci_bus_id": "00000000:18:00.0",
    "utilization_ratio": 0.95,
    "memory_used_bytes": 10 * 2**30,
    "memory_total_bytes": 140 * 2**30,
    "temperature_celsius": 60.0,
    "temperature_slowdown_threshold_celsius": 90.0,
    "power_watts": 500.0,
    "clock_events_active": {"gpu_idle": False, "hw_slowdown": False, "sw_thermal_slowdown": False},
    "pcie_link_generation": 5,
    "pcie_link_generation_max": 5,
    "pcie_link_width": 16,
    "pcie_link_width_max": 16,
    "ecc_errors_total": {"uncorrected_volatile": 0, "uncorrected_aggregate": 2},
    "row_remap_pending": False,
    "row_remap_failure": False,
    "nvlink_up": {"0": True, "1": True},
    "processes": (),
}


def gpu(index: int = 0, uuid: str | None = None, **fields: Any) -> GpuSnapshot:
    """A healthy, busy GPU with ``fields`` changed."""
    values = {**HEALTHY, **fields}
    return GpuSnapshot(index=index, uuid=uuid or (UUID0 if index == 0 else UUID1), **values)


def snap(at: float, *gpus: GpuSnapshot, nvml_up: bool = True, nvml_error: str | None = None) -> Snapshot:
    return Snapshot(
        timestamp_seconds=at,
        monotonic_seconds=at,
        nvml_up=nvml_up,
        nvml_error=nvml_error,
        gpus=gpus if gpus or not nvml_up else (gpu(0),),
    )


def alerting(raw: dict[str, Any] | None = None) -> AlertingConfig:
    """Parse an ``alerting:`` mapping and fail the test on problems."""
    config, problems = parse(raw)
    assert not problems, problems
    assert config is not None
    return config


@dataclass
class Received:
    path: str
    body: Any
    at: float
    headers: dict[str, str]


@dataclass
class TestReceiver:
    """An HTTP receiver on 127.0.0.1 that records every POST and answers what ``respond`` says.

    ``respond(n)`` gets the 0-based number of the request and returns (status, headers), or
    ``"close"`` to drop the connection, or ``("sleep", seconds)`` to answer 200 late."""

    __test__ = False

    respond: Callable[[int], Any] = lambda n: (200, {})
    received: list[Received] = field(default_factory=list)
    requests_seen: int = 0
    url: str = ""
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, port: int = 0, tls: ssl.SSLContext | None = None) -> TestReceiver:
        """Listen on 127.0.0.1 (``port`` 0: any free port), over TLS when ``tls`` is given."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with outer._lock:
                    n = outer.requests_seen
                    outer.requests_seen += 1
                action = outer.respond(n)
                if action == "close":
                    self.close_connection = True
                    self.connection.close()
                    return
                if isinstance(action, tuple) and action[0] == "sleep":
                    time.sleep(action[1])
                    action = (200, {})
                status, headers = action
                if 200 <= status < 300:
                    with outer._lock:
                        outer.received.append(
                            Received(self.path, json.loads(raw), time.monotonic(), dict(self.headers.items()))
                        )
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        if tls is not None:
            # the handshake on the handler thread: a client that never completes one cannot block the accept loop
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True, do_handshake_on_connect=False)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert received, flattened (Alertmanager lists or webhook bodies)."""
        out: list[dict[str, Any]] = []
        with self._lock:
            for r in self.received:
                out.extend(r.body if isinstance(r.body, list) else r.body["alerts"])
        return out


@pytest.fixture
def receiver() -> Iterator[TestReceiver]:
    r = TestReceiver().start()
    yield r
    r.stop()


ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
needs_alertmanager = pytest.mark.skipif(
    ALERTMANAGER is None, reason="Alertmanager not installed (Debian package: prometheus-alertmanager)"
)


class AlertmanagerServer(ServerProcess):
    def alerts(self, **params: Any) -> list[dict[str, Any]]:
        response = requests.get(f"{self.url}/api/v2/alerts", params=params, timeout=5, **self.client)
        response.raise_for_status()
        return list(response.json())


@contextmanager
def run_alertmanager(
    tmp_path: Path,
    webhook_url: str | None = None,
    port: int | None = None,
    web_config: dict[str, Any] | None = None,
    client: dict[str, Any] | None = None,
) -> Iterator[AlertmanagerServer]:
    """A real Alertmanager on a (free) loopback port, clustering off, optionally notifying ``webhook_url``.

    ``web_config``: an exporter-toolkit web config (TLS, basic auth) it serves with; ``client``:
    how the test reaches it then (requests' ``verify``, ``auth``)."""
    assert ALERTMANAGER is not None
    port = port or free_port()
    receiver: dict[str, Any] = {"name": "default"}
    if webhook_url:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    config = {
        "route": {
            "receiver": "default",
            "group_by": ["..."],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [receiver],
    }
    directory = tmp_path / f"alertmanager-{port}"
    directory.mkdir()
    (directory / "alertmanager.yml").write_text(yaml.safe_dump(config))
    argv = [
        ALERTMANAGER,
        f"--config.file={directory / 'alertmanager.yml'}",
        f"--storage.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    if web_config is not None:
        (directory / "web-config.yml").write_text(yaml.safe_dump(web_config))
        argv.append(f"--web.config.file={directory / 'web-config.yml'}")
    with run_server("alertmanager", argv, port, directory / "alertmanager.log", client) as server:
        yield AlertmanagerServer(server.url, server.proc, server.log_path, server.client)


class FakeClock:
    """A settable wall clock."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


__all__ = [
    "ALERTMANAGER",
    "FakeClock",
    "TestReceiver",
    "alerting",
    "free_port",
    "gpu",
    "needs_alertmanager",
    "receiver",
    "run_alertmanager",
    "snap",
    "wait_for",
]
