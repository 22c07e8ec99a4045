"""gpumon's endpoint under abuse: idle sockets, slowloris clients and a password flood must not
keep a normal scraper out, and the daemon's threads and open files stay bounded.

No timing assertions beyond generous timeouts: benchmarks/bench_http_abuse.py measures latency."""

from __future__ import annotations

import base64
import contextlib
import os
import resource
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
import yaml

from gpumon.collect.store import SnapshotStore
from gpumon.http.basic_auth import BcryptPool
from gpumon.http.server import MetricsServer
from gpumon.http.webconfig_watcher import WebConfigWatcher
from tests.helpers import DaemonProcess, RenderedBytes, wait_for

ATTACKER = "127.0.0.2"
"""Loopback has the whole 127/8: attackers come from here, the normal client from 127.0.0.1."""


def _proc_status(pid: int) -> tuple[int, int]:
    """(threads, open file descriptors) of process ``pid``."""
    threads = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Threads:")
    )
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def _open_files_limits(pid: int) -> tuple[str, str]:
    """(soft, hard) RLIMIT_NOFILE of process ``pid``, as /proc writes them (a number or "unlimited")."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no open-files line in /proc/PID/limits")


@contextlib.contextmanager
def _open_files_soft_limit(limit: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(limit, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _connect_many(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        with contextlib.suppress(OSError):  # a full backlog: the attack got as far as it could
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(ATTACKER, 0)))
    return sockets


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_normal_scrape_never_fails_under_idle_sockets_and_slowloris(tmp_path: Path) -> None:
    # The daemon starts with the usual soft limit of 1,024 open files (it may raise it itself).
    with _open_files_soft_limit(1024):
        gpumon = DaemonProcess(["--backend", "fake", "--fake-gpus", "2"], tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    stop = threading.Event()
    idle: list[socket.socket] = []
    slow: list[socket.socket] = []
    try:
        gpumon.wait_ready()
        soft_limit, hard_limit = _open_files_limits(gpumon.proc.pid)
        assert soft_limit == hard_limit, "the soft limit is raised to the hard one at start"
        idle = _connect_many(gpumon.port, 1030)
        slow = _connect_many(gpumon.port, 200)
        for sock in slow:
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")

        def trickle() -> None:  # one more header byte per connection every second
            while not stop.wait(1.0):
                for sock in slow:
                    with contextlib.suppress(OSError):
                        sock.send(b"X")

        threading.Thread(target=trickle, daemon=True).start()
        statuses, worst = [], (0, 0)
        for _ in range(16):
            try:
                statuses.append(requests.get(gpumon.url + "/metrics", timeout=10).status_code)
            except requests.RequestException as exc:
                statuses.append(type(exc).__name__)  # type: ignore[arg-type]
            threads, fds = _proc_status(gpumon.proc.pid)
            worst = (max(worst[0], threads), max(worst[1], fds))
            time.sleep(0.3)
        assert statuses == [200] * 16, statuses
        assert worst[0] <= 40, f"{worst[0]} threads"
        assert worst[1] <= 1024 + 64, f"{worst[1]} open files"
        assert "Traceback" not in gpumon.log()
    finally:
        stop.set()
        for sock in idle + slow:
            sock.close()
        gpumon.stop()


# --- basic auth under a password flood ------------------------------------------------------------------


def _status(port: int, authorization: str, source: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0)) as sock:
        sock.sendall(
            f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\nConnection: close\r\n\r\n".encode()
        )
        head = sock.recv(64)
    return int(head.split(b" ", 2)[1])


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def serve_with_web_config(watcher: WebConfigWatcher) -> MetricsServer:
    return MetricsServer(
        ("127.0.0.1", 0),
        RenderedBytes(lambda: b"gpumon_test_up 1.0\n"),
        SnapshotStore(),
        stale_after_seconds=5,
        web_config=watcher,
    )


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_correct_password_does_not_wait_behind_fifty_wrong_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[bytes] = []
    """The password of each bcrypt check, in the order the checks started."""
    real_checkpw = bcrypt.checkpw

    def slow_checkpw(password: bytes, hashed: bytes) -> bool:  # bcrypt at a known, steady cost
        started.append(password)
        time.sleep(0.05)
        return real_checkpw(password, hashed)

    queued_after: list[int] = []
    """How many checks had started when the correct password's check was queued."""
    real_check = BcryptPool.check

    def recorded_check(pool: BcryptPool, password: bytes, hashed: bytes, client: str) -> Any:
        if password == b"s3cret":
            queued_after.append(len(started))
        return real_check(pool, password, hashed, client)

    monkeypatch.setattr(bcrypt, "checkpw", slow_checkpw)
    monkeypatch.setattr(BcryptPool, "check", recorded_check)
    path = tmp_path / "web-config.yml"
    path.write_text(
        yaml.safe_dump({"basic_auth_users": {"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()}})
    )
    server = serve_with_web_config(WebConfigWatcher(path))
    server.start()
    stop = threading.Event()
    attacker_statuses: list[int] = []

    def attack() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                attacker_statuses.append(_status(server.port, _basic("prometheus", secrets.token_hex(8)), ATTACKER))
            time.sleep(0.02)

    attackers = [threading.Thread(target=attack, daemon=True) for _ in range(50)]
    try:
        for thread in attackers:
            thread.start()
        wait_for(lambda: len(started) >= 10, 30, 0.02, "the flood on: bcrypt busy with wrong passwords")
        assert _status(server.port, _basic("prometheus", "s3cret"), "127.0.0.1") == 200
    finally:
        stop.set()
        for thread in attackers:
            thread.join(30)
        server.stop()
    assert set(attacker_statuses) <= {401, 429}  # 429: that address has too many checks waiting already
    # Fair: once queued, the correct client's check waits for at most the checks already running (2
    # workers) and the attacker's two queued before its address became a suspect. Counted from the
    # queueing, not from the client's send: on a loaded box 50 threads delay the request itself.
    assert len(queued_after) == 1 and b"s3cret" in started
    checks_while_waiting = started.index(b"s3cret") - queued_after[0]
    assert checks_while_waiting <= 4, f"{checks_while_waiting} bcrypt checks started while the correct one waited"
