"""One POST of alerts to a receiver, with its TLS and auth options, answered sent, retry or dropped.

Connection errors, timeouts, 5xx and 429 are ``retry`` (429/503 ``Retry-After`` is passed
on); other 4xx are ``dropped`` (the receiver refuses the alerts and would refuse them again).
"""

from __future__ import annotations

import email.utils
import ssl
from dataclasses import dataclass
from datetime import timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from gpumon.alerts.config import ReceiverHttp
from gpumon.util.net_words import connection_words

if TYPE_CHECKING:  # requests is loaded where an alert is first sent, not with the daemon (~5 MiB, 110 modules)
    import requests

USER_AGENT = "gpumon-alerts/1"


@dataclass(frozen=True)
class SendResult:
    """What one POST achieved."""

    outcome: str
    """sent | retry | dropped."""
    detail: str = ""
    retry_after_seconds: float | None = None


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
    headers = {"User-Agent": USER_AGENT}
    if http.bearer_token_file:
        from gpumon.util.boundedfile import FileReadError, read_regular_file

        try:  # a regular file only: a FIFO put in its place must not hang the sender
            token = read_regular_file(http.bearer_token_file, 64 * 1024).decode("utf-8", errors="replace")
        except FileReadError as exc:
            return SendResult("retry", f"cannot read bearer_token_file {http.bearer_token_file}: {exc}")
        headers["Authorization"] = "Bearer " + token.strip()
    cert = (http.cert_file, http.key_file) if http.cert_file and http.key_file else None
    try:
        response = session.post(
            url, json=body, timeout=timeout_seconds, headers=headers, verify=http.ca_file or True, cert=cert
        )
    except requests.Timeout:
        return SendResult("retry", f"timed out after {timeout_seconds:g} s")
    except requests.exceptions.SSLError as exc:
        return SendResult("retry", f"TLS failed: {_tls_reason(exc)}")
    except requests.ConnectionError as exc:
        return SendResult("retry", connection_words(exc))
    except (requests.RequestException, OSError) as exc:  # OSError: an unreadable CA or client key file
        return SendResult("retry", f"request failed: {_short(exc)}")
    code = response.status_code
    text = response.text[:200].strip()
    response.close()
    if 200 <= code < 300:
        return SendResult("sent", f"HTTP {code}")
    if code == 429 or code >= 500:
        return SendResult("retry", f"HTTP {code} {text}", retry_after_seconds(response.headers.get("Retry-After"), now))
    return SendResult("dropped", f"HTTP {code} {text}")


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
