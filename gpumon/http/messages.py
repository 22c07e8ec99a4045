"""The HTTP/1.1 subset a scraper needs: request heads parsed, content negotiated, responses typed.

Pure functions and data: no sockets, no event loop. ``gpumon.http.connections``
reads the bytes and calls ``parse_head``; ``gpumon.http.server`` decides the answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Response = tuple[int, str, bytes]
"""(status, content type, body) as a route answers."""
Route = Callable[[], Response]

REASONS = {
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
"""Reason phrases of the status codes gpumon answers with."""
TEXT_PLAIN = "text/plain; charset=utf-8"


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
class Request:
    """One request's head, as read from the connection."""

    method: str
    target: str
    version: str
    headers: dict[str, str]
    """Lower-case names; repeated headers joined with ", "."""
    client: str

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


class BadRequest(Exception):
    """A request head that cannot be answered; ``status`` is the code to answer with."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def parse_head(head: bytes, client: str) -> Request:
    """The request line and headers (up to the blank line) of a request from ``client``; raise BadRequest."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported HTTP version")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise BadRequest(400, "malformed header line")
        key = name.lower()
        value = value.strip()
        if key == "host" and key in headers:
            raise BadRequest(400, "more than one Host header")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if version == "HTTP/1.1" and "host" not in headers:
        raise BadRequest(400, "missing Host header")
    return Request(method, target, version, headers, client)


def wants_close(request: Request) -> bool:
    """Whether the connection ends after this request (``Connection`` and the HTTP version's default)."""
    tokens = {t.strip().lower() for t in request.headers.get("connection", "").split(",")}
    if request.version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens


def json_response(data: Any, status: int = 200) -> Response:
    """A route's answer with ``data`` as indented, key-sorted JSON."""
    return status, "application/json", (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
