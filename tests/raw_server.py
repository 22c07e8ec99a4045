"""A raw HTTP peer for tests: it answers as a test tells it, however wrong (huge, redirecting, trickling)."""

from __future__ import annotations

import contextlib
import socket
import threading


class RawServer:
    """A one-thread TCP server on 127.0.0.1 that reads a request's head and answers ``reply(path, method)``."""

    def __init__(self, reply: object) -> None:
        self.reply = reply
        self.requests: list[tuple[str, str]] = []
        self.body_bytes_sent = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                method, path = head.split(b" ", 2)[:2]
                self.requests.append((method.decode(), path.decode()))
                with contextlib.suppress(OSError):  # the client closed: what it read is counted
                    self.reply(conn, method.decode(), path.decode())  # type: ignore[operator]

    def close(self) -> None:
        self.sock.close()
