"""The value readers the ``alerting:`` section shares: durations, numbers, URLs, and the problem list.

Each reader turns one YAML value into a Python value or says why it cannot, into ``Problems``
(one ``alerting.<where>: <text>`` line each), so every problem is listed at once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from gpumon.util.yamlfile import brief

_DURATION_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")
LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""A Prometheus label name (rule names and label keys too)."""


class Problems:
    """Every problem found so far, one line each, prefixed with where it is (``alerting.rules[0]: ...``)."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, text: str) -> None:
        self.items.append(f"alerting.{where}: {text}" if where else f"alerting: {text}")


def parse_duration(value: Any) -> float | None:
    """Seconds from ``90``, ``1.5``, ``500ms``, ``30s``, ``5m``, ``1h``, ``1h30m``; None when not a duration.

    A duration too long for a float (``999...9h``) is ``math.inf``, for the caller's range check to reject."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value < 0 else (float(value) if value < 2**63 else math.inf)
    if isinstance(value, float):
        return value if value >= 0 else None  # NaN fails the comparison too
    if not isinstance(value, str):
        return None
    m = _DURATION_RE.match(value.strip())
    if not m or not any(m.groups()):
        return None
    h, mi, s, ms = (float(g) if g else 0.0 for g in m.groups())  # float(): no limit on digits, overflow is inf
    return h * 3600.0 + mi * 60.0 + s + ms / 1000.0


def format_duration(seconds: float) -> str:
    """``90`` -> ``1m30s``: the inverse of parse_duration for whole milliseconds."""
    total_ms = round(seconds * 1000)
    if total_ms == 0:
        return "0s"
    h, rest = divmod(total_ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return "".join(f"{n}{u}" for n, u in ((h, "h"), (m, "m"), (s, "s"), (ms, "ms")) if n)


def url_problem(url: Any) -> str | None:
    """Why ``url`` is not an http(s) URL, or None."""
    if not isinstance(url, str) or not url:
        return f"URL must be a string, got {brief(url)}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"URL {brief(url)} is not valid: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"URL {brief(url)} must be http:// or https:// with a host"
    if any(c.isspace() for c in url):
        return f"URL {brief(url)} contains white space"
    del port
    return None


def read_duration(
    raw: Mapping[str, Any], key: str, default: float, where: str, p: Problems, low: float, high: float
) -> float:
    """``raw[key]`` in seconds, from ``low`` to ``high``; ``default`` (with a problem added) otherwise."""
    if key not in raw or raw[key] is None:
        return default
    seconds = parse_duration(raw[key])
    if seconds is None or not low <= seconds <= high:
        p.add(
            where,
            f"{key} must be a duration from {format_duration(low)} to {format_duration(high)} "
            f"(like 30s, 5m, 1h, or a number of seconds), got {brief(raw[key])}",
        )
        return default
    return seconds


def finite_number(value: Any) -> float | None:
    """A finite number (booleans as 1/0), or None."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if math.isfinite(number) else None
    return None
