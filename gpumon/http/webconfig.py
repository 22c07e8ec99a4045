"""A Prometheus exporter-toolkit ``web-config.yml``, read and validated into a frozen WebConfig.

The file format is the one node_exporter, Prometheus and Alertmanager read
(https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md)::

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: clients-ca.crt
      min_version: TLS12
    http_server_config:
      headers:
        X-Content-Type-Options: nosniff
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

``WebConfig.load(path)`` validates the file and everything it names, raising
``WebConfigError`` with every problem at once; the SSLContext is built (``gpumon.http.tls``)
and checked at load time. Only a regular file of at most ``MAX_FILE_BYTES`` is read (a FIFO or
a device put in its place is refused at once). ``unauthenticated_paths`` (gpumon's addition to the format):
``/healthz`` and ``/ready`` can be opened to probes that carry no credentials.

The other pieces: ``gpumon.http.webconfig_tls`` (the ``tls_server_config`` section),
``gpumon.http.tls`` (the SSLContext and how it differs from Go's),
``gpumon.http.basic_auth`` (bcrypt checks), ``gpumon.http.webconfig_watcher`` (the
configuration in force, re-read when its files change).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumon.http.tls import TlsServerConfig, build_context
from gpumon.http.webconfig_tls import SHOWN_CHARACTERS, parse_tls
from gpumon.util.yamlfile import YamlFileError, brief, read_yaml

MAX_FILE_BYTES = 256 * 1024
"""Largest web config read (256 KiB: a few inline certificates fit many times over)."""

ALLOWED_HEADERS: Mapping[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
"""Headers exporter-toolkit lets a web config set, with their allowed values (empty: any)."""

_BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit", "unauthenticated_paths")
UNAUTHENTICATED_PATHS_ALLOWED = ("/healthz", "/ready")
"""Paths ``unauthenticated_paths`` (a gpumon addition to the format) may open to probes without credentials."""
_HTTP_KEYS = ("http2", "headers")
QUOTES = "'\""
"""What ``brief`` quotes a string with (a user name is shown unquoted)."""


class WebConfigError(Exception):
    """The web config cannot be used; ``problems`` lists every reason, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class RateLimit:
    """``rate_limit``: a token bucket refilled one request per ``interval_seconds``, ``burst`` deep."""

    interval_seconds: float
    burst: int


@dataclass(frozen=True)
class WebConfig:
    """One validated web-config.yml and the SSLContext built from it."""

    path: Path | None = None
    tls: TlsServerConfig | None = None
    """None: plain HTTP (no section, or a section naming neither certificate nor key, as in Go)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    basic_auth_users: Mapping[str, str] = field(default_factory=dict)
    """User name -> bcrypt hash."""
    rate_limit: RateLimit | None = None
    unauthenticated_paths: frozenset[str] = frozenset()
    """Paths served without basic auth (for Kubernetes probes): a subset of /healthz and /ready."""
    context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)
    """The server SSLContext, built and checked at load time; None without TLS."""

    @classmethod
    def load(cls, path: str | Path) -> WebConfig:
        """Read, validate and build; raise WebConfigError listing every problem."""
        path = Path(path).absolute()
        try:  # a regular file only (a FIFO is refused, never waited on), at most MAX_FILE_BYTES
            raw = read_yaml(path, MAX_FILE_BYTES)
        except YamlFileError as exc:
            raise WebConfigError(exc.problems) from None
        try:
            return cls.from_mapping({} if raw is None else raw, path)
        except RecursionError:
            raise WebConfigError([f"{path}: nested too deeply"]) from None
        except (TypeError, ValueError) as exc:  # a value of a type no key takes (a list where a name goes)
            raise WebConfigError([f"{path}: a value has the wrong type ({exc})"]) from None

    @classmethod
    def from_mapping(cls, raw: Any, path: Path) -> WebConfig:
        """Validate an already-parsed document; relative file names resolve against ``path``'s folder."""
        problems: list[str] = []
        where = str(path)
        if not isinstance(raw, dict):
            raise WebConfigError([f"{where}: the top level must be a mapping"])
        for key in raw:
            if key not in _TOP_KEYS:
                problems.append(f"{where}: unknown key {brief(key, SHOWN_CHARACTERS)} (known: {', '.join(_TOP_KEYS)})")
        tls = parse_tls(raw.get("tls_server_config"), path.parent, problems, where)
        headers = _parse_http(raw.get("http_server_config"), problems, where)
        users = _parse_users(raw.get("basic_auth_users"), problems, where)
        rate_limit = _parse_rate_limit(raw.get("rate_limit"), problems, where)
        open_paths = _parse_unauthenticated_paths(raw.get("unauthenticated_paths"), problems, where)
        context = None
        if tls is not None and not problems:
            context = build_context(tls, problems, where)
        if problems:
            raise WebConfigError(problems)
        return cls(path, tls, headers, users, rate_limit, open_paths, context)

    def watched_files(self) -> tuple[Path, ...]:
        """The files whose change means a re-read: this file and the certificate, key and CA files."""
        files = [] if self.path is None else [self.path]
        if self.tls is not None:
            files += [p for p in (self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file) if p is not None]
        return tuple(files)


def _parse_http(raw: Any, problems: list[str], where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: http_server_config must be a mapping")
        return {}
    for key in raw:
        if key not in _HTTP_KEYS:
            problems.append(f"{where}: unknown key http_server_config.{key}")
    if "http2" in raw and not isinstance(raw["http2"], bool):
        problems.append(f"{where}: http_server_config.http2 must be true or false")
    headers_raw = raw.get("headers") or {}
    if not isinstance(headers_raw, dict):
        problems.append(f"{where}: http_server_config.headers must be a mapping")
        return {}
    headers: dict[str, str] = {}
    for name, value in headers_raw.items():
        if name not in ALLOWED_HEADERS:
            problems.append(
                f"{where}: http_server_config.headers: {brief(name, SHOWN_CHARACTERS)} cannot be set (allowed: {', '.join(ALLOWED_HEADERS)})"
            )
        elif not isinstance(value, str) or "\n" in value or "\r" in value:
            problems.append(f"{where}: http_server_config.headers.{name} must be a one-line string")
        elif ALLOWED_HEADERS[name] and value not in ALLOWED_HEADERS[name]:
            problems.append(
                f"{where}: http_server_config.headers.{name} must be one of {', '.join(ALLOWED_HEADERS[name])}, "
                f"got {brief(value, SHOWN_CHARACTERS)}"
            )
        elif value:
            headers[name] = value
    return headers


def _parse_users(raw: Any, problems: list[str], where: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(f"{where}: basic_auth_users must be a mapping of user name to bcrypt hash")
        return {}
    users: dict[str, str] = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(
                f"{where}: basic_auth_users: user name {brief(user, SHOWN_CHARACTERS)} must be a non-empty string without ':'"
            )
        elif not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            problems.append(
                f"{where}: basic_auth_users.{brief(user, SHOWN_CHARACTERS).strip(QUOTES)}: not a bcrypt hash (make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')"
            )
        else:
            users[user] = hashed
    return users


def parse_duration_seconds(text: str) -> float | None:
    """A Go/Prometheus duration (``1s``, ``100ms``, ``1m30s``) in seconds, or None if malformed."""
    if text in ("0", ""):
        return 0.0
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) else None


def _parse_rate_limit(raw: Any, problems: list[str], where: str) -> RateLimit | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"interval", "burst"}:
        problems.append(f"{where}: rate_limit must be a mapping with interval and burst")
        return None
    interval = parse_duration_seconds(str(raw.get("interval", "0")))
    burst = raw.get("burst", 0)
    if interval is None:
        problems.append(
            f"{where}: rate_limit.interval {brief(raw.get('interval'), SHOWN_CHARACTERS)} is not a duration like 1s or 100ms"
        )
        return None
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        problems.append(f"{where}: rate_limit.burst must be a whole number >= 0")
        return None
    if interval == 0:
        return None
    return RateLimit(interval_seconds=interval, burst=max(burst, 1))


def _parse_unauthenticated_paths(raw: Any, problems: list[str], where: str) -> frozenset[str]:
    if raw is None:
        return frozenset()
    allowed = ", ".join(UNAUTHENTICATED_PATHS_ALLOWED)
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        problems.append(f"{where}: unauthenticated_paths must be a list of paths ({allowed})")
        return frozenset()
    for item in raw:
        if item not in UNAUTHENTICATED_PATHS_ALLOWED:
            problems.append(
                f"{where}: unauthenticated_paths: {brief(item, SHOWN_CHARACTERS)} cannot be opened (allowed: {allowed})"
            )
    return frozenset(p for p in raw if p in UNAUTHENTICATED_PATHS_ALLOWED)
