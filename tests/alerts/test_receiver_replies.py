"""What a receiver answers cannot take the sender over (issue 42 items 8, 9, 11): a reply is read only so
far, a redirect is never followed (a 301/302/303 would turn the POST into a GET that an Alertmanager
answers 200, the alerts lost) and is a delivery error of its own, and a FIFO put where ``ca_file`` was
never blocks the sender; fixing the file lets the alerts through."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.alerts.config import ReceiverHttp, RetryConfig
from gpumon.alerts.http_post import REDIRECT, SendResult, new_session, post_json
from gpumon.alerts.notification import Notification
from gpumon.alerts.notify import Receiver
from tests.alerts.helpers import TestReceiver
from tests.helpers import wait_for
from tests.pki import Pki
from tests.raw_server import RawServer

BODY = [{"labels": {"alertname": "GpuHot"}}]
HUGE_BYTES = 400 * 1024 * 1024


@pytest.fixture
def servers() -> Iterator[list[RawServer]]:
    made: list[RawServer] = []
    yield made
    for s in made:
        s.close()


def test_a_400_mib_reply_is_not_read_whole(servers: list[RawServer]) -> None:
    def huge(conn: socket.socket, method: str, path: str) -> None:
        conn.sendall(f"HTTP/1.1 500 Oops\r\nContent-Length: {HUGE_BYTES}\r\n\r\n".encode())
        block = b"x" * 65536
        while server.body_bytes_sent < HUGE_BYTES:
            conn.sendall(block)
            server.body_bytes_sent += len(block)

    server = RawServer(huge)
    servers.append(server)
    result = post_json(new_session(), server.url, BODY, 30.0, 0.0)
    assert result.outcome == "retry", "a 500 is retried"
    assert server.body_bytes_sent < 64 * 1024 * 1024, "the reply was read only so far, then the connection closed"


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_delivery_error_of_its_own_and_never_followed(servers: list[RawServer], code: int) -> None:
    def redirect(conn: socket.socket, method: str, path: str) -> None:
        status = f"{code} Moved" if path == "/api/v2/alerts" else "200 OK"
        conn.sendall(f"HTTP/1.1 {status}\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n".encode())

    server = RawServer(redirect)
    servers.append(server)
    result = post_json(new_session(), server.url + "/api/v2/alerts", BODY, 10.0, 0.0)
    assert (result.outcome, result.kind) == ("retry", REDIRECT), "the alerts are kept, the failure is a redirect"
    assert "/elsewhere" in result.detail, "the line says where it points"
    assert server.requests == [("POST", "/api/v2/alerts")], "the redirect was not followed"


def test_alerts_behind_a_redirect_are_kept_and_not_counted_sent(servers: list[RawServer]) -> None:
    def redirect(conn: socket.socket, method: str, path: str) -> None:
        status = "302 Found" if method == "POST" else "200 OK"
        conn.sendall(f"HTTP/1.1 {status}\r\nLocation: /other\r\nContent-Length: 0\r\n\r\n".encode())

    server = RawServer(redirect)
    servers.append(server)
    receiver = Receiver("alertmanager", server.url, RetryConfig(0.05, 0.2, 5.0), 100, 240.0)
    receiver.enqueue(Notification("fp", "firing", {"alertname": "GpuHot"}, {}, 1_800_000_000.0), 0.0)
    receiver.start()
    try:
        wait_for(lambda: receiver.stats.outcomes["failed"] >= 2, 10, what="two failed attempts")
        assert receiver.stats.outcomes["sent"] == 0
        assert receiver.queue_length() == 1, "the alert is kept for when the URL is fixed"
        assert all(method == "POST" for method, _ in server.requests)
    finally:
        receiver.stop(2)


def post_in_thread(url: str, http: ReceiverHttp) -> list[SendResult]:
    """post_json on a thread of its own; the list gets its result (the test never hangs on a blocked one)."""
    out: list[SendResult] = []
    threading.Thread(
        target=lambda: out.append(post_json(new_session(), url, BODY, 5.0, 0.0, http)), daemon=True
    ).start()
    return out


def test_a_fifo_as_ca_file_never_blocks_the_sender_and_fixing_it_recovers(tmp_path: Path, pki: Pki) -> None:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    receiver = TestReceiver().start(tls=tls)
    try:
        ca = tmp_path / "ca.pem"
        os.mkfifo(ca)
        http = ReceiverHttp(ca_file=str(ca))
        blocked = post_in_thread(receiver.url, http)
        wait_for(lambda: blocked, 15, what="an answer with a FIFO as ca_file")
        assert blocked[0].outcome == "retry"
        assert "ca_file" in blocked[0].detail
        ca.unlink()
        ca.write_bytes(pki.ca.read_bytes())
        fixed = post_in_thread(receiver.url, http)
        wait_for(lambda: fixed, 15, what="an answer with the CA fixed")
        assert fixed[0].outcome == "sent"
    finally:
        receiver.stop()


@pytest.mark.parametrize("option", ["cert_file", "key_file"])
def test_a_fifo_as_client_certificate_or_key_never_blocks_the_sender(tmp_path: Path, pki: Pki, option: str) -> None:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(pki.server_cert, pki.server_key)
    receiver = TestReceiver().start(tls=tls)
    try:
        fifo = tmp_path / "fifo.pem"
        os.mkfifo(fifo)
        files = {"cert_file": str(pki.client_cert), "key_file": str(pki.client_key), option: str(fifo)}
        answer = post_in_thread(receiver.url, ReceiverHttp(ca_file=str(pki.ca), **files))
        wait_for(lambda: answer, 15, what="an answer with a FIFO as " + option)
        assert answer[0].outcome == "retry"
    finally:
        receiver.stop()
