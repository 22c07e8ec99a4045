"""Test certificates made with the openssl command line tool (tests of TLS serving and sending)."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPENSSL = shutil.which("openssl")


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_server_cert: Path
    other_server_key: Path
    stranger_cert: Path
    stranger_key: Path
    """A client certificate from a CA the server does not trust."""


def _openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_ca(d: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip


def _make_leaf(d: Path, name: str, ca: str, san: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip


def make_pki(d: Path) -> Pki:
    """A CA, server and client certificates signed by it, and a stranger CA's client, in ``d``."""
    _make_ca(d, "ca")
    _make_ca(d, "stranger-ca")
    _make_leaf(d, "server", "ca", "DNS:localhost,IP:127.0.0.1")
    _make_leaf(d, "server2", "ca", "DNS:localhost,IP:127.0.0.1")
    _make_leaf(d, "client", "ca", "DNS:prometheus.example")
    _make_leaf(d, "stranger", "stranger-ca", "DNS:prometheus.example")
    return Pki(
        d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
        d / "server2.crt", d / "server2.key", d / "stranger.crt", d / "stranger.key",
    )  # fmt: skip
