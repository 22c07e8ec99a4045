"""TLS for the HTTP server: the validated ``tls_server_config`` and the SSLContext built from it.

``gpumon.http.webconfig`` validates the section into a ``TlsServerConfig``;
``build_context`` turns it into a server ``SSLContext`` (inline PEMs go through anonymous
in-memory files), listing what cannot be used. ``looks_like_http`` and ``peer_sans`` are what
the server needs per connection: telling a plain-HTTP client on a TLS port apart, and the
client certificate's names for ``client_allowed_sans``.

Differences from the Go implementation, all on the strict side: Python's ``ssl``
verifies every client certificate it asks for, so ``RequireAnyClientCert`` needs a
``client_ca_file`` and behaves like ``RequireAndVerifyClientCert``, and
``RequestClientCert`` verifies a certificate when one is sent and a CA is given.
``curve_preferences`` and ``http_server_config.http2`` are accepted and not applied
(gpumon speaks HTTP/1.1 and OpenSSL picks the curves). ``cipher_suites``
applies to TLS 1.2 only, as in Go.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CLIENT_AUTH_TYPES = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
CLIENT_AUTH_ALIASES = {"RequireClientCert": "RequireAnyClientCert"}
"""Older names exporter-toolkit still accepts -> the name they stand for."""

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

HTTP_ON_HTTPS_RESPONSE = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"Client sent an HTTP request to an HTTPS server.\n"
)
"""What a plain-HTTP client gets from a TLS port (the same words as Go's net/http)."""

_HTTP_METHOD_PREFIXES = (b"GET ", b"HEAD ", b"POST ", b"PUT ", b"OPTIO", b"DELET", b"PATCH", b"CONNE", b"TRACE")


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


def _memfd_path(name: str, pem: str) -> tuple[int, str]:
    """An anonymous in-memory file holding ``pem``, for ssl APIs that only take file names."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.write(fd, pem.encode())
    return fd, f"/proc/self/fd/{fd}"


def build_context(tls: TlsServerConfig, problems: list[str], where: str) -> ssl.SSLContext | None:
    """The server SSLContext for ``tls``; what cannot be used is added to ``problems``."""
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


def looks_like_http(first_bytes: bytes) -> bool:
    """True when the first bytes of a connection look like a plain HTTP request line."""
    return any(first_bytes.startswith(p) or p.startswith(first_bytes) for p in _HTTP_METHOD_PREFIXES)


def peer_sans(cert: Mapping[str, Any]) -> set[str]:
    """The subject alternative names of a peer certificate (``SSLSocket.getpeercert()``)."""
    return {str(value) for _kind, value in cert.get("subjectAltName", ())}
