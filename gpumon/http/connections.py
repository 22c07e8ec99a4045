"""The HTTP server's connections: one event loop that accepts, handshakes, reads and writes.

One event-loop thread owns every connection: it accepts, does the TLS handshake and
reads request headers without blocking anything else, so idle, half-sent (slowloris)
and slow-handshake connections cost a file descriptor and a few kilobytes, never a
thread. Complete requests are answered (``_respond``, which a subclass gives) with a
small, fixed pool of worker threads at hand; bcrypt runs in the web config's own pool.
Limits (``HttpLimits``): a header timeout for a new connection, an idle timeout between
keep-alive requests (each the time to a complete request, body included), a header size
limit, and a connection limit. At the limit the connection that has waited longest without
a complete request (idle, or trickling its headers or body) is closed to make room, so a new
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
a scraper needs. A connection's opening (TLS or not) is ``gpumon.http.opening``'s; reading
one request and writing its response, ``gpumon.http.exchange``'s.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import ssl
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from gpumon import __version__
from gpumon.http.exchange import Body, ResponseWriter, read_head, read_request
from gpumon.http.limits import HttpLimits, bind_listener, raise_open_files_limit
from gpumon.http.messages import Request, wants_close
from gpumon.http.opening import Connection, open_streams
from gpumon.util.repeat_log import RepeatLog

if TYPE_CHECKING:  # the web config's modules are loaded only where a web config is given
    from gpumon.http.webconfig_watcher import WebConfigWatcher

log = logging.getLogger(__name__)

_DISCONNECTS = (ConnectionError, asyncio.IncompleteReadError, TimeoutError, ssl.SSLError, EOFError)
_ACCEPT_RETRY_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
"""accept() errors that mean this process is short of something: an idle connection is closed to make room."""
_STALLED_LOOP_SECONDS = 5.0
"""The event loop has not answered a probe for this long: the server is not answering."""
_FAILING_ACCEPT_SECONDS = 10.0
"""Every accept() has failed for this long: the server is not answering."""


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
        self._responses = ResponseWriter(f"gpumon/{__version__}", web_config, limits.write_timeout_seconds)
        self._repeat = RepeatLog(log)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._workers: concurrent.futures.ThreadPoolExecutor | None = None
        self._conns: dict[int, Connection] = {}
        self._waiting: OrderedDict[int, Connection] = OrderedDict()
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
            conn = Connection(sock)
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

    def _set_waiting(self, conn: Connection, waiting: bool) -> None:
        if waiting:
            self._waiting[id(conn)] = conn
            self._waiting.move_to_end(id(conn))
        else:
            self._waiting.pop(id(conn), None)

    async def _serve_connection(self, conn: Connection, client: str) -> None:
        conn.started = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.header_timeout_seconds
        try:
            async with asyncio.timeout_at(deadline):
                streams = await open_streams(conn, client, self._web, self._limits)
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

    async def _close(self, writer: asyncio.StreamWriter) -> None:
        writer.close()
        try:
            async with asyncio.timeout(1.0):
                await writer.wait_closed()
        except (*_DISCONNECTS, OSError):
            pass

    async def _one_request(
        self,
        conn: Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client: str,
        deadline: float,
    ) -> bool:
        """Read (headers and body by ``deadline``) and answer one request; True to keep the connection for
        another. Until its request is complete a connection counts as waiting: one that trickles its body
        is evicted for a new scraper like an idle one, never holding a place a scrape needs."""
        self._set_waiting(conn, True)
        head = await read_head(reader, writer, self._responses, client, deadline)
        if head is None:
            return False
        request = await read_request(head, reader, writer, self._responses, client, deadline)
        if request is None:
            return False
        self._set_waiting(conn, False)
        close = wants_close(request)
        status, headers, body = await self._respond(request)
        await self._responses.send(writer, request, status, headers, body, close=close)
        return not close

    async def _respond(self, request: Request) -> tuple[int, dict[str, str], Body]:
        """(status, headers, body) for a complete request; the subclass says what a request gets."""
        raise NotImplementedError
