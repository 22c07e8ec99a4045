"""The HTTP server: /metrics, /healthz, /ready and routes other parts add (/api/alerts).

A scrape only reads the SnapshotStore, so it answers even while a poll hangs in NVML.
This module says what a request gets: the web config's gate (rate limit, basic auth,
``unauthenticated_paths``), then the exposition (text or OpenMetrics, gzip when asked;
requests that arrive while one is rendered share it) or a route run on a worker thread.
The connections themselves (event loop, TLS, timeouts, limits) are
``gpumon.http.connections``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from gpumon.collect.store import SnapshotStore
from gpumon.exposition import openmetrics
from gpumon.exposition.text import CONTENT_TYPE
from gpumon.http.connections import HttpConnectionServer
from gpumon.http.exchange import Body
from gpumon.http.limits import HttpLimits
from gpumon.http.messages import TEXT_PLAIN, Request, Response, Route, accepts_gzip, wants_openmetrics

if TYPE_CHECKING:  # the web config's modules are loaded only where a web config is given
    from gpumon.http.webconfig_watcher import WebConfigWatcher

INDEX_HTML = b"""<!doctype html><html><head><title>gpumon</title></head><body>
<h1>gpumon</h1><ul>
<li><a href="/metrics">/metrics</a> Prometheus metrics</li>
<li><a href="/healthz">/healthz</a> process alive</li>
<li><a href="/ready">/ready</a> a fresh snapshot exists</li>
<li><a href="/api/snapshot">/api/snapshot</a> the latest snapshot as JSON</li>
<li><a href="/api/alerts">/api/alerts</a> active alerts</li>
</ul></body></html>"""


class Exposition(Protocol):
    """What /metrics serves, as chunks of bytes (gpumon.exposition.collector.GpumonCollector)."""

    @property
    def serves_openmetrics(self) -> bool:
        """Whether ``body(openmetrics=True)`` gives OpenMetrics (else only the classic text is served)."""
        ...

    def body(self, *, openmetrics: bool = False, gzip: bool = False) -> Sequence[bytes]:
        """The exposition, made now if need be (called on a worker thread)."""
        ...

    def ready_body(self, *, openmetrics: bool = False, gzip: bool = False) -> Sequence[bytes] | None:
        """The exposition when it is made of kept bytes (called on the event loop), else None."""
        ...


STALLED_SCRAPE_SECONDS = 20.0
"""A /metrics body not made in this long (it takes milliseconds; 256 GPUs, tens of them) means a source
hangs: scrapes are not answered, and the systemd watchdog (WatchdogSec=30s) is no longer fed."""

_NEGOTIATED_KEPT = 64
"""Sets of (Accept, Accept-Encoding) headers whose answer a server keeps (scrapers send one set each)."""

DEFAULT_LIMITS = HttpLimits()
"""The limits a MetricsServer has unless told otherwise (a frozen value, shared)."""


class MetricsServer(HttpConnectionServer):
    """Serves ``exposition`` on /metrics (Prometheus text 0.0.4, or OpenMetrics when asked and
    served) and the routes: its ``ready_body`` on the event loop when it has one (no thread
    hand-over), else its ``body`` on a worker thread.

    ``web_config``: TLS, basic auth, extra headers and rate limit from a web-config.yml
    (None: plain HTTP, no auth).
    The listening socket is bound in the constructor (OSError when it cannot be).
    """

    def __init__(
        self,
        address: tuple[str, int],
        exposition: Exposition,
        store: SnapshotStore,
        *,
        stale_after_seconds: float,
        routes: Mapping[str, Route] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        web_config: WebConfigWatcher | None = None,
        limits: HttpLimits = DEFAULT_LIMITS,
    ) -> None:
        self._exposition = exposition
        self._store = store
        self._stale_after = stale_after_seconds
        self._routes: dict[str, Route] = dict(routes or {})
        self._mono = monotonic
        self._inflight: dict[tuple[str, bool], asyncio.Future[Body]] = {}
        self._negotiated: dict[tuple[str | None, str | None], tuple[bool, bool]] = {}
        """(OpenMetrics, gzip) by the (Accept, Accept-Encoding) headers that asked for them: a scraper
        sends the same ones every time (at most ``_NEGOTIATED_KEPT`` kept)."""
        self._rendering_since: dict[tuple[str, bool], float] = {}
        """When (``monotonic``) each body being rendered on a worker thread was asked for."""
        super().__init__(address, web_config=web_config, limits=limits)

    def add_route(self, path: str, route: Route) -> None:
        self._routes[path] = route

    def set_stale_after(self, seconds: float) -> None:
        self._stale_after = seconds

    # ------------------------------------------------------------------
    def ready(self) -> Response:
        snapshot = self._store.latest()
        if snapshot is None:
            return 503, TEXT_PLAIN, b"not ready: no snapshot yet\n"
        age = self._mono() - snapshot.monotonic_seconds
        if age > self._stale_after:
            body = f"not ready: snapshot is {age:.1f}s old (limit {self._stale_after:g}s); a poll may hang\n"
            return 503, TEXT_PLAIN, body.encode()
        state = "NVML up" if snapshot.nvml_up else f"NVML down: {snapshot.nvml_error}"
        return 200, TEXT_PLAIN, f"ready: snapshot {age:.1f}s old, {state}\n".encode()

    def serving_problem(self) -> str | None:
        """Why the server cannot answer now (``HttpConnectionServer.serving_problem``), or a /metrics body
        that has not been made for STALLED_SCRAPE_SECONDS (a source that never returns: scrapes go
        unanswered, so the daemon stops feeding systemd's watchdog); None while scrapes are answered."""
        problem = super().serving_problem()
        if problem is not None:
            return problem
        started = min(list(self._rendering_since.values()), default=None)
        if started is not None and self._mono() - started > STALLED_SCRAPE_SECONDS:
            return f"a /metrics scrape has waited {self._mono() - started:.0f} s for its body"
        return None

    # --- what a request gets ---------------------------------------------
    async def _respond(self, request: Request) -> tuple[int, dict[str, str], Body]:
        if request.method not in ("GET", "HEAD"):
            return 405, {"Content-Type": TEXT_PLAIN, "Allow": "GET, HEAD"}, b"method not allowed\n"
        web = self._web
        path = request.path
        if web is not None:
            if not web.allow_request():
                return 429, {"Content-Type": TEXT_PLAIN}, b"Too Many Requests\n"
            if path not in web.current().unauthenticated_paths:
                verdict = await asyncio.wrap_future(
                    web.authenticate(request.headers.get("authorization"), request.client)
                )
                if verdict is None:
                    return 429, {"Retry-After": "1", "Content-Type": TEXT_PLAIN}, b"Too Many Requests\n"
                if not verdict:
                    return (
                        401,
                        {"WWW-Authenticate": 'Basic realm="gpumon"', "Content-Type": TEXT_PLAIN},
                        b"Unauthorized\n",
                    )
        if path == "/metrics":
            return await self._metrics(request)
        if path == "/healthz":
            return 200, {"Content-Type": TEXT_PLAIN}, b"ok\n"
        if path == "/":
            return 200, {"Content-Type": "text/html; charset=utf-8"}, INDEX_HTML
        if path == "/ready":
            route: Route = self.ready
        elif path in self._routes:
            route = self._routes[path]
        else:
            return 404, {"Content-Type": TEXT_PLAIN}, b"not found\n"
        try:
            code, ctype, payload = await asyncio.get_running_loop().run_in_executor(self._workers, route)
        except Exception:
            self._repeat(logging.ERROR, f"handler for {path} failed", "handler for %s failed", path, exc_info=True)
            return 500, {"Content-Type": TEXT_PLAIN}, b"internal error\n"
        return code, {"Content-Type": ctype}, payload

    def _negotiate(self, accept: str | None, accept_encoding: str | None) -> tuple[bool, bool]:
        """Whether to answer in OpenMetrics, and gzipped, for these request headers."""
        key = (accept, accept_encoding)
        answer = self._negotiated.get(key)
        if answer is None:
            answer = (self._exposition.serves_openmetrics and wants_openmetrics(accept), accepts_gzip(accept_encoding))
            if len(self._negotiated) >= _NEGOTIATED_KEPT:
                self._negotiated.clear()
            self._negotiated[key] = answer
        return answer

    async def _metrics(self, request: Request) -> tuple[int, dict[str, str], Body]:
        asked = request.headers
        use_openmetrics, use_gzip = self._negotiate(asked.get("accept"), asked.get("accept-encoding"))
        kind = "openmetrics" if use_openmetrics else "text"
        try:
            body: Body | None = self._exposition.ready_body(openmetrics=use_openmetrics, gzip=use_gzip)
            if body is None:
                body = await self._rendered(kind, use_gzip)
        except Exception:
            self._repeat(logging.ERROR, "rendering /metrics failed", "rendering /metrics failed", exc_info=True)
            return 500, {"Content-Type": TEXT_PLAIN}, b"internal error\n"
        headers = {"Content-Type": openmetrics.CONTENT_TYPE if use_openmetrics else CONTENT_TYPE}
        headers["Vary"] = "Accept, Accept-Encoding"
        if use_gzip:
            headers["Content-Encoding"] = "gzip"
        return 200, headers, body

    def _made(self, loop: asyncio.AbstractEventLoop, pending: asyncio.Future[Body], kind: str, use_gzip: bool) -> None:
        """Make the exposition in ``kind``, gzipped when asked (on a worker thread), and settle
        ``pending`` with it (or its error) on ``loop``: one call handed to the loop, where
        ``run_in_executor`` chains a concurrent future to an asyncio one (about 35 Python calls
        more a scrape on the event loop)."""
        try:
            body = self._exposition.body(openmetrics=kind == "openmetrics", gzip=use_gzip)
        except Exception as exc:
            loop.call_soon_threadsafe(_settle, pending, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, pending, body, None)

    async def _rendered(self, kind: str, use_gzip: bool) -> Body:
        """The exposition; requests that arrive while one is being rendered share it."""
        key = (kind, use_gzip)
        pending = self._inflight.get(key)
        if pending is None:
            self._rendering_since[key] = self._mono()  # before the worker may start: its wait counts from here
            loop = asyncio.get_running_loop()
            pending = loop.create_future()
            assert self._workers is not None  # (started: a request came)
            self._workers.submit(self._made, loop, pending, kind, use_gzip)
            self._inflight[key] = pending
            pending.add_done_callback(lambda _f: (self._inflight.pop(key, None), self._rendering_since.pop(key, None)))
        return await asyncio.shield(pending)


def _settle(pending: asyncio.Future[Body], body: Body | None, error: Exception | None) -> None:
    """Give ``pending`` its body or error (on its loop), unless it was cancelled meanwhile."""
    if pending.done():
        return
    if error is not None:
        pending.set_exception(error)
    else:
        assert body is not None
        pending.set_result(body)
