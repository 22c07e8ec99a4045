"""The HTTP server's connections: one event loop that accepts, handshakes, reads and writes.

One event-loop thread owns every connection: it accepts, does the TLS handshake and
reads request headers without blocking anything else, so idle, half-sent (slowloris)
and slow-handshake connections cost a file descriptor and a few kilobytes, never a
thread. Complete requests are answered (``_respond``, which a subclass gives) with a
small, fixed pool of worker threads at hand; bcrypt runs in the web config's own pool.
Limits (``HttpLimits``): a header timeout for a new connection, an idle timeout between
keep-alive requests, a header size limit, and a connection limit. At the limit the
connection that has waited longest without a request is closed to make room, so a new
scraper always gets in; only when every connection is busy with a request is the new
one closed at once.

Why not a server library: cheroot (CherryPy's server, the one with a thread pool and TLS)
does the TLS handshake on its accept path, so one client that stalls its handshake
freezes every other connection (cherrypy/cheroot#748, open for cheroot 10), and it reads
request headers in its worker threads, so 200 slowloris clients hold every worker;
waitress reads headers without threads but has no TLS; the ASGI servers bring a
framework-sized dependency and a fixed certificate, where gpumon re-reads its web config
and serves a renewed certificate to the next connection. asyncio's streams do the
non-blocking TLS and buffering; ``gpumon.http.messages`` adds the HTTP/1.1 subset
a scraper needs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import errno
import logging
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpumon import __version__
from gpumon.http.limits import HttpLimits, bind_listener, raise_open_files_limit
from gpumon.http.messages import REASONS, TEXT_PLAIN, BadRequest, Request, parse_head, wants_close
from gpumon.util.repeat_log import RepeatLog

if TYPE_CHECKING:  # the web config's modules are loaded only where a web config is given
    from gpumon.http.webconfig_watcher import WebConfigWatcher

log = logging.getLogger("gpumon.http.server")
"""The logger name these log lines have always carried (they lived in server.py)."""

_MAX_DISCARDED_BODY_BYTES = 65536
_DISCONNECTS = (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError, EOFError)
_ACCEPT_RETRY_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
"""accept() errors that mean this process is short of something: an idle connection is closed to make room."""
_STALLED_LOOP_SECONDS = 5.0
"""The event loop has not answered a probe for this long: the server is not answering."""
_FAILING_ACCEPT_SECONDS = 10.0
"""Every accept() has failed for this long: the server is not answering."""
_COALESCE_BYTES = 1 << 20
"""Chunks of a response smaller than this go out joined with their neighbours; larger ones are
handed to the transport as they are, not copied into a joined body first. Fewer writes are
fewer sends, and each send lets go of the GIL, which a busy thread may then hold for up to a
switch interval (5 ms)."""

Body = bytes | Sequence[bytes]
"""A response body: bytes, or chunks sent one after the other."""


def coalesced(chunks: Sequence[bytes]) -> list[bytes]:
    """``chunks`` with each run of small ones joined (the same bytes, in order; all of them joined
    when they come to less than ``_COALESCE_BYTES``)."""
    if sum(len(c) for c in chunks) < _COALESCE_BYTES:
        return [b"".join(chunks)]
    out: list[bytes] = []
    small: list[bytes] = []
    for chunk in chunks:
        if len(chunk) >= _COALESCE_BYTES:
            if small:
                out.append(b"".join(small))
                small = []
            out.append(chunk)
        elif chunk:
            small.append(chunk)
    if small:
        out.append(b"".join(small))
    return out


class _Conn:
    """One client connection, as the event loop tracks it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        """Kept: a closed socket's fileno() is -1, and the loop's selector is keyed by the number."""
        self.transport: asyncio.BaseTransport | None = None
        self.task: asyncio.Task[None] | None = None

    def abort(self) -> None:
        """End the connection from the event loop. One still opening (waiting for its first byte,
        or in its TLS handshake) is ended by its own task: cancelled, it unwinds what it gave the
        loop (readers, the handshake's transport) and only then closes the socket, so the number
        is never reused while the loop's selector still holds it."""
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]
        elif self.task is not None and not self.task.done():
            self.task.cancel()
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


class HttpConnectionServer:
    """Owns the listening socket, the event loop and every connection; ``_respond`` answers a request.

    ``web_config``: TLS, extra headers (and, for the subclass, basic auth and rate limit) from
    a web-config.yml (None: plain HTTP). The listening socket is bound in the constructor
    (OSError when it cannot be).
    """

    def __init__(self, address: tuple[str, int], *, web_config: WebConfigWatcher | None, limits: HttpLimits) -> None:
        self._web = web_config
        self._limits = limits
        self._listener = bind_listener(address, limits.backlog)
        self._server_header = f"gpumon/{__version__}"
        self._repeat = RepeatLog(log)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._workers: concurrent.futures.ThreadPoolExecutor | None = None
        self._conns: dict[int, _Conn] = {}
        self._waiting: OrderedDict[int, _Conn] = OrderedDict()
        """Connections waiting for a request (no request in hand), oldest first."""
        self._max_connections = limits.max_connections
        self.shed_connections_total = 0
        """Connections closed to stay under the connection limit (idle ones evicted or new ones refused)."""
        self._probe_sent_at: float | None = None
        """time.monotonic when serving_problem() asked the event loop to answer and it has not yet;
        None while no probe is waiting. The loop is probed only when asked (no timer wakes it)."""
        self._accept_task: asyncio.Task[None] | None = None
        self._accept_failing_since: float | None = None
        """time.monotonic of the first of the accept() failures in a row; None while accepts succeed."""

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def serving_problem(self) -> str | None:
        """Why the server cannot answer a new connection now (one line), or None while it can: its
        thread has ended, it no longer accepts, every accept has failed for a while, or its event
        loop has not turned for a while (something blocks it). The daemon feeds systemd's watchdog
        only while this is None."""
        if self._thread is None:
            return "the HTTP server has not started"
        if not self._thread.is_alive():
            return "the HTTP server's thread has ended"
        now = time.monotonic()
        sent = self._probe_sent_at
        if sent is not None and now - sent > _STALLED_LOOP_SECONDS:
            return f"the HTTP server's event loop has not run for {now - sent:.0f} s"
        if sent is None and self._loop is not None:
            self._probe_sent_at = now  # answered (set back to None) when the loop next turns
            try:
                self._loop.call_soon_threadsafe(self._probe_answered)
            except RuntimeError:  # the loop has closed
                return "the HTTP server's event loop has ended"
        if self._accept_task is not None and self._accept_task.done():
            return "the HTTP server no longer accepts connections"
        since = self._accept_failing_since
        if since is not None and now - since > _FAILING_ACCEPT_SECONDS:
            return f"every accept() has failed for {now - since:.0f} s"
        return None

    def _probe_answered(self) -> None:
        self._probe_sent_at = None

    def start(self) -> None:
        nofile = raise_open_files_limit()
        self._max_connections = max(16, min(self._limits.max_connections, nofile - 128))
        self._workers = concurrent.futures.ThreadPoolExecutor(self._limits.workers, thread_name_prefix="gpumon-http")
        self._thread = threading.Thread(target=self._run, name="gpumon-http", daemon=True)
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and self._thread is not None:
            loop.call_soon_threadsafe(stopping.set)
            self._thread.join(5)
        self._listener.close()
        if self._workers is not None:
            self._workers.shutdown(wait=False, cancel_futures=True)

    # --- the event loop ---------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("the HTTP server stopped")

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self._loop_exception)
        self._loop = loop
        self._stopping = asyncio.Event()
        self._started.set()
        accept = asyncio.create_task(self._accept_loop())
        self._accept_task = accept
        while True:
            try:
                async with asyncio.timeout(30.0):
                    await self._stopping.wait()
                break
            except TimeoutError:
                self._repeat.flush()
        accept.cancel()
        for conn in list(self._conns.values()):
            conn.abort()
            if conn.task is not None:
                conn.task.cancel()
        await asyncio.gather(accept, *(c.task for c in list(self._conns.values()) if c.task), return_exceptions=True)

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, _DISCONNECTS) or (isinstance(exc, OSError) and exc.errno in (errno.EBADF, errno.ENOTCONN)):
            # EBADF: a connection evicted (its socket closed) before its transport had started
            # reading; the loop's pending add_reader then meets the closed descriptor. Nothing is lost.
            log.debug("connection error: %s", context.get("message"))
            return
        self._repeat(
            logging.ERROR, "HTTP server error", "HTTP server: %s", context.get("message"), exc_info=exc is not None
        )

    async def _accept_loop(self) -> None:
        """Accept for as long as the server runs: no accept() error ends it (a client that reset
        before it was accepted, ECONNABORTED; a protocol error, EPROTO; a firewall, EPERM; too many
        open files, EMFILE). Each kind is logged once, then how often it repeated."""
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            try:
                sock, addr = await loop.sock_accept(self._listener)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                if self._accept_failing_since is None:
                    self._accept_failing_since = time.monotonic()
                if isinstance(exc, OSError):
                    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                    self._repeat(
                        logging.WARNING,
                        f"cannot accept a connection ({name})",
                        "cannot accept a connection: %s (%s)",
                        exc.strerror or exc,
                        name,
                    )
                else:
                    self._repeat(logging.ERROR, "accept failed", "cannot accept a connection: %r", exc, exc_info=True)
                if isinstance(exc, OSError) and exc.errno in _ACCEPT_RETRY_ERRNOS and self._evict_one():
                    continue
                await asyncio.sleep(min(0.05 * failures, 0.5))  # a failure that repeats does not spin
                continue
            failures = 0
            self._accept_failing_since = None
            if len(self._conns) >= self._max_connections and self._evict_one():
                await asyncio.sleep(0)  # let the evicted connection's socket close before the next accept
            elif len(self._conns) >= self._max_connections:
                self.shed_connections_total += 1
                self._repeat(
                    logging.WARNING,
                    "connection limit reached",
                    "connection limit of %d reached with every connection busy; closing new connections",
                    self._max_connections,
                )
                sock.close()
                continue
            conn = _Conn(sock)
            self._conns[id(conn)] = conn
            self._waiting[id(conn)] = conn
            conn.task = asyncio.create_task(self._serve_connection(conn, str(addr[0])))

    def _evict_one(self) -> bool:
        if not self._waiting:
            return False
        key, conn = self._waiting.popitem(last=False)
        self._conns.pop(key, None)
        self.shed_connections_total += 1
        conn.abort()
        if conn.task is not None:
            conn.task.cancel()
        return True

    def _set_waiting(self, conn: _Conn, waiting: bool) -> None:
        if waiting:
            self._waiting[id(conn)] = conn
            self._waiting.move_to_end(id(conn))
        else:
            self._waiting.pop(id(conn), None)

    async def _serve_connection(self, conn: _Conn, client: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.header_timeout_seconds
        try:
            async with asyncio.timeout_at(deadline):
                streams = await self._open(conn, client)
            if streams is None:
                return
            reader, writer = streams
            while await self._one_request(conn, reader, writer, client, deadline):
                deadline = loop.time() + self._limits.idle_timeout_seconds
            await self._close(writer)
        except asyncio.CancelledError:
            pass
        except (*_DISCONNECTS, OSError) as exc:
            log.debug("connection from %s ended: %r", client, exc)
        except Exception:
            self._repeat(
                logging.ERROR, "HTTP connection failed", "HTTP connection from %s failed", client, exc_info=True
            )
        finally:
            self._conns.pop(id(conn), None)
            self._waiting.pop(id(conn), None)
            conn.close(loop)

    async def _open(self, conn: _Conn, client: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """TLS handshake (or not) and stream set-up; None when the connection is done with."""
        loop = asyncio.get_running_loop()
        web = self._web
        context = web.ssl_context() if web is not None else None
        sock = conn.sock
        if context is not None:
            from gpumon.http import tls  # here: a daemon without TLS does not load it

            readable: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                if not readable.done():
                    readable.set_result(None)

            loop.add_reader(conn.fd, wake)
            try:
                await readable
            finally:
                loop.remove_reader(conn.fd)
            first = sock.recv(5, socket.MSG_PEEK)
            if not first:
                return None
            if first[0] != 0x16 and tls.looks_like_http(first):
                await self._answer_plain_http(sock)
                return None
        reader = asyncio.StreamReader(limit=self._limits.max_header_bytes)
        protocol = asyncio.StreamReaderProtocol(reader)
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol,
            sock,
            ssl=context,
            ssl_handshake_timeout=self._limits.header_timeout_seconds if context is not None else None,
        )
        conn.transport = transport
        writer = asyncio.StreamWriter(transport, protocol, reader, loop)
        if context is not None and web is not None:
            tls_config = web.current().tls
            if tls_config is not None and tls_config.client_allowed_sans:
                ssl_object = writer.get_extra_info("ssl_object")
                peer = tls.peer_sans(ssl_object.getpeercert() or {}) if ssl_object is not None else set()
                if not peer & set(tls_config.client_allowed_sans):
                    log.info("client %s rejected: certificate SANs %s not allowed", client, sorted(peer))
                    transport.abort()
                    return None
        return reader, writer

    async def _answer_plain_http(self, sock: socket.socket) -> None:
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

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        writer.close()
        try:
            async with asyncio.timeout(1.0):
                await writer.wait_closed()
        except (*_DISCONNECTS, OSError):
            pass

    async def _one_request(
        self,
        conn: _Conn,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: str,
        deadline: float,
    ) -> bool:
        """Read (headers by ``deadline``) and answer one request; True to keep the connection for another."""
        self._set_waiting(conn, True)
        try:
            async with asyncio.timeout_at(deadline):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            log.debug("client %s sent no complete request in time; closing", client)
            return False
        except asyncio.LimitOverrunError:
            await self._send(
                writer, None, 431, {"Content-Type": TEXT_PLAIN}, b"request headers too large\n", close=True
            )
            return False
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                log.debug("client %s hung up in the middle of its request headers", client)
            return False
        self._set_waiting(conn, False)
        try:
            request = parse_head(head, client)
        except BadRequest as exc:
            await self._send(writer, None, exc.status, {"Content-Type": TEXT_PLAIN}, f"{exc}\n".encode(), close=True)
            return False
        close = wants_close(request)
        if "transfer-encoding" in request.headers:
            await self._send(writer, request, 411, {"Content-Type": TEXT_PLAIN}, b"send a Content-Length\n", close=True)
            return False
        length_text = request.headers.get("content-length", "0")
        if not length_text or length_text.strip("0123456789"):  # "²" is a digit to str.isdigit, not to int()
            await self._send(
                writer, request, 400, {"Content-Type": TEXT_PLAIN}, b"malformed Content-Length\n", close=True
            )
            return False
        if len(length_text.lstrip("0")) > 9 or int(length_text) > _MAX_DISCARDED_BODY_BYTES:
            await self._send(
                writer, request, 413, {"Content-Type": TEXT_PLAIN}, b"request body too large\n", close=True
            )
            return False
        if int(length_text):
            async with asyncio.timeout(self._limits.header_timeout_seconds):
                await reader.readexactly(int(length_text))
        status, headers, body = await self._respond(request)
        await self._send(writer, request, status, headers, body, close=close)
        return not close

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        request: Request | None,
        status: int,
        headers: Mapping[str, str],
        body: Body,
        *,
        close: bool,
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}",
            f"Server: {self._server_header}",
            f"Date: {email.utils.formatdate(usegmt=True)}",
        ]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if self._web is not None:
            lines += [f"{k}: {v}" for k, v in self._web.extra_headers().items()]
        chunks = [body] if isinstance(body, bytes) else body
        lines.append(f"Content-Length: {sum(len(c) for c in chunks)}")
        if close:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if request is not None and request.method == "HEAD":
            chunks = []
        for chunk in coalesced([head, *chunks]):
            writer.write(chunk)
        async with asyncio.timeout(self._limits.write_timeout_seconds):
            await writer.drain()

    async def _respond(self, request: Request) -> tuple[int, dict[str, str], Body]:
        """(status, headers, body) for a complete request; the subclass says what a request gets."""
        raise NotImplementedError
