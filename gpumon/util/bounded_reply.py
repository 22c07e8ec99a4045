"""Reading an HTTP reply someone else may send: only so many bytes, only for so long.

A process on the same host can answer on a port gpumon asks (a daemon's, a receiver's); a body of
gigabytes read whole would take the reader's memory with it. ``read_reply`` reads at most
``max_bytes`` of a ``requests`` reply opened with ``stream=True``, as sent (never decompressed: ask with
``Accept-Encoding: identity``), until a deadline; ``get_json`` is a GET of a JSON document that way.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # requests is loaded by the caller, where it is needed
    import requests

IDENTITY = {"Accept-Encoding": "identity"}
"""The request header that asks for a body as it is (a compressed one could grow past any bound)."""


class ReplyTooLarge(ValueError):
    """A reply's body was larger than the reader takes."""


def read_reply(response: requests.Response, max_bytes: int, deadline: float) -> tuple[bytes, bool]:
    """(up to ``max_bytes`` of the body, whether it ended within them), read until ``deadline``
    (monotonic seconds); a read that fails (a timeout, the connection dropped) ends it."""
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes and time.monotonic() < deadline:
        try:
            chunk = response.raw.read(min(64 * 1024, max_bytes + 1 - size), decode_content=False)
        except Exception:  # urllib3's read timeout or a dropped connection: what came is what there is
            break
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    body = b"".join(chunks)
    return body[:max_bytes], False


def get_json(url: str, timeout_seconds: float, max_bytes: int) -> tuple[int, Any]:
    """(status, the JSON document) of a GET of ``url``; raises requests.RequestException when it cannot be
    fetched, ReplyTooLarge for a body past ``max_bytes`` or not whole by ``timeout_seconds``, ValueError for
    a body that is not JSON."""
    import requests

    deadline = time.monotonic() + timeout_seconds
    with requests.get(url, timeout=timeout_seconds, headers=IDENTITY, stream=True) as response:
        body, whole = read_reply(response, max_bytes, deadline)
        status = response.status_code
    if not whole:
        raise ReplyTooLarge(f"the reply is larger than {max_bytes} bytes or did not end in {timeout_seconds:g} s")
    if not 200 <= status < 300:
        return status, None
    return status, json.loads(body)
