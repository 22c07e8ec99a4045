"""A slow request body cannot starve scrapes, basic auth on or off (issue 42 item 10): clients that send
headers with ``Content-Length: 60000`` and then trickle the body, reconnecting whenever they are closed,
hold every connection the server allows; a scraper still gets every one of its scrapes answered, because
a connection without a complete request is evicted for it and the body must arrive by the same deadline
as the headers."""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from gpumon.collect.store import SnapshotStore
from gpumon.http.limits import HttpLimits
from gpumon.http.server import MetricsServer
from gpumon.http.webconfig_watcher import WebConfigWatcher
from tests.helpers import RenderedBytes

ATTACKER = "127.0.0.2"
MAX_CONNECTIONS = 64
SLOW_HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n"


def trickle_bodies(port: int, count: int, stop: threading.Event) -> None:
    """``count`` connections that send SLOW_HEAD then one body byte each 0.2 s; a closed one is opened again."""
    socks: list[socket.socket | None] = [None] * count
    while not stop.is_set():
        for i in range(count):
            sock = socks[i]
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(ATTACKER, 0))
                    sock.sendall(SLOW_HEAD)
                    socks[i] = sock
                else:
                    sock.send(b"x")
            except OSError:
                if sock is not None:
                    sock.close()
                socks[i] = None
        stop.wait(0.2)
    for sock in socks:
        if sock is not None:
            sock.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("basic_auth", [False, True], ids=["no auth", "basic auth"])
def test_trickled_bodies_never_keep_a_scraper_out(tmp_path: Path, basic_auth: bool) -> None:
    web = None
    auth: tuple[str, str] | None = None
    if basic_auth:
        path = tmp_path / "web-config.yml"
        hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
        path.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
        web, auth = WebConfigWatcher(path), ("prometheus", "s3cret")
    server = MetricsServer(
        ("127.0.0.1", 0),
        RenderedBytes(lambda: b"gpumon_test_up 1.0\n"),
        SnapshotStore(),
        stale_after_seconds=5,
        web_config=web,
        limits=HttpLimits(max_connections=MAX_CONNECTIONS, header_timeout_seconds=10.0),
    )
    server.start()
    stop = threading.Event()
    attacker = threading.Thread(target=trickle_bodies, args=(server.port, 2 * MAX_CONNECTIONS, stop), daemon=True)
    try:
        attacker.start()
        stop.wait(2.0)  # the attack holds every connection before the first scrape
        statuses: list[int | str] = []
        for _ in range(30):
            try:
                response = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5, auth=auth)
                statuses.append(response.status_code)
            except requests.RequestException as exc:
                statuses.append(type(exc).__name__)
            stop.wait(0.2)
        assert statuses == [200] * 30, statuses
    finally:
        stop.set()
        attacker.join(10)
        server.stop()


def test_a_body_trickled_past_the_deadline_closes_the_connection() -> None:
    server = MetricsServer(
        ("127.0.0.1", 0),
        RenderedBytes(lambda: b"gpumon_test_up 1.0\n"),
        SnapshotStore(),
        stale_after_seconds=5,
        limits=HttpLimits(header_timeout_seconds=1.0),
    )
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.sendall(SLOW_HEAD)
            ended = False
            for _ in range(100):  # 20 s of trickling at most: the connection is closed long before
                try:
                    sock.send(b"x")
                    with contextlib.suppress(TimeoutError):
                        sock.settimeout(0.2)
                        if sock.recv(1) == b"":
                            ended = True
                            break
                except OSError:
                    ended = True
                    break
            assert ended, "a body trickled for 20 s kept its connection under a 1 s request deadline"
    finally:
        server.stop()
