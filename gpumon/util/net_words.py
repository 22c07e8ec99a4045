"""Network failures and durations in words a person can act on, instead of a library's internals.

``connection_words(exc)`` finds the operating system's reason inside the layers an HTTP library
wraps around it (requests' ConnectionError around urllib3's MaxRetryError around a
NewConnectionError around ``ConnectionRefusedError``) and says it plainly: "connection refused",
"host name not found", ...; ``request_failure`` does the same for any failed requests call;
``duration_words`` writes seconds as "8 s", "2 min", "3 h 5 min".
"""

from __future__ import annotations

import errno
import http.client
import socket
import ssl

_ERRNO_WORDS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset by the other end",
    errno.ECONNABORTED: "connection aborted",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "connection timed out",
    errno.EPIPE: "connection closed by the other end",
}


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it wraps (arguments, ``reason``, cause, context), outermost first."""
    seen: set[int] = set()
    order: list[BaseException] = []
    todo: list[BaseException] = [exc]
    while todo and len(order) < 32:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        order.append(e)
        todo += [a for a in e.args if isinstance(a, BaseException)]
        todo += [x for x in (getattr(e, "reason", None), e.__cause__, e.__context__) if isinstance(x, BaseException)]
    return order


def connection_words(exc: BaseException) -> str:
    """Why a connection failed, in words: the innermost reason the operating system gave."""
    for e in reversed(_chain(exc)):
        if isinstance(e, socket.gaierror):
            return f"host name not found ({e.strerror or e})"
        if isinstance(e, ssl.SSLError):
            return f"TLS failed: {e.reason or e}"
        if isinstance(e, http.client.RemoteDisconnected):
            return "the connection closed without an answer"
        if isinstance(e, OSError) and e.errno in _ERRNO_WORDS:
            return _ERRNO_WORDS[e.errno]
        if isinstance(e, TimeoutError) and type(e).__module__ == "builtins":
            return "connection timed out"
    for e in reversed(_chain(exc)):
        if isinstance(e, OSError) and e.errno is not None and e.strerror:
            return e.strerror[0].lower() + e.strerror[1:]
    return "connection failed"


def request_failure(exc: BaseException, timeout_seconds: float) -> str:
    """What went wrong with one HTTP request made with requests, in words."""
    import requests  # loaded already: ``exc`` is one of its errors

    if isinstance(exc, requests.Timeout):
        return f"no answer within {timeout_seconds:g} s"
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return f"it answered HTTP {exc.response.status_code} {exc.response.reason or ''}".rstrip()
    if isinstance(exc, requests.ConnectionError):
        return connection_words(exc)
    return f"request failed ({type(exc).__name__})"


def duration_words(seconds: float) -> str:
    """``seconds`` as a person says it: "0.5 s", "8 s", "2 min", "3 h 5 min", "2 d 4 h"."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"
