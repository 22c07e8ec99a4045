"""gpumon alerts: the active alerts of a running daemon, as a table or JSON; exit 1 when unreachable."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpumon.alerts.service import AlertService
from gpumon.commands import alerts as cli
from gpumon.model.xid import XidEvent
from tests.alerts.helpers import UUID0, FakeClock, alerting, free_port, gpu, snap

T0 = 1_800_000_000.0


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpumon")
    cli.configure(parser.add_subparsers(dest="command").add_parser("alerts"))
    return parser.parse_args(["alerts", *argv])


@pytest.fixture
def daemon_api(tmp_path: Path) -> Iterator[str]:
    """An HTTP server answering /api/alerts from a real AlertService with two alerts."""
    config = alerting({"rules": [{"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85}]})
    service = AlertService(config, tmp_path, host="node1", clock=FakeClock(T0), xid_action=lambda c: "reboot")
    service.on_snapshot(snap(T0, gpu(temperature_celsius=90)))
    service.on_xid(XidEvent(xid=79, timestamp_seconds=T0, source="nvml", gpu_index=0, uuid=UUID0))
    handler_fn = service.routes()["/api/alerts"]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            status, content_type, body = handler_fn() if self.path == "/api/alerts" else (404, "text/plain", b"")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_prints_a_table_of_active_alerts(daemon_api: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--url", daemon_api)
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "Active alerts on node1" in out
    assert "GpuXidCritical" in out and "GpuHot" in out
    assert "xid 79" in out and "firing" in out


def test_json_output(daemon_api: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse("--url", daemon_api, "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"GpuHot", "GpuXidCritical"} <= {a["alertname"] for a in data["alerts"]}


def test_unreachable_daemon_is_one_clear_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert cli.run(parse("--url", url)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gpumon alerts: no answer from a gpumon daemon at {url}/api/alerts: connection refused"]


def test_default_url_comes_from_the_config_listen_address(tmp_path: Path) -> None:
    path = tmp_path / "gpumon.yaml"
    path.write_text("listen: 0.0.0.0:12345\n")
    assert cli._default_url(parse("--config", str(path))) == "http://127.0.0.1:12345"
    assert cli._default_url(parse("--config", str(tmp_path / "missing.yaml"))) == cli.DEFAULT_URL


def test_no_alerts(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    cli.print_table(Console(), {"host": "node1", "alerts": [], "receivers": []})
    assert "No active alerts on node1." in capsys.readouterr().out
