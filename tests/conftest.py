"""Fixtures shared by every test module (helpers live in tests/helpers.py)."""

from tests.helpers import start_daemon

__all__ = ["start_daemon"]
