"""Fixtures shared by every test module (helpers live in tests/helpers.py)."""

import pytest

from tests.helpers import start_daemon
from tests.pki import OPENSSL, Pki, make_pki

__all__ = ["pki", "start_daemon"]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates for TLS tests, made once per session; skips where openssl is missing."""
    if OPENSSL is None:
        pytest.skip("openssl command not installed (Debian package: openssl)")
    return make_pki(tmp_path_factory.mktemp("pki"))
