"""Issue 42 item 10, adversarial: 1,000 connections send ``GET /metrics`` headers with
``Content-Length: 60000`` and trickle the body (a byte per connection a second, reconnecting when
closed) against ``gpumon run --backend fake`` with an open-files limit of 1,024 (the kernel default; the
daemon keeps 128 for itself, so 896 connections); meanwhile a scraper scrapes /metrics 30 times, 0.5 s
apart. Prints the scrapes answered 200, basic auth off and on.

    PYTHONPATH=$PWD python scripts/adversary_slow_bodies.py
"""

from __future__ import annotations

import contextlib
import resource
import socket
import sys
import tempfile
import threading
from pathlib import Path

import bcrypt
import requests
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import DaemonProcess, wait_for

ATTACKER = "127.0.0.2"
HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n"
CONNECTIONS = 1000


def attack(port: int, stop: threading.Event, opened: list[int]) -> None:
    socks: list[socket.socket | None] = [None] * CONNECTIONS
    while not stop.is_set():
        for i in range(CONNECTIONS):
            sock = socks[i]
            try:
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=1, source_address=(ATTACKER, 0))
                    sock.sendall(HEAD)
                    socks[i] = sock
                    opened[0] += 1
                else:
                    sock.send(b"x")
            except OSError:
                if sock is not None:
                    sock.close()
                socks[i] = None
        stop.wait(1.0)
    for sock in socks:
        if sock is not None:
            sock.close()


def run(basic_auth: bool, tmp: Path) -> None:
    args = ["--backend", "fake", "--fake-gpus", "2"]
    auth = None
    if basic_auth:
        hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10)).decode()
        (tmp / "web.yml").write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": hashed}}))
        args += ["--web-config-file", str(tmp / "web.yml")]
        auth = ("prometheus", "s3cret")
    daemon = DaemonProcess(args, tmp)
    resource.prlimit(daemon.proc.pid, resource.RLIMIT_NOFILE, (1024, 1024))  # before its server starts
    stop = threading.Event()
    opened = [0]
    try:
        wait_for(lambda: daemon.get("/metrics", auth=auth).status_code == 200, 60, what="a first scrape")
        attacker = threading.Thread(target=attack, args=(daemon.port, stop, opened))
        attacker.start()
        stop.wait(5.0)
        statuses: list[object] = []
        for _ in range(30):
            try:
                statuses.append(requests.get(daemon.url + "/metrics", timeout=10, auth=auth).status_code)
            except requests.RequestException as exc:
                statuses.append(type(exc).__name__)
            stop.wait(0.5)
        print(
            f"basic auth {'on ' if basic_auth else 'off'}: {statuses.count(200)}/30 scrapes answered 200 "
            f"({CONNECTIONS} trickling connections, {opened[0]} opened in all); others: "
            f"{[s for s in statuses if s != 200][:5]}"
        )
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            attacker.join(30)
        daemon.stop()


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    for auth_on in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            run(auth_on, Path(tmp))
