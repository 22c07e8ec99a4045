"""TLS and basic auth for /metrics from a Prometheus exporter-toolkit ``web-config.yml``.

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

Pieces:

* ``WebConfig.load(path)`` validates the file and everything it names, raising
  ``WebConfigError`` with every problem at once.
* ``WebConfigWatcher(path)`` holds the current ``WebConfig`` and re-reads it when the
  file or any certificate, key or CA file it names changes (checked at most every
  ``check_interval_seconds`` when a request asks). A new file with problems is logged
  and the old configuration kept. ``reload()`` forces a re-read (SIGHUP).
* ``BcryptPool``: where the password checks run, so that a flood of wrong passwords
  does not delay a client that knows the right one.
* ``unauthenticated_paths`` (gpumon's addition to the format): ``/healthz`` and
  ``/ready`` can be opened to probes that carry no credentials.

gpumon.exporter.server applies the configuration: the current ``SSLContext`` to each new
connection, so a renewed certificate applies without a restart, and a plain HTTP request
on a TLS port gets ``400 Client sent an HTTP request to an HTTPS server.``, like Go's servers.

Differences from the Go implementation, all on the strict side: Python's ``ssl``
verifies every client certificate it asks for, so ``RequireAnyClientCert`` needs a
``client_ca_file`` and behaves like ``RequireAndVerifyClientCert``, and
``RequestClientCert`` verifies a certificate when one is sent and a CA is given.
``curve_preferences`` and ``http_server_config.http2`` are accepted and not applied
(gpumon speaks HTTP/1.1 and OpenSSL picks the curves). ``cipher_suites``
applies to TLS 1.2 only, as in Go.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import hmac
import logging
import os
import re
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
_CLIENT_AUTH_ALIASES = {"RequireClientCert": "RequireAnyClientCert"}

TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

CIPHER_SUITES: Mapping[str, str] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
}
"""Go's crypto/tls secure TLS 1.2 suite names (the ones exporter-toolkit accepts) -> OpenSSL names."""

ALLOWED_HEADERS: Mapping[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
"""Headers exporter-toolkit lets a web config set, with their allowed values (empty: any)."""

HTTP_ON_HTTPS_RESPONSE = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"Client sent an HTTP request to an HTTPS server.\n"
)
"""What a plain-HTTP client gets from a TLS port (the same words as Go's net/http)."""

_HTTP_METHOD_PREFIXES = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"OPTIO", b"DELET", b"PATCH", b"CONNE", b"TRACE")
_BCRYPT_HASH = re.compile(r"^\$2[abxy]?\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit", "unauthenticated_paths")
UNAUTHENTICATED_PATHS_ALLOWED = ("/healthz", "/ready")
"""Paths ``unauthenticated_paths`` (a gpumon addition to the format) may open to probes without credentials."""
_TLS_KEYS = (
    "cert_file",
    "key_file",
    "cert",
    "key",
    "client_auth_type",
    "client_ca_file",
    "client_ca",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_HTTP_KEYS = ("http2", "headers")


class WebConfigError(Exception):
    """The web config cannot be used; ``problems`` lists every reason, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class TlsServerConfig:
    """The validated ``tls_server_config`` section; file paths are absolute."""

    cert_file: Path | None = None
    key_file: Path | None = None
    cert_pem: str | None = None
    """Inline certificate (``cert:``), PEM."""
    key_pem: str | None = None
    """Inline key (``key:``), PEM."""
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    client_ca_pem: str | None = None
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True


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
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise WebConfigError([f"{path}: no such file"]) from None
        except OSError as exc:
            raise WebConfigError([f"{path}: cannot read: {exc.strerror}"]) from None
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise WebConfigError([f"{path}: not valid YAML: {' '.join(str(exc).split())}"]) from None
        except RecursionError:
            raise WebConfigError([f"{path}: not valid YAML: nested too deeply"]) from None
        except (ValueError, OverflowError) as exc:
            raise WebConfigError([f"{path}: not valid YAML: {exc}"]) from None
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
                problems.append(f"{where}: unknown key {key!r} (known: {', '.join(_TOP_KEYS)})")
        tls = _parse_tls(raw.get("tls_server_config"), path.parent, problems, where)
        headers = _parse_http(raw.get("http_server_config"), problems, where)
        users = _parse_users(raw.get("basic_auth_users"), problems, where)
        rate_limit = _parse_rate_limit(raw.get("rate_limit"), problems, where)
        open_paths = _parse_unauthenticated_paths(raw.get("unauthenticated_paths"), problems, where)
        context = None
        if tls is not None and not problems:
            context = _build_context(tls, problems, where)
        if problems:
            raise WebConfigError(problems)
        return cls(path, tls, headers, users, rate_limit, open_paths, context)

    def watched_files(self) -> tuple[Path, ...]:
        """The files whose change means a re-read: this file and the certificate, key and CA files."""
        files = [] if self.path is None else [self.path]
        if self.tls is not None:
            files += [p for p in (self.tls.cert_file, self.tls.key_file, self.tls.client_ca_file) if p is not None]
        return tuple(files)


def _parse_tls(raw: Any, base: Path, problems: list[str], where: str) -> TlsServerConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{where}: tls_server_config must be a mapping")
        return None
    for key in raw:
        if key not in _TLS_KEYS:
            problems.append(f"{where}: unknown key tls_server_config.{key}")

    def text(key: str) -> str | None:
        value = raw.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            problems.append(f"{where}: tls_server_config.{key} must be a string")
            return None
        return value

    def file(key: str) -> Path | None:
        value = text(key)
        if value is None:
            return None
        resolved = base / value
        if not resolved.is_file():
            problems.append(f"{where}: tls_server_config.{key} {str(resolved)!r}: no such file")
        elif not os.access(resolved, os.R_OK):
            problems.append(f"{where}: tls_server_config.{key} {str(resolved)!r}: not readable by this user")
        return resolved

    cert_file, key_file, cert_pem, key_pem = file("cert_file"), file("key_file"), text("cert"), text("key")
    client_ca_file, client_ca_pem = file("client_ca_file"), text("client_ca")
    has_cert = raw.get("cert_file") or raw.get("cert")
    has_key = raw.get("key_file") or raw.get("key")
    if not has_cert and not has_key:
        # exporter-toolkit: a TLS section without certificate and key means plain HTTP.
        return None
    for a, b in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if raw.get(a) and raw.get(b):
            problems.append(f"{where}: tls_server_config: give {a} or {b}, not both")
    if not has_cert:
        problems.append(f"{where}: tls_server_config: key given but cert_file (or cert) missing")
    if not has_key:
        problems.append(f"{where}: tls_server_config: cert given but key_file (or key) missing")

    auth = text("client_auth_type") or "NoClientCert"
    auth = _CLIENT_AUTH_ALIASES.get(auth, auth)
    has_ca = client_ca_file is not None or client_ca_pem is not None
    if auth not in CLIENT_AUTH_TYPES:
        problems.append(
            f"{where}: tls_server_config.client_auth_type {auth!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}"
        )
    elif auth == "NoClientCert" and has_ca:
        problems.append(f"{where}: tls_server_config: client_ca_file is set but client_auth_type is NoClientCert")
    elif auth in ("RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not has_ca:
        problems.append(f"{where}: tls_server_config: client_auth_type {auth} needs client_ca_file")

    sans = raw.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        problems.append(f"{where}: tls_server_config.client_allowed_sans must be a list of strings")
        sans = []
    elif sans and auth not in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        problems.append(
            f"{where}: tls_server_config.client_allowed_sans needs client_auth_type "
            "RequireAndVerifyClientCert (or RequireAnyClientCert)"
        )

    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = text(key) or default
        if value not in TLS_VERSIONS:
            problems.append(f"{where}: tls_server_config.{key} {value!r} is not one of {', '.join(TLS_VERSIONS)}")
            value = default
        versions[key] = value
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        problems.append(f"{where}: tls_server_config: min_version is above max_version")

    suites = raw.get("cipher_suites") or []
    if not isinstance(suites, list):
        problems.append(f"{where}: tls_server_config.cipher_suites must be a list")
        suites = []
    for suite in suites:
        if not isinstance(suite, str) or suite not in CIPHER_SUITES:
            problems.append(
                f"{where}: tls_server_config.cipher_suites: unknown or insecure suite {suite!r} "
                f"(known: {', '.join(CIPHER_SUITES)})"
            )
    prefer = raw.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        problems.append(f"{where}: tls_server_config.prefer_server_cipher_suites must be true or false")
        prefer = True
    curves = raw.get("curve_preferences")
    if curves is not None and not isinstance(curves, list):
        problems.append(f"{where}: tls_server_config.curve_preferences must be a list")
    return TlsServerConfig(
        cert_file=cert_file,
        key_file=key_file,
        cert_pem=cert_pem,
        key_pem=key_pem,
        client_auth_type=auth,
        client_ca_file=client_ca_file,
        client_ca_pem=client_ca_pem,
        client_allowed_sans=tuple(sans),
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        cipher_suites=tuple(s for s in suites if s in CIPHER_SUITES),
        prefer_server_cipher_suites=prefer,
    )


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
                f"{where}: http_server_config.headers: {name!r} cannot be set (allowed: {', '.join(ALLOWED_HEADERS)})"
            )
        elif not isinstance(value, str) or "\n" in value or "\r" in value:
            problems.append(f"{where}: http_server_config.headers.{name} must be a one-line string")
        elif ALLOWED_HEADERS[name] and value not in ALLOWED_HEADERS[name]:
            problems.append(
                f"{where}: http_server_config.headers.{name} must be one of {', '.join(ALLOWED_HEADERS[name])}, "
                f"got {value!r}"
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
            problems.append(f"{where}: basic_auth_users: user name {user!r} must be a non-empty string without ':'")
        elif not isinstance(hashed, str) or not _BCRYPT_HASH.match(hashed):
            problems.append(
                f"{where}: basic_auth_users.{user}: not a bcrypt hash (make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n')"
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
        problems.append(f"{where}: rate_limit.interval {raw.get('interval')!r} is not a duration like 1s or 100ms")
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
            problems.append(f"{where}: unauthenticated_paths: {item!r} cannot be opened (allowed: {allowed})")
    return frozenset(p for p in raw if p in UNAUTHENTICATED_PATHS_ALLOWED)


def _memfd_path(name: str, pem: str) -> tuple[int, str]:
    """An anonymous in-memory file holding ``pem``, for ssl APIs that only take file names."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, pem.encode())
    return fd, f"/proc/self/fd/{fd}"


def _build_context(tls: TlsServerConfig, problems: list[str], where: str) -> ssl.SSLContext | None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.maximum_version = TLS_VERSIONS[tls.max_version]
    if tls.cipher_suites:
        try:
            context.set_ciphers(":".join(CIPHER_SUITES[s] for s in tls.cipher_suites))
        except ssl.SSLError as exc:
            problems.append(f"{where}: tls_server_config.cipher_suites: none usable here ({exc.reason})")
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    fds: list[int] = []
    try:
        cert = str(tls.cert_file) if tls.cert_file else None
        key = str(tls.key_file) if tls.key_file else None
        if tls.cert_pem is not None:
            fd, cert = _memfd_path("gpumon-cert", tls.cert_pem)
            fds.append(fd)
        if tls.key_pem is not None:
            fd, key = _memfd_path("gpumon-key", tls.key_pem)
            fds.append(fd)
        assert cert is not None
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            problems.append(
                f"{where}: tls_server_config: cannot use certificate {_name(tls.cert_file, 'cert')} with key "
                f"{_name(tls.key_file, 'key')}: {_ssl_reason(exc)}"
            )
    finally:
        for fd in fds:
            os.close(fd)
    if tls.client_ca_file is not None or tls.client_ca_pem is not None:
        try:
            if tls.client_ca_pem is not None:
                context.load_verify_locations(cadata=tls.client_ca_pem)
            else:
                context.load_verify_locations(cafile=str(tls.client_ca_file))
        except (ssl.SSLError, OSError, ValueError) as exc:
            problems.append(
                f"{where}: tls_server_config: cannot load client CA {_name(tls.client_ca_file, 'client_ca')}: "
                f"{_ssl_reason(exc)}"
            )
    context.verify_mode = {
        "NoClientCert": ssl.CERT_NONE,
        "RequestClientCert": ssl.CERT_OPTIONAL if tls.client_ca_file or tls.client_ca_pem else ssl.CERT_NONE,
        "RequireAnyClientCert": ssl.CERT_REQUIRED,
        "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
        "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
    }[tls.client_auth_type]
    return context


def _name(path: Path | None, inline_key: str) -> str:
    return repr(str(path)) if path is not None else f"(inline {inline_key})"


def _ssl_reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).replace("_", " ").lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def _fingerprint(files: tuple[Path, ...]) -> tuple[tuple[str, int, int, int], ...]:
    out = []
    for f in files:
        try:
            st = f.stat()
            out.append((str(f), st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((str(f), -1, -1, -1))
    return tuple(out)


class _AuthCache:
    """Recent bcrypt verdicts keyed by an HMAC of the credentials (never the password); bounded, with expiry."""

    def __init__(self, good_seconds: float, bad_seconds: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._good = good_seconds
        self._bad = bad_seconds
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[bool, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bool | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or hit[1] < self._clock():
                return None
            return hit[0]

    def put(self, key: bytes, ok: bool) -> None:
        with self._lock:
            self._entries[key] = (ok, self._clock() + (self._good if ok else self._bad))
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)


_DECOY_HASH = b"$2b$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
"""Checked for unknown users, so timing does not reveal which user names exist."""


@dataclass(order=True)
class _BcryptJob:
    priority: int
    """0: a client with no recent failed login; 1: a suspect."""
    seq: int
    client: str = field(compare=False)
    password: bytes = field(compare=False, repr=False)
    hashed: bytes = field(compare=False, repr=False)
    future: Future[bool | None] = field(compare=False, repr=False)


class BcryptPool:
    """bcrypt checks on a few threads, so that a correct password never queues behind a flood of wrong ones.

    A client (an IP address) whose password was wrong in the last ``suspect_seconds``
    is a suspect: its checks wait until no other client's check is waiting. Every client
    has at most ``max_pending_per_client`` checks queued; more are refused at once (the
    future gives None: answer 429). So 50 attackers from one address leave a new client
    waiting for at most the checks already running and two more. Threads start on demand
    and end after ``idle_seconds`` without work.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        suspect_seconds: float = 300.0,
        max_pending_per_client: int = 2,
        max_queued: int = 256,
        idle_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._workers = workers
        self._suspect_seconds = suspect_seconds
        self._max_pending_per_client = max_pending_per_client
        self._max_queued = max_queued
        self._idle_seconds = idle_seconds
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: list[_BcryptJob] = []
        self._seq = 0
        self._running = 0
        self._idle = 0
        self._pending: dict[str, int] = {}
        self._suspects: OrderedDict[str, float] = OrderedDict()
        """client -> suspect until (clock seconds); bounded."""

    def is_suspect(self, client: str) -> bool:
        with self._cond:
            return self._suspect_until(client) > self._clock()

    def mark_failed(self, client: str) -> None:
        with self._cond:
            self._suspects[client] = self._clock() + self._suspect_seconds
            self._suspects.move_to_end(client)
            while len(self._suspects) > 65536:
                self._suspects.popitem(last=False)

    def _suspect_until(self, client: str) -> float:
        return self._suspects.get(client, 0.0)

    def check(self, password: bytes, hashed: bytes, client: str) -> Future[bool | None]:
        """A future for ``bcrypt.checkpw(password, hashed)`` (False for an over-long password),
        or None at once when ``client`` has too many checks queued already."""
        future: Future[bool | None] = Future()
        with self._cond:
            suspect = self._suspect_until(client) > self._clock()
            pending = self._pending.get(client, 0)
            if len(self._queue) >= self._max_queued or pending >= self._max_pending_per_client:
                future.set_result(None)
                return future
            self._pending[client] = pending + 1
            self._seq += 1
            heapq.heappush(self._queue, _BcryptJob(1 if suspect else 0, self._seq, client, password, hashed, future))
            if self._idle == 0 and self._running < self._workers:
                self._running += 1
                threading.Thread(target=self._work, name="gpumon-bcrypt", daemon=True).start()
            else:
                self._cond.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                if not self._queue:
                    self._cond.wait(self._idle_seconds)
                self._idle -= 1
                if not self._queue:
                    self._running -= 1
                    return
                job = heapq.heappop(self._queue)
                left = self._pending.get(job.client, 1) - 1
                if left:
                    self._pending[job.client] = left
                else:
                    self._pending.pop(job.client, None)
            try:
                ok = bcrypt.checkpw(job.password, job.hashed)
            except ValueError:  # longer than bcrypt's 72 bytes, or a malformed hash
                ok = False
            job.future.set_result(ok)


class WebConfigWatcher:
    """The current web config, re-read when its files change; thread-safe.

    Construction loads the file and raises WebConfigError if it is unusable (at start,
    a bad web config is a configuration error). Later, a changed file that cannot be
    used, for whatever reason, is logged once in one line and the previous
    configuration stays in force.
    """

    def __init__(
        self,
        path: str | Path,
        check_interval_seconds: float = 1.0,
        auth_cache_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
        bcrypt_pool: BcryptPool | None = None,
    ) -> None:
        self._path = Path(path).absolute()
        self._interval = check_interval_seconds
        self._clock = clock
        self._log = logger or logging.getLogger(__name__)
        self._lock = threading.Lock()
        self._config = WebConfig.load(self._path)
        self._fingerprint = _fingerprint(self._config.watched_files())
        self._rejected: tuple[tuple[str, int, int, int], ...] | None = None
        self._next_check = clock() + check_interval_seconds
        # Good verdicts stay for an hour (the hash in the key changes with the file); wrong ones a minute.
        self._cache = _AuthCache(max(auth_cache_seconds, 3600.0), auth_cache_seconds, 4096, clock)
        self._cache_key = os.urandom(32)
        self._bcrypt = bcrypt_pool or BcryptPool(clock=clock)
        self._tokens = float(self._config.rate_limit.burst) if self._config.rate_limit else 0.0
        self._tokens_at = clock()

    @property
    def path(self) -> Path:
        return self._path

    def current(self) -> WebConfig:
        """The configuration in force, after re-reading the files if they changed."""
        with self._lock:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + self._interval
                self._reload_if_changed(force=False)
            return self._config

    def reload(self) -> bool:
        """Re-read now (SIGHUP). True when the file is valid (and now in force)."""
        with self._lock:
            return self._reload_if_changed(force=True)

    def _reload_if_changed(self, force: bool) -> bool:
        # The fingerprint covers the files the *current* config names plus the config file;
        # a new config may name other files, which then join the fingerprint.
        fingerprint = _fingerprint(self._config.watched_files())
        if not force and (fingerprint == self._fingerprint or fingerprint == self._rejected):
            return True
        try:
            config = WebConfig.load(self._path)
        except Exception as exc:
            problems = exc.problems if isinstance(exc, WebConfigError) else [f"{self._path}: cannot be used: {exc!r}"]
            if force or fingerprint != self._rejected:
                self._log.error(
                    "web config %s has problems; keeping the previous one: %s",
                    self._path,
                    "; ".join(problems)[:4000],
                )
            self._rejected = fingerprint
            return False
        self._config = config
        self._fingerprint = _fingerprint(config.watched_files())
        self._rejected = None
        self._log.info("web config %s loaded (tls: %s)", self._path, "on" if config.tls else "off")
        return True

    def ssl_context(self) -> ssl.SSLContext | None:
        """The SSLContext for the next connection; None means serve plain HTTP."""
        return self.current().context

    def extra_headers(self) -> dict[str, str]:
        """Headers to add to every response (http_server_config.headers)."""
        return dict(self.current().headers)

    def authenticate(self, authorization: str | None, client: str = "") -> Future[bool | None]:
        """Whether the ``Authorization`` header value lets the request in, as a future.

        Done at once without basic_auth_users, for malformed headers and for cached
        verdicts (keyed by an HMAC of user, password and hash: never the password);
        otherwise bcrypt runs in the BcryptPool, where ``client`` (the peer address)
        decides the queue: a client that failed recently waits behind those that did not.
        None: not checked, ``client`` has too many checks waiting (answer 429).
        """
        users = self.current().basic_auth_users
        done: Future[bool | None] = Future()
        if not users:
            done.set_result(True)
            return done
        credentials = _parse_basic(authorization)
        if credentials is None:
            done.set_result(False)
            return done
        user, password = credentials
        known = user in users
        hashed = users[user] if known else _DECOY_HASH.decode()
        key = hmac.new(self._cache_key, b"\0".join((user.encode(), hashed.encode(), password)), "sha256").digest()
        verdict = self._cache.get(key)
        if verdict is not None:
            if not (known and verdict):
                self._bcrypt.mark_failed(client)
            done.set_result(known and verdict)
            return done
        checked = self._bcrypt.check(password, hashed.encode(), client)

        def finish(result: Future[bool | None]) -> None:
            ok = result.result()
            if ok is None:
                done.set_result(None)
                return
            self._cache.put(key, ok)
            if not (known and ok):
                self._bcrypt.mark_failed(client)
            done.set_result(known and ok)

        checked.add_done_callback(finish)
        return done

    def check_basic_auth(self, authorization: str | None, client: str = "") -> bool:
        """``authenticate`` waited for; False also when the check was refused as too many."""
        return self.authenticate(authorization, client).result() is True

    def allow_request(self) -> bool:
        """Token bucket of ``rate_limit``; False means answer 429. Always True without one."""
        limit = self.current().rate_limit
        if limit is None:
            return True
        with self._lock:
            now = self._clock()
            self._tokens = min(float(limit.burst), self._tokens + (now - self._tokens_at) / limit.interval_seconds)
            self._tokens_at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


def _parse_basic(authorization: str | None) -> tuple[str, bytes] | None:
    if not authorization:
        return None
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    return user.decode("utf-8", "replace"), password


def looks_like_http(first_bytes: bytes) -> bool:
    """True when the first bytes of a connection look like a plain HTTP request line."""
    return any(first_bytes.startswith(p) or p.startswith(first_bytes) for p in _HTTP_METHOD_PREFIXES)


def peer_sans(cert: Mapping[str, Any]) -> set[str]:
    """The subject alternative names of a peer certificate (``SSLSocket.getpeercert()``)."""
    return {str(value) for _kind, value in cert.get("subjectAltName", ())}
