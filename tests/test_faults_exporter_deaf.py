"""The exporter cannot go deaf (issue 36, item 8).

* an accept() error (ECONNABORTED, EPROTO) is logged once and the next scrape is answered;
* while every accept fails, systemd's watchdog is no longer fed (systemd restarts gpumon), and it
  is fed again once accepts work;
* a TLS connection evicted in its handshake leaves nothing behind: later scrapes are answered;
* a Content-Length of ``²`` or 5,000 digits gets an answer (400 or 413), never a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
import yaml

from gpumon.collect.store import SnapshotStore
from gpumon.http.limits import HttpLimits
from gpumon.http.server import MetricsServer
from gpumon.http.webconfig_watcher import WebConfigWatcher
from tests.helpers import DaemonProcess, RenderedBytes, wait_for
from tests.pki import Pki
from tests.test_daemon_faults import Systemd, systemd

pytestmark = pytest.mark.faults
__all__ = ["systemd"]  # the fixture, shared with test_daemon_faults

FAULT_INJECT = Path(__file__).resolve().parent / "fault_inject"


def _problem_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if " WARNING " in line or " ERROR " in line or "Traceback" in line]


def _daemon_with_accept_faults(
    start_daemon: Callable[..., DaemonProcess], systemd: Systemd, control: Path
) -> DaemonProcess:
    env = {
        **systemd.env(),
        "FAULT_ACCEPT_CONTROL": str(control),
        "PYTHONPATH": os.pathsep.join([str(FAULT_INJECT), os.environ.get("PYTHONPATH", "")]),
    }
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "1", env=env)
    wait_for(lambda: systemd.count("READY=1") >= 1, what="READY=1")
    return daemon


@pytest.mark.parametrize("error", ["ECONNABORTED", "EPROTO", "EPERM"])
def test_one_accept_error_is_logged_once_and_the_next_scrape_is_answered(
    start_daemon: Callable[..., DaemonProcess], systemd: Systemd, tmp_path: Path, error: str
) -> None:
    control = tmp_path / "accept-fault"
    daemon = _daemon_with_accept_faults(start_daemon, systemd, control)
    before = len(_problem_lines(daemon.log()))
    control.write_text(f"{error} once\n")  # the next accept() fails: this scrape's
    for _ in range(3):
        assert daemon.get("/metrics", timeout=5).status_code == 200
    assert not control.exists(), "the accept() error happened"
    assert len(_problem_lines(daemon.log())) == before + 1, daemon.log()
    time.sleep(1.5)  # the 2 s watchdog: pinged at least every second
    assert time.monotonic() - systemd.last("WATCHDOG=1") < 1.5


@pytest.mark.timeout(90)
def test_while_every_accept_fails_the_watchdog_is_not_fed_and_is_fed_again_after(
    start_daemon: Callable[..., DaemonProcess], systemd: Systemd, tmp_path: Path
) -> None:
    control = tmp_path / "accept-fault"
    daemon = _daemon_with_accept_faults(start_daemon, systemd, control)
    before = len(_problem_lines(daemon.log()))
    control.write_text("EPROTO always\n")
    with pytest.raises(requests.RequestException):  # a connection to accept: every accept() fails now
        daemon.get("/metrics", timeout=1)
    # systemd's 2 s watchdog would fire: no WATCHDOG=1 for 4 s in a row
    wait_for(lambda: time.monotonic() - systemd.last("WATCHDOG=1") > 4, timeout=40, what="the watchdog to starve")
    with pytest.raises(requests.RequestException):
        daemon.get("/metrics", timeout=1)
    # one line for the accept errors, one for the watchdog: not one a second
    assert len(_problem_lines(daemon.log())) - before == 2, daemon.log()
    control.unlink()
    wait_for(lambda: daemon.get("/metrics", timeout=2).status_code == 200, timeout=20, what="scrapes again")
    fed_again = time.monotonic()
    wait_for(lambda: systemd.last("WATCHDOG=1") > fed_again, timeout=10, what="the watchdog fed again")
    assert daemon.proc.poll() is None


def _tls_server(tmp_path: Path, pki: Pki) -> MetricsServer:
    path = tmp_path / "web-config.yml"
    path.write_text(
        yaml.safe_dump({"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}})
    )
    return MetricsServer(
        ("127.0.0.1", 0),
        RenderedBytes(lambda: b"x 1.0\n"),
        SnapshotStore(),
        stale_after_seconds=5,
        web_config=WebConfigWatcher(path),
        limits=HttpLimits(max_connections=16),
    )


@pytest.mark.timeout(120)
def test_tls_connections_evicted_in_their_handshake_leave_later_scrapes_answered(tmp_path: Path, pki: Pki) -> None:
    server = _tls_server(tmp_path, pki)
    server.start()
    hello = _client_hello_start(pki)
    held: list[socket.socket] = []
    try:
        for _round in range(6):
            # connections that stop in their handshake (part of a ClientHello) or before it (nothing sent),
            # more than the limit: the oldest are evicted while they handshake
            for i in range(24):
                sock = socket.create_connection(("127.0.0.1", server.port))
                if i % 2:
                    sock.sendall(hello)
                held.append(sock)
            time.sleep(0.2)
            for _ in range(3):
                answer = requests.get(f"https://127.0.0.1:{server.port}/metrics", verify=str(pki.ca), timeout=5)
                assert answer.text == "x 1.0\n"
            for sock in held:
                sock.close()
            held.clear()
    finally:
        for sock in held:
            sock.close()
        server.stop()


def _client_hello_start(pki: Pki) -> bytes:
    """The first bytes of a real TLS ClientHello (a client that then stalls)."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    data = outgoing.read()
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    "length",
    ["\u00b2", "9" * 5000, "1" * 20, "-1", "0x10", "1 2", "\u0661"],
    ids=["superscript two", "5000 digits", "20 digits", "negative", "hex", "two numbers", "arabic-indic one"],
)
def test_a_bad_content_length_gets_an_answer_and_no_traceback(length: str, caplog: pytest.LogCaptureFixture) -> None:
    server = MetricsServer(("127.0.0.1", 0), RenderedBytes(lambda: b"x 1.0\n"), SnapshotStore(), stale_after_seconds=5)
    server.start()
    try:
        with caplog.at_level(logging.DEBUG), socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            raw = length.encode("latin-1") if max(length) < "\u0100" else length.encode("utf-8")  # as a client sends it
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: " + raw + b"\r\n\r\n")
            head = sock.recv(64)
        assert head.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 413 ")), head
        assert requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).status_code == 200
    finally:
        server.stop()
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
