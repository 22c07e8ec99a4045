"""The HTTP server: /metrics, /healthz, /ready and routes other parts add (/api/alerts).

A scrape only reads the SnapshotStore, so it answers even while a poll hangs in NVML.

One event-loop thread owns every connection: it accepts, does the TLS handshake and
reads request headers without blocking anything else, so idle, half-sent (slowloris)
and slow-handshake connections cost a file descriptor and a few kilobytes, never a
thread. Complete requests are answered from a small, fixed pool of worker threads
(rendering /metrics, the JSON routes); bcrypt runs in the web config's own pool.
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
non-blocking TLS and buffering; this module adds the HTTP/1.1 subset a scraper needs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import errno
import gzip
import json
import logging
import resource
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import Metric

from gpumon import __version__
from gpumon.exporter import openmetrics
from gpumon.exporter.text import CONTENT_TYPE
from gpumon.exporter.webconfig import HTTP_ON_HTTPS_RESPONSE, WebConfigWatcher, looks_like_http, peer_sans
from gpumon.store import SnapshotStore

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]
Route = Callable[[], Response]

INDEX_HTML = b"""<!doctype html><html><head><title>gpumon</title></head><body>
<h1>gpumon</h1><ul>
<li><a href="/metrics">/metrics</a> Prometheus metrics</li>
<li><a href="/healthz">/healthz</a> process alive</li>
<li><a href="/ready">/ready</a> a fresh snapshot exists</li>
<li><a href="/api/snapshot">/api/snapshot</a> the latest snapshot as JSON</li>
<li><a href="/api/alerts">/api/alerts</a> active alerts</li>
</ul></body></html>"""

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_TEXT = "text/plain; charset=utf-8"
_MAX_DISCARDED_BODY_BYTES = 65536
_DISCONNECTS = (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError, EOFError)
_ACCEPT_RETRY_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass(frozen=True)
class HttpLimits:
    """What one client can hold of the server. Defaults fit a Prometheus scraping every 15–60 s."""

    workers: int = 4
    """Threads that answer complete requests (render /metrics, the JSON routes)."""
    max_connections: int = 1024
    """Open client connections at most; lowered to fit the open-files limit."""
    header_timeout_seconds: float = 10.0
    """A new connection must finish its TLS handshake and first request headers within this."""
    idle_timeout_seconds: float = 65.0
    """A kept-alive connection must send its next request's headers within this (a 60 s scrape fits)."""
    write_timeout_seconds: float = 30.0
    """A response must be taken by the client within this."""
    max_header_bytes: int = 16384
    """Request line and headers together; more gets 431."""
    backlog: int = 1024
    """Listen backlog (the kernel caps it at net.core.somaxconn)."""


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (as Go programs do at start); return the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1048576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a seccomp filter (systemd @resources) or a container
            log.debug("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return int(soft)


def bind_listener(address: tuple[str, int], backlog: int) -> socket.socket:
    """A listening socket for ``(host, port)``: IPv4 or IPv6 literal or name; ``::`` also takes IPv4."""
    host, port = address
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _type, _proto, _name, sockaddr = infos[0]
    dual = family == socket.AF_INET6 and host == "::" and socket.has_dualstack_ipv6()
    sock = socket.create_server(sockaddr[:2], family=family, backlog=backlog, dualstack_ipv6=dual)
    sock.setblocking(False)
    return sock


class RepeatLog:
    """Logs the first occurrence of each kind of problem, then how often it repeated, once per period."""

    def __init__(
        self, logger: logging.Logger, period_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self._period = period_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}
        """kind -> (when last logged, occurrences since)."""

    def __call__(self, level: int, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        now = self._clock()
        with self._lock:
            last = self._seen.get(kind)
            if last is None:
                self._seen[kind] = (now, 0)
            elif now - last[0] < self._period:
                self._seen[kind] = (last[0], last[1] + 1)
                return
            else:
                self._seen[kind] = (now, 0)
        if last is not None and last[1]:
            message += " (and %d more times in the last %ds)"
            args = (*args, last[1], int(now - last[0]))
        self._log.log(level, message, *args, exc_info=exc_info)

    def flush(self) -> None:
        """Log how often each kind repeated since it was last logged, once its period is over."""
        now = self._clock()
        with self._lock:
            due = [(k, n) for k, (when, n) in self._seen.items() if n and now - when >= self._period]
            for kind, _count in due:
                self._seen[kind] = (now, 0)
        for kind, count in due:
            self._log.warning("%s: repeated %d more times in the last %ds", kind, count, int(self._period))


def accepts_gzip(accept_encoding: str | None) -> bool:
    """True when ``Accept-Encoding`` lets gzip in (names case-insensitive, ``q=0`` refuses)."""
    if not accept_encoding:
        return False
    star: float | None = None
    for coding, q in _weighted(accept_encoding):
        if coding == "gzip":
            return q > 0
        if coding == "*":
            star = q
    return star is not None and star > 0


def wants_openmetrics(accept: str | None) -> bool:
    """True when ``Accept`` prefers OpenMetrics (1.0.0 or 0.0.1) at least as much as the classic text."""
    if not accept:
        return False
    best_om, best_text = 0.0, 0.0
    for media_range, q, params in _media_ranges(accept):
        if media_range == "application/openmetrics-text" and params.get("version", "1.0.0") in ("1.0.0", "0.0.1"):
            best_om = max(best_om, q)
        elif media_range in ("text/plain", "text/*", "*/*"):
            best_text = max(best_text, q)
    return best_om > 0 and best_om >= best_text


def _weighted(header: str) -> Iterable[tuple[str, float]]:
    for media_range, q, _params in _media_ranges(header):
        yield media_range, q


def _media_ranges(header: str) -> Iterable[tuple[str, float, dict[str, str]]]:
    for part in header.split(","):
        name, *raw_params = (p.strip() for p in part.split(";"))
        if not name:
            continue
        params: dict[str, str] = {}
        for p in raw_params:
            key, _, value = p.partition("=")
            params[key.strip().lower()] = value.strip().strip('"')
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0
        yield name.lower(), q if 0 <= q <= 1 else 0.0, params


@dataclass
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    """Lower-case names; repeated headers joined with ", "."""
    client: str

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


class _BadRequest(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def _parse_head(head: bytes, client: str) -> _Request:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise _BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise _BadRequest(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        if key == "host" and key in headers:
            raise _BadRequest(400, "more than one Host header")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if version == "HTTP/1.1" and "host" not in headers:
        raise _BadRequest(400, "missing Host header")
    return _Request(method, target, version, headers, client)


class _Conn:
    """One client connection, as the event loop tracks it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.transport: asyncio.BaseTransport | None = None
        self.task: asyncio.Task[None] | None = None

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]
        else:
            self.sock.close()


class MetricsServer:
    """Serves ``render()`` (Prometheus text 0.0.4, or OpenMetrics when asked) and the routes.

    ``web_config``: TLS, basic auth, extra headers and rate limit from a web-config.yml
    (None: plain HTTP, no auth). ``collect``: the same metrics as prometheus_client
    Metric objects, for OpenMetrics; without it only the classic text is served.
    The listening socket is bound in the constructor (OSError when it cannot be).
    """

    def __init__(
        self,
        address: tuple[str, int],
        render: Callable[[], bytes],
        store: SnapshotStore,
        *,
        stale_after_seconds: float,
        routes: Mapping[str, Route] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        web_config: WebConfigWatcher | None = None,
        collect: Callable[[], Iterable[Metric]] | None = None,
        limits: HttpLimits = HttpLimits(),
    ) -> None:
        self._render = render
        self._collect = collect
        self._store = store
        self._stale_after = stale_after_seconds
        self._routes: dict[str, Route] = dict(routes or {})
        self._mono = monotonic
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
        self._inflight: dict[str, asyncio.Future[bytes]] = {}
        self._max_connections = limits.max_connections
        self.shed_connections_total = 0
        """Connections closed to stay under the connection limit (idle ones evicted or new ones refused)."""

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def add_route(self, path: str, route: Route) -> None:
        self._routes[path] = route

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

    def set_stale_after(self, seconds: float) -> None:
        self._stale_after = seconds

    # ------------------------------------------------------------------
    def ready(self) -> Response:
        snapshot = self._store.latest()
        if snapshot is None:
            return 503, _TEXT, b"not ready: no snapshot yet\n"
        age = self._mono() - snapshot.monotonic_seconds
        if age > self._stale_after:
            body = f"not ready: snapshot is {age:.1f}s old (limit {self._stale_after:g}s); a poll may hang\n"
            return 503, _TEXT, body.encode()
        state = "NVML up" if snapshot.nvml_up else f"NVML down: {snapshot.nvml_error}"
        return 200, _TEXT, f"ready: snapshot {age:.1f}s old, {state}\n".encode()

    def _render_openmetrics(self) -> bytes:
        assert self._collect is not None
        return openmetrics.render(self._collect())

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
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, addr = await loop.sock_accept(self._listener)
            except OSError as exc:
                if exc.errno not in _ACCEPT_RETRY_ERRNOS:
                    raise
                self._repeat(
                    logging.WARNING, "cannot accept a connection", "cannot accept a connection: %s", exc.strerror
                )
                if not self._evict_one():
                    await asyncio.sleep(0.05)
                continue
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
            conn.abort()

    async def _open(self, conn: _Conn, client: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """TLS handshake (or not) and stream set-up; None when the connection is done with."""
        loop = asyncio.get_running_loop()
        web = self._web
        context = web.ssl_context() if web is not None else None
        sock = conn.sock
        if context is not None:
            readable: asyncio.Future[None] = loop.create_future()

            def wake() -> None:
                if not readable.done():
                    readable.set_result(None)

            loop.add_reader(sock.fileno(), wake)
            try:
                await readable
            finally:
                loop.remove_reader(sock.fileno())
            first = sock.recv(5, socket.MSG_PEEK)
            if not first:
                return None
            if first[0] != 0x16 and looks_like_http(first):
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
            tls = web.current().tls
            if tls is not None and tls.client_allowed_sans:
                ssl_object = writer.get_extra_info("ssl_object")
                peer = peer_sans(ssl_object.getpeercert() or {}) if ssl_object is not None else set()
                if not peer & set(tls.client_allowed_sans):
                    log.info("client %s rejected: certificate SANs %s not allowed", client, sorted(peer))
                    transport.abort()
                    return None
        return reader, writer

    async def _answer_plain_http(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(sock, HTTP_ON_HTTPS_RESPONSE)
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
            await self._send(writer, None, 431, {"Content-Type": _TEXT}, b"request headers too large\n", close=True)
            return False
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                log.debug("client %s hung up in the middle of its request headers", client)
            return False
        self._set_waiting(conn, False)
        try:
            request = _parse_head(head, client)
        except _BadRequest as exc:
            await self._send(writer, None, exc.status, {"Content-Type": _TEXT}, f"{exc}\n".encode(), close=True)
            return False
        close = self._wants_close(request)
        if "transfer-encoding" in request.headers:
            await self._send(writer, request, 411, {"Content-Type": _TEXT}, b"send a Content-Length\n", close=True)
            return False
        length_text = request.headers.get("content-length", "0")
        if not length_text.isdigit() or int(length_text) > _MAX_DISCARDED_BODY_BYTES:
            await self._send(writer, request, 413, {"Content-Type": _TEXT}, b"request body too large\n", close=True)
            return False
        if int(length_text):
            async with asyncio.timeout(self._limits.header_timeout_seconds):
                await reader.readexactly(int(length_text))
        status, headers, body = await self._respond(request)
        await self._send(writer, request, status, headers, body, close=close)
        return not close

    @staticmethod
    def _wants_close(request: _Request) -> bool:
        tokens = {t.strip().lower() for t in request.headers.get("connection", "").split(",")}
        if request.version == "HTTP/1.0":
            return "keep-alive" not in tokens
        return "close" in tokens

    async def _send(
        self,
        writer: asyncio.StreamWriter,
        request: _Request | None,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        *,
        close: bool,
    ) -> None:
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
            f"Server: {self._server_header}",
            f"Date: {email.utils.formatdate(usegmt=True)}",
        ]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if self._web is not None:
            lines += [f"{k}: {v}" for k, v in self._web.extra_headers().items()]
        lines.append(f"Content-Length: {len(body)}")
        if close:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(head if request is not None and request.method == "HEAD" else head + body)
        async with asyncio.timeout(self._limits.write_timeout_seconds):
            await writer.drain()

    # --- what a request gets ---------------------------------------------
    async def _respond(self, request: _Request) -> tuple[int, dict[str, str], bytes]:
        if request.method not in ("GET", "HEAD"):
            return 405, {"Content-Type": _TEXT, "Allow": "GET, HEAD"}, b"method not allowed\n"
        web = self._web
        path = request.path
        if web is not None:
            if not web.allow_request():
                return 429, {"Content-Type": _TEXT}, b"Too Many Requests\n"
            if path not in web.current().unauthenticated_paths:
                verdict = await asyncio.wrap_future(
                    web.authenticate(request.headers.get("authorization"), request.client)
                )
                if verdict is None:
                    return 429, {"Retry-After": "1", "Content-Type": _TEXT}, b"Too Many Requests\n"
                if not verdict:
                    return 401, {"WWW-Authenticate": 'Basic realm="gpumon"', "Content-Type": _TEXT}, b"Unauthorized\n"
        if path == "/metrics":
            return await self._metrics(request)
        if path == "/healthz":
            return 200, {"Content-Type": _TEXT}, b"ok\n"
        if path == "/":
            return 200, {"Content-Type": "text/html; charset=utf-8"}, INDEX_HTML
        if path == "/ready":
            route: Route = self.ready
        elif path in self._routes:
            route = self._routes[path]
        else:
            return 404, {"Content-Type": _TEXT}, b"not found\n"
        try:
            code, ctype, payload = await asyncio.get_running_loop().run_in_executor(self._workers, route)
        except Exception:
            self._repeat(logging.ERROR, f"handler for {path} failed", "handler for %s failed", path, exc_info=True)
            return 500, {"Content-Type": _TEXT}, b"internal error\n"
        return code, {"Content-Type": ctype}, payload

    async def _metrics(self, request: _Request) -> tuple[int, dict[str, str], bytes]:
        use_openmetrics = self._collect is not None and wants_openmetrics(request.headers.get("accept"))
        kind = "openmetrics" if use_openmetrics else "text"
        try:
            body = await self._rendered(kind)
        except Exception:
            self._repeat(logging.ERROR, "rendering /metrics failed", "rendering /metrics failed", exc_info=True)
            return 500, {"Content-Type": _TEXT}, b"internal error\n"
        headers = {"Content-Type": openmetrics.CONTENT_TYPE if use_openmetrics else CONTENT_TYPE}
        headers["Vary"] = "Accept, Accept-Encoding"
        if accepts_gzip(request.headers.get("accept-encoding")):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return 200, headers, body

    async def _rendered(self, kind: str) -> bytes:
        """The exposition; requests that arrive while one is being rendered share it."""
        pending = self._inflight.get(kind)
        if pending is None:
            render = self._render_openmetrics if kind == "openmetrics" else self._render
            pending = asyncio.get_running_loop().run_in_executor(self._workers, render)
            self._inflight[kind] = pending
            pending.add_done_callback(lambda _f: self._inflight.pop(kind, None))
        return await asyncio.shield(pending)


def json_response(data: Any, status: int = 200) -> Response:
    return status, "application/json", (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
