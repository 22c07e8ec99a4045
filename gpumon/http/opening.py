"""One client connection as the event loop tracks it, and how it opens: TLS or not, then streams.

``open_streams`` waits for the client's first bytes without a thread; on a TLS port, a
client that speaks plain HTTP gets a plain answer that says so, and a client certificate
whose SANs are not allowed is turned away after the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import TYPE_CHECKING

from gpumon.http.limits import HttpLimits

if TYPE_CHECKING:  # the web config's modules are loaded only where a web config is given
    from gpumon.http.webconfig_watcher import WebConfigWatcher

log = logging.getLogger(__name__)


class Connection:
    """One client connection, as the event loop tracks it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        """Kept: a closed socket's fileno() is -1, and the loop's selector is keyed by the number."""
        self.transport: asyncio.BaseTransport | None = None
        self.task: asyncio.Task[None] | None = None
        self.started = False
        """Whether its task has begun (``_serve_connection`` sets it): before that the loop holds
        nothing of the socket, and a task cancelled before it begins never runs its cleanup."""

    def abort(self) -> None:
        """End the connection from the event loop. One still opening (waiting for its first byte,
        or in its TLS handshake) is ended by its own task: cancelled, it unwinds what it gave the
        loop (readers, the handshake's transport) and only then closes the socket, so the number
        is never reused while the loop's selector still holds it. One whose task has not begun
        (a queued flood accepted in one go) is closed here: its task, cancelled, never will."""
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]
        elif self.task is not None and not self.task.done():
            self.task.cancel()
            if not self.started:
                self.sock.close()
        else:
            self.sock.close()

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """The end of the connection's own task: nothing of it is left in the loop's selector."""
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]
            return
        if self.sock.fileno() != -1:
            # a handshake's transport that still owns it closes it itself
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                loop.remove_reader(self.fd)
        self.sock.close()


async def open_streams(
    conn: Connection, client: str, web: WebConfigWatcher | None, limits: HttpLimits
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """TLS handshake (or not) and stream set-up; None when the connection is done with."""
    loop = asyncio.get_running_loop()
    context = web.ssl_context() if web is not None else None
    sock = conn.sock
    if context is not None and not await _speaks_tls(conn):
        return None
    reader = asyncio.StreamReader(limit=limits.max_header_bytes)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport, _ = await loop.connect_accepted_socket(
        lambda: protocol,
        sock,
        ssl=context,
        ssl_handshake_timeout=limits.header_timeout_seconds if context is not None else None,
    )
    conn.transport = transport
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    if context is not None and web is not None and not _client_allowed(writer, web, client):
        transport.abort()
        return None
    return reader, writer


async def _speaks_tls(conn: Connection) -> bool:
    """Wait for the client's first bytes on a TLS port: False when it hung up, or spoke plain HTTP
    (answered with a plain response that says to use https)."""
    from gpumon.http import tls  # here: a daemon without TLS does not load it

    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(conn.fd, wake)
    try:
        await readable
    finally:
        loop.remove_reader(conn.fd)
    first = conn.sock.recv(5, socket.MSG_PEEK)
    if not first:
        return False
    if first[0] != 0x16 and tls.looks_like_http(first):
        await _answer_plain_http(conn.sock)
        return False
    return True


def _client_allowed(writer: asyncio.StreamWriter, web: WebConfigWatcher, client: str) -> bool:
    """Whether the client's certificate has a SAN the web config allows (True when it allows any)."""
    from gpumon.http import tls

    tls_config = web.current().tls
    if tls_config is None or not tls_config.client_allowed_sans:
        return True
    ssl_object = writer.get_extra_info("ssl_object")
    peer = tls.peer_sans(ssl_object.getpeercert() or {}) if ssl_object is not None else set()
    if not peer & set(tls_config.client_allowed_sans):
        log.info("client %s rejected: certificate SANs %s not allowed", client, sorted(peer))
        return False
    return True


async def _answer_plain_http(sock: socket.socket) -> None:
    from gpumon.http import tls

    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, tls.HTTP_ON_HTTPS_RESPONSE)
    sock.shutdown(socket.SHUT_WR)
    drained = 0
    async with asyncio.timeout(1.0):  # read what the client sent, so closing does not reset first
        while drained < 65536:
            chunk = await loop.sock_recv(sock, 4096)
            if not chunk:
                break
            drained += len(chunk)
