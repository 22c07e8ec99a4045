"""Fixtures of the alerting tests."""

from tests.alerts.helpers import receiver

__all__ = ["receiver"]
