"""The ``tls_server_config`` section of a web config, validated into a TlsServerConfig.

``parse_tls`` reads the certificate and key (files relative to the web config's folder, or inline
PEM), client authentication, versions and cipher suites, adding every problem as one line; the
SSLContext is built from the result by ``gpumon.http.tls``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.http.tls import CIPHER_SUITES, CLIENT_AUTH_ALIASES, CLIENT_AUTH_TYPES, TLS_VERSIONS, TlsServerConfig
from gpumon.util.yamlfile import brief

SHOWN_CHARACTERS = 200
"""A value quoted in an error is cut to about this many characters: a problem stays one readable line."""
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
_NEEDS_CLIENT_CA = ("RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")


@dataclass(frozen=True)
class _Section:
    """The ``tls_server_config`` mapping being read: its file names resolve against ``base``, its
    problems go to ``problems``, each starting with ``where`` (the web config's path)."""

    raw: dict[Any, Any]
    base: Path
    problems: list[str]
    where: str

    def text(self, key: str) -> str | None:
        """A string setting; None when absent or empty."""
        value = self.raw.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            self.problems.append(f"{self.where}: tls_server_config.{key} must be a string")
            return None
        return value

    def file(self, key: str) -> Path | None:
        """A file setting, resolved against the web config's folder (a problem when not a readable file)."""
        value = self.text(key)
        if value is None:
            return None
        resolved = self.base / value
        shown = brief(str(resolved), SHOWN_CHARACTERS)
        if not resolved.is_file():
            self.problems.append(f"{self.where}: tls_server_config.{key} {shown}: no such file")
        elif not os.access(resolved, os.R_OK):
            self.problems.append(f"{self.where}: tls_server_config.{key} {shown}: not readable by this user")
        return resolved


def parse_tls(raw: Any, base: Path, problems: list[str], where: str) -> TlsServerConfig | None:
    """The section, or None for plain HTTP (no section, or one naming neither certificate nor key, as in Go)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        problems.append(f"{where}: tls_server_config must be a mapping")
        return None
    for key in raw:
        if key not in _TLS_KEYS:
            problems.append(f"{where}: unknown key tls_server_config.{key}")
    section = _Section(raw, base, problems, where)
    cert_file, key_file, cert_pem, key_pem = (
        section.file("cert_file"),
        section.file("key_file"),
        section.text("cert"),
        section.text("key"),
    )
    client_ca_file, client_ca_pem = section.file("client_ca_file"), section.text("client_ca")
    has_cert = raw.get("cert_file") or raw.get("cert")
    has_key = raw.get("key_file") or raw.get("key")
    if not has_cert and not has_key:
        # exporter-toolkit: a TLS section without certificate and key means plain HTTP.
        return None
    _check_pairs(section, bool(has_cert), bool(has_key))
    auth = _client_auth(section, has_ca=client_ca_file is not None or client_ca_pem is not None)
    sans = _allowed_sans(section, auth)
    min_version, max_version = _versions(section)
    suites, prefer = _cipher_suites(section)
    return TlsServerConfig(
        cert_file=cert_file,
        key_file=key_file,
        cert_pem=cert_pem,
        key_pem=key_pem,
        client_auth_type=auth,
        client_ca_file=client_ca_file,
        client_ca_pem=client_ca_pem,
        client_allowed_sans=sans,
        min_version=min_version,
        max_version=max_version,
        cipher_suites=suites,
        prefer_server_cipher_suites=prefer,
    )


def _check_pairs(section: _Section, has_cert: bool, has_key: bool) -> None:
    """Each PEM given once (inline or as a file), and the certificate and key together."""
    problems, where = section.problems, section.where
    for a, b in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if section.raw.get(a) and section.raw.get(b):
            problems.append(f"{where}: tls_server_config: give {a} or {b}, not both")
    if not has_cert:
        problems.append(f"{where}: tls_server_config: key given but cert_file (or cert) missing")
    if not has_key:
        problems.append(f"{where}: tls_server_config: cert given but key_file (or key) missing")


def _client_auth(section: _Section, has_ca: bool) -> str:
    """``client_auth_type`` (Go's names or their aliases), with a client CA exactly when it verifies one."""
    problems, where = section.problems, section.where
    auth = section.text("client_auth_type") or "NoClientCert"
    auth = CLIENT_AUTH_ALIASES.get(auth, auth)
    if auth not in CLIENT_AUTH_TYPES:
        problems.append(
            f"{where}: tls_server_config.client_auth_type {brief(auth, SHOWN_CHARACTERS)} is not one of {', '.join(CLIENT_AUTH_TYPES)}"
        )
    elif auth == "NoClientCert" and has_ca:
        problems.append(f"{where}: tls_server_config: client_ca_file is set but client_auth_type is NoClientCert")
    elif auth in _NEEDS_CLIENT_CA and not has_ca:
        problems.append(f"{where}: tls_server_config: client_auth_type {auth} needs client_ca_file")
    return auth


def _allowed_sans(section: _Section, auth: str) -> tuple[str, ...]:
    """``client_allowed_sans``: only where a client certificate is required."""
    sans = section.raw.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        section.problems.append(f"{section.where}: tls_server_config.client_allowed_sans must be a list of strings")
        sans = []
    elif sans and auth not in ("RequireAnyClientCert", "RequireAndVerifyClientCert"):
        section.problems.append(
            f"{section.where}: tls_server_config.client_allowed_sans needs client_auth_type "
            "RequireAndVerifyClientCert (or RequireAnyClientCert)"
        )
    return tuple(sans)


def _versions(section: _Section) -> tuple[str, str]:
    """``min_version`` and ``max_version`` (TLS12 and TLS13 by default), the first not above the second."""
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = section.text(key) or default
        if value not in TLS_VERSIONS:
            section.problems.append(
                f"{section.where}: tls_server_config.{key} {brief(value, SHOWN_CHARACTERS)} is not one of {', '.join(TLS_VERSIONS)}"
            )
            value = default
        versions[key] = value
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        section.problems.append(f"{section.where}: tls_server_config: min_version is above max_version")
    return versions["min_version"], versions["max_version"]


def _cipher_suites(section: _Section) -> tuple[tuple[str, ...], bool]:
    """``cipher_suites`` (known and secure ones only), ``prefer_server_cipher_suites``; and
    ``curve_preferences``, which must be a list (accepted, not applied: OpenSSL picks the curves)."""
    problems, where, raw = section.problems, section.where, section.raw
    suites = raw.get("cipher_suites") or []
    if not isinstance(suites, list):
        problems.append(f"{where}: tls_server_config.cipher_suites must be a list")
        suites = []
    for suite in suites:
        if not isinstance(suite, str) or suite not in CIPHER_SUITES:
            problems.append(
                f"{where}: tls_server_config.cipher_suites: unknown or insecure suite {brief(suite, SHOWN_CHARACTERS)} "
                f"(known: {', '.join(CIPHER_SUITES)})"
            )
    prefer = raw.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        problems.append(f"{where}: tls_server_config.prefer_server_cipher_suites must be true or false")
        prefer = True
    curves = raw.get("curve_preferences")
    if curves is not None and not isinstance(curves, list):
        problems.append(f"{where}: tls_server_config.curve_preferences must be a list")
    return tuple(s for s in suites if s in CIPHER_SUITES), prefer
