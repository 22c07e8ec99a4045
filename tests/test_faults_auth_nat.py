"""A client behind the same address as a password-guesser (one NAT, one proxy) gets in at its second
try, not 429 for as long as the guessing lasts (issue 36, item 9)."""

from __future__ import annotations

import base64
import contextlib
import secrets
import socket
import threading
import time
from pathlib import Path

import bcrypt
import pytest
import yaml

from gpumon.collect.store import SnapshotStore
from gpumon.http.server import MetricsServer
from gpumon.http.webconfig_watcher import WebConfigWatcher
from tests.helpers import RenderedBytes

pytestmark = pytest.mark.faults

SHARED = "127.0.0.3"
"""The one address the guesser and the honest client both come from."""


def _status(port: int, user: str, password: str) -> int:
    authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(SHARED, 0)) as sock:
        sock.sendall(
            f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n".encode()
        )
        head = sock.recv(64)
    return int(head.split(b" ", 2)[1])


@pytest.mark.timeout(120)
def test_an_honest_client_behind_a_guessers_address_gets_in_at_its_second_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_checkpw = bcrypt.checkpw

    def steady_checkpw(password: bytes, hashed: bytes) -> bool:  # bcrypt at a known, steady cost
        time.sleep(0.05)
        return real_checkpw(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", steady_checkpw)
    path = tmp_path / "web-config.yml"
    path.write_text(
        yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()}})
    )
    server = MetricsServer(
        ("127.0.0.1", 0),
        RenderedBytes(lambda: b"x 1.0\n"),
        SnapshotStore(),
        stale_after_seconds=5,
        web_config=WebConfigWatcher(path),
    )
    server.start()
    stop = threading.Event()

    def guess() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                _status(server.port, "prometheus", secrets.token_hex(8))

    guessers = [threading.Thread(target=guess, daemon=True) for _ in range(20)]
    honest: list[int] = []
    try:
        for thread in guessers:
            thread.start()
        time.sleep(1.0)  # the guessing is on: the address has its checks queued all the time
        for _ in range(4):  # a scraper's tries, a little apart
            honest.append(_status(server.port, "prometheus", "s3cret"))
            if honest[-1] == 200:
                break
            time.sleep(0.2)
    finally:
        stop.set()
        for thread in guessers:
            thread.join(30)
        server.stop()
    assert 200 in honest[:2], honest
