"""Asking a running gpumon daemon for its verdict (``/api/health``), one URL convention for every command:
the base URL, as ``gpumon alerts --url`` takes it (a URL that already ends in ``/api/health`` works too)."""

from __future__ import annotations

from gpumon.config.file import Config
from gpumon.model.findings import HealthReport

DAEMON_TIMEOUT_SECONDS = 3.0


def daemon_url(config: Config) -> str:
    """The daemon's base URL from ``listen`` (0.0.0.0 becomes 127.0.0.1)."""
    host, port = config.listen_address()
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def health_url(url: str) -> str:
    """``/api/health`` under a base URL (the convention of ``gpumon alerts --url``); a URL that already
    ends in ``/api/health`` is kept as it is."""
    base = url.rstrip("/")
    return base if base.endswith("/api/health") else base + "/api/health"


MAX_REPLY_BYTES = 64 * 1024 * 1024
"""The largest /api/health answer read (a report of hundreds of GPUs is well under a MiB)."""


class DaemonSilent(Exception):
    """No health report from the daemon; the message says what happened, e.g. ``answered HTTP 404``."""


def ask_daemon(url: str, timeout_seconds: float = DAEMON_TIMEOUT_SECONDS) -> HealthReport:
    """The daemon's verdict from ``url`` (its /api/health); DaemonSilent when none comes."""
    import requests

    from gpumon.util.bounded_reply import get_json

    try:  # read only so far: whatever answers on that port may send gigabytes
        status, data = get_json(url, timeout_seconds, MAX_REPLY_BYTES)
    except requests.Timeout as exc:
        raise DaemonSilent(f"did not answer within {timeout_seconds:g} s") from exc
    except requests.RequestException as exc:
        raise DaemonSilent(f"cannot be reached ({type(exc).__name__})") from exc
    except ValueError as exc:  # not JSON, or larger than any report of a gpumon daemon
        raise DaemonSilent("answered something that is not a gpumon health report") from exc
    if status != 200:
        raise DaemonSilent(f"answered HTTP {status}")
    try:
        return HealthReport.from_json(data, source="daemon")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DaemonSilent("answered something that is not a gpumon health report") from exc
