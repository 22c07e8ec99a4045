"""One request and its response on an open connection: the request read and checked, the response written.

The event loop (``gpumon.http.connections``) calls these for each request of a keep-alive
connection: ``read_head`` waits (by a deadline) for the request headers, ``read_request``
parses and checks them and reads a small body away, and ``ResponseWriter`` writes the
status line, headers and body, joining small chunks into few writes. A request that
cannot be answered gets its error response here and the connection is closed.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpumon.http.messages import REASONS, TEXT_PLAIN, BadRequest, Request, parse_head

if TYPE_CHECKING:  # the web config's modules are loaded only where a web config is given
    from gpumon.http.webconfig_watcher import WebConfigWatcher

log = logging.getLogger(__name__)

_MAX_DISCARDED_BODY_BYTES = 65536
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
    if sum(map(len, chunks)) < _COALESCE_BYTES:
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


@dataclass(frozen=True)
class ResponseWriter:
    """Writes responses: the status line, the Server and Date headers, the given headers, the web
    config's extra headers, Content-Length, then the body (none for HEAD)."""

    server_header: str
    """The Server header's value (gpumon/VERSION)."""
    web: WebConfigWatcher | None
    """The web config whose extra headers every response carries (None: none)."""
    write_timeout_seconds: float
    """How long a response may take to leave, seconds."""
    _date: list[tuple[int, str]] = field(default_factory=lambda: [(0, "")], compare=False, repr=False)
    """The Date header's value and the second (Unix time) it was written for: written once a second
    at most (only the event loop sends)."""

    def date(self) -> str:
        """The Date header's value now (RFC 9110's IMF-fixdate, to the second)."""
        now = int(time.time())
        second, text = self._date[0]
        if second != now:
            text = email.utils.formatdate(now, usegmt=True)
            self._date[0] = (now, text)
        return text

    async def send(
        self,
        writer: asyncio.StreamWriter,
        request: Request | None,
        status: int,
        headers: Mapping[str, str],
        body: Body,
        *,
        close: bool,
    ) -> None:
        """Write one response; ``close``: it says Connection: close (the caller closes)."""
        lines = [
            f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}",
            f"Server: {self.server_header}",
            f"Date: {self.date()}",
        ]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if self.web is not None:
            lines += [f"{k}: {v}" for k, v in self.web.extra_headers().items()]
        chunks = [body] if isinstance(body, bytes) else body
        lines.append(f"Content-Length: {sum(map(len, chunks))}")
        if close:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if request is not None and request.method == "HEAD":
            chunks = []
        for chunk in coalesced([head, *chunks]):
            writer.write(chunk)
        if writer.transport.get_write_buffer_size():  # (all taken by the kernel: nothing to wait for)
            async with asyncio.timeout(self.write_timeout_seconds):
                await writer.drain()

    async def error(self, writer: asyncio.StreamWriter, request: Request | None, status: int, message: bytes) -> None:
        """Answer ``status`` with a plain-text ``message`` and Connection: close."""
        await self.send(writer, request, status, {"Content-Type": TEXT_PLAIN}, message, close=True)


async def read_head(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    responses: ResponseWriter,
    client: str,
    deadline: float,
) -> bytes | None:
    """A request's headers, read by ``deadline`` (loop time); None when the connection is to close
    (nothing complete in time, headers too large (answered 431), the client hung up)."""
    try:
        async with asyncio.timeout_at(deadline):
            return await reader.readuntil(b"\r\n\r\n")
    except TimeoutError:
        log.debug("client %s sent no complete request in time; closing", client)
        return None
    except asyncio.LimitOverrunError:
        await responses.error(writer, None, 431, b"request headers too large\n")
        return None
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            log.debug("client %s hung up in the middle of its request headers", client)
        return None


async def read_request(
    head: bytes,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    responses: ResponseWriter,
    client: str,
    deadline: float,
) -> Request | None:
    """The request of ``head``, its body (if any, small) read by ``deadline`` (loop time, the same as its
    headers': a body trickled byte by byte cannot stretch it) and dropped; None when it was answered with
    an error (malformed, chunked, a body too large) or the body did not come in time, and the connection is
    to close."""
    try:
        request = parse_head(head, client)
    except BadRequest as exc:
        await responses.error(writer, None, exc.status, f"{exc}\n".encode())
        return None
    if "transfer-encoding" in request.headers:
        await responses.error(writer, request, 411, b"send a Content-Length\n")
        return None
    length_text = request.headers.get("content-length", "0")
    if not length_text or length_text.strip("0123456789"):  # "²" is a digit to str.isdigit, not to int()
        await responses.error(writer, request, 400, b"malformed Content-Length\n")
        return None
    if len(length_text.lstrip("0")) > 9 or int(length_text) > _MAX_DISCARDED_BODY_BYTES:
        await responses.error(writer, request, 413, b"request body too large\n")
        return None
    if int(length_text):
        try:
            async with asyncio.timeout_at(deadline):
                await reader.readexactly(int(length_text))
        except TimeoutError:
            log.debug("client %s sent no complete request body in time; closing", client)
            return None
    return request
