"""One POST of alerts to a receiver, with its TLS and auth options, answered sent, retry or dropped.

Connection errors, timeouts, 5xx and 429 are ``retry`` (429/503 ``Retry-After`` is passed
on); other 4xx are ``dropped`` (the receiver refuses the alerts and would refuse them again).

A redirect (3xx) is never followed: 301/302/303 would turn the POST into a GET that an
Alertmanager answers 200 with the alerts lost; it is a ``retry`` of its own kind (``redirect``),
saying where it points, so the alerts are kept until the URL is fixed. A reply is read up to
``MAX_REPLY_BYTES`` (uncompressed: ``Accept-Encoding: identity``) within the request's timeout,
never whole. The files a receiver's TLS names (``ca_file``, ``cert_file``, ``key_file``) must be
regular files, checked without blocking before each POST: a FIFO put in their place is a
``retry`` with its reason, and fixing the file lets the next attempt through.
"""

from __future__ import annotations

import email.utils
import ssl
import time
from dataclasses import dataclass
from datetime import timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from gpumon.alerts.config import ReceiverHttp
from gpumon.util.bounded_reply import read_reply
from gpumon.util.net_words import connection_words

if TYPE_CHECKING:  # requests is loaded where an alert is first sent, not with the daemon (~5 MiB, 110 modules)
    import requests

USER_AGENT = "gpumon-alerts/1"
MAX_REPLY_BYTES = 64 * 1024
"""The most of a receiver's reply gpumon reads (only its first 200 characters are shown)."""
MAX_TLS_FILE_BYTES = 4 * 1024 * 1024
"""The largest CA bundle, client certificate or key accepted (a system bundle is about 200 KiB)."""
REDIRECT = "redirect"
"""``SendResult.kind`` of a reply that redirects: never followed, a delivery error of its own."""


@dataclass(frozen=True)
class SendResult:
    """What one POST achieved."""

    outcome: str
    """sent | retry | dropped."""
    detail: str = ""
    retry_after_seconds: float | None = None
    kind: str = ""
    """What kind of failure: ``redirect`` (REDIRECT) for a redirect not followed; empty otherwise."""


def retry_after_seconds(header: str | None, now: float) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None when absent or bad."""
    if not header:
        return None
    header = header.strip()
    if header.isdigit():
        return float(header)
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, when.timestamp() - now)


def new_session() -> requests.Session:
    """An HTTP session for one receiver's worker: the first use of requests in a daemon."""
    import requests

    return requests.Session()


def post_json(
    session: requests.Session,
    url: str,
    body: Any,
    timeout_seconds: float,
    now: float,
    http: ReceiverHttp | None = None,
) -> SendResult:
    """POST ``body`` as JSON with the receiver's TLS and auth options, and classify the answer."""
    import requests  # loaded already: ``session`` is one of its sessions

    http = http or ReceiverHttp()
    headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    unreadable = _unreadable_tls_file(http)
    if unreadable is not None:
        return SendResult("retry", unreadable)
    if http.bearer_token_file:
        from gpumon.util.boundedfile import FileReadError, read_regular_file

        try:  # a regular file only: a FIFO put in its place must not hang the sender
            token = read_regular_file(http.bearer_token_file, 64 * 1024).decode("utf-8", errors="replace")
        except FileReadError as exc:
            return SendResult("retry", f"cannot read bearer_token_file {http.bearer_token_file}: {exc}")
        headers["Authorization"] = "Bearer " + token.strip()
    cert = (http.cert_file, http.key_file) if http.cert_file and http.key_file else None
    deadline = time.monotonic() + timeout_seconds
    try:
        response = session.post(
            url,
            json=body,
            timeout=timeout_seconds,
            headers=headers,
            verify=http.ca_file or True,
            cert=cert,
            allow_redirects=False,
            stream=True,
        )
        try:
            reply = read_reply(response, MAX_REPLY_BYTES, deadline)[0]
        finally:
            response.close()
    except requests.Timeout:
        return SendResult("retry", f"timed out after {timeout_seconds:g} s")
    except requests.exceptions.SSLError as exc:
        return SendResult("retry", f"TLS failed: {_tls_reason(exc)}")
    except requests.ConnectionError as exc:
        return SendResult("retry", connection_words(exc))
    except (requests.RequestException, OSError) as exc:  # OSError: an unreadable CA or client key file
        return SendResult("retry", f"request failed: {_short(exc)}")
    code = response.status_code
    text = reply.decode("utf-8", errors="replace")[:200].strip()
    if 200 <= code < 300:
        return SendResult("sent", f"HTTP {code}")
    if 300 <= code < 400:
        return _redirect(code, response.headers.get("Location"))
    if code == 429 or code >= 500:
        return SendResult("retry", f"HTTP {code} {text}", retry_after_seconds(response.headers.get("Retry-After"), now))
    return SendResult("dropped", f"HTTP {code} {text}")


def _redirect(code: int, location: str | None) -> SendResult:
    """A redirect, not followed: a retry of its own kind (REDIRECT) saying where it points."""
    where = _short_text(location or "nowhere (no Location)")
    return SendResult(
        "retry",
        f"HTTP {code} redirects to {where}; not followed: set the receiver's URL to where it points",
        kind=REDIRECT,
    )


def _unreadable_tls_file(http: ReceiverHttp) -> str | None:
    """Why a TLS file the receiver names cannot be used (not a regular file, too large, unreadable), or
    None: checked without blocking, so a FIFO in its place never hangs the sender."""
    from gpumon.util.boundedfile import FileReadError, read_regular_file

    for option, path in (("ca_file", http.ca_file), ("cert_file", http.cert_file), ("key_file", http.key_file)):
        if not path:
            continue
        try:
            read_regular_file(path, MAX_TLS_FILE_BYTES)
        except FileReadError as exc:
            return f"cannot read {option} {path}: {exc}"
    return None


def _short_text(text: str) -> str:
    return text if len(text) < 160 else text[:157] + "..."


def _tls_reason(exc: BaseException) -> str:
    """The ssl module's own words from inside requests' wrapping (urllib3 MaxRetryError, ...)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"certificate verify failed: {e.verify_message} (a private CA? set ca_file)"
        if isinstance(e, ssl.SSLError):
            return f"{e.reason or 'SSL error'}: {_short(e)}"
        todo += [a for a in e.args if isinstance(a, BaseException)]
        todo += [x for x in (getattr(e, "reason", None), e.__cause__, e.__context__) if isinstance(x, BaseException)]
    return _short(exc)


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) < 160 else text[:157] + "..."


def safe_url(url: str) -> str:
    """``url`` without its password, for logs and metric labels."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
