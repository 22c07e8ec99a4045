"""The HTTP server: /metrics, /healthz, /ready and routes other parts add (/api/alerts).

A scrape only reads the SnapshotStore, so it answers even while a poll hangs in NVML.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpumon.exporter.text import CONTENT_TYPE
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


class MetricsServer:
    """Serves ``render()`` (Prometheus text 0.0.4) and the routes on a ThreadingHTTPServer.

    Like client_golang's default handler, gpumon serves the classic text format only;
    Prometheus accepts it from every exporter.
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
        server_factory: Callable[[tuple[str, int], type[BaseHTTPRequestHandler]], ThreadingHTTPServer] | None = None,
        authorize: Callable[[str | None], bool] | None = None,
        extra_headers: Callable[[], Mapping[str, str]] | None = None,
        rate_limit: Callable[[], bool] | None = None,
    ) -> None:
        self._render = render
        self._store = store
        self._stale_after = stale_after_seconds
        self._routes: dict[str, Route] = dict(routes or {})
        self._mono = monotonic
        self._authorize = authorize
        self._extra_headers = extra_headers
        self._rate_limit = rate_limit
        handler = self._handler_class()
        factory = server_factory or ThreadingHTTPServer
        self._httpd = factory(address, handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def add_route(self, path: str, route: Route) -> None:
        self._routes[path] = route

    def start(self) -> None:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="gpumon-http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def set_stale_after(self, seconds: float) -> None:
        self._stale_after = seconds

    # ------------------------------------------------------------------
    def ready(self) -> Response:
        snapshot = self._store.latest()
        if snapshot is None:
            return 503, "text/plain; charset=utf-8", b"not ready: no snapshot yet\n"
        age = self._mono() - snapshot.monotonic_seconds
        if age > self._stale_after:
            body = f"not ready: snapshot is {age:.1f}s old (limit {self._stale_after:g}s); a poll may hang\n"
            return 503, "text/plain; charset=utf-8", body.encode()
        state = "NVML up" if snapshot.nvml_up else f"NVML down: {snapshot.nvml_error}"
        return 200, "text/plain; charset=utf-8", f"ready: snapshot {age:.1f}s old, {state}\n".encode()

    def _metrics(self, accept_encoding: str | None) -> tuple[int, dict[str, str], bytes]:
        body = self._render()
        headers = {"Content-Type": CONTENT_TYPE}
        if accept_encoding and "gzip" in accept_encoding:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return 200, headers, body

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "gpumon"
            disable_nagle_algorithm = True  # headers and body go out in two writes: avoid the 40 ms delayed-ACK stall
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

            def _send(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if server._extra_headers is not None:
                    for key, value in server._extra_headers().items():
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                if server._rate_limit is not None and not server._rate_limit():
                    self._send(429, {"Content-Type": "text/plain; charset=utf-8"}, b"Too Many Requests\n")
                    return
                if server._authorize is not None and not server._authorize(self.headers.get("Authorization")):
                    self._send(
                        401,
                        {"WWW-Authenticate": 'Basic realm="gpumon"', "Content-Type": "text/plain; charset=utf-8"},
                        b"Unauthorized\n",
                    )
                    return
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        status, headers, body = server._metrics(self.headers.get("Accept-Encoding"))
                        self._send(status, headers, body)
                        return
                    if path == "/healthz":
                        code, ctype, payload = 200, "text/plain; charset=utf-8", b"ok\n"
                    elif path == "/ready":
                        code, ctype, payload = server.ready()
                    elif path in server._routes:
                        code, ctype, payload = server._routes[path]()
                    elif path == "/":
                        code, ctype, payload = 200, "text/html; charset=utf-8", INDEX_HTML
                    else:
                        code, ctype, payload = 404, "text/plain; charset=utf-8", b"not found\n"
                except Exception:
                    log.exception("handler for %s failed", path)
                    code, ctype, payload = 500, "text/plain; charset=utf-8", b"internal error\n"
                self._send(code, {"Content-Type": ctype}, payload)

        return Handler


def json_response(data: Any, status: int = 200) -> Response:
    return status, "application/json", (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
