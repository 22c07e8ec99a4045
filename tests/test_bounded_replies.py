"""Every reply gpumon reads is read only so far (issue 42 item 8): whatever answers on the daemon's
port (another user's process, while the daemon is down) cannot make ``gpumon alerts`` or
``gpumon health`` read gigabytes; they say the answer is not the daemon's."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from gpumon.commands.health_daemon import DaemonSilent, ask_daemon
from tests.helpers import run_cli
from tests.raw_server import RawServer

HUGE_BYTES = 400 * 1024 * 1024


class HugeJsonServer(RawServer):
    """Answers every request 200 with a JSON list of 400 MiB; counts the bytes it got out."""

    def __init__(self) -> None:
        self.sent = 0
        super().__init__(self._huge_json)

    def _huge_json(self, conn: socket.socket, method: str, path: str) -> None:
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {HUGE_BYTES}\r\n\r\n[".encode())
        self.sent = 1
        block = b"1," * 32768
        while self.sent < HUGE_BYTES:
            conn.sendall(block)
            self.sent += len(block)


@pytest.fixture
def huge() -> Iterator[HugeJsonServer]:
    server = HugeJsonServer()
    yield server
    server.close()


def test_gpumon_alerts_does_not_read_a_huge_answer_whole(huge: HugeJsonServer) -> None:
    result = run_cli("alerts", "--url", huge.url, "--timeout", "30")
    assert result.returncode == 1
    assert "did not answer JSON" in result.stderr
    assert huge.sent < 128 * 1024 * 1024, "the answer was read only so far"


def test_gpumon_health_does_not_read_a_huge_answer_whole(huge: HugeJsonServer) -> None:
    with pytest.raises(DaemonSilent):
        ask_daemon(huge.url + "/api/health", timeout_seconds=30)
    assert huge.sent < 128 * 1024 * 1024, "the answer was read only so far"
