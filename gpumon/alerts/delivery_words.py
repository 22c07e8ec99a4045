"""Alert delivery's failures and recoveries in words, for the log and ``gpumon alerts``.

"Alertmanager at http://am:9093: connection refused (3 tries, next in 8 s)" when a delivery fails,
"Alertmanager at http://am:9093: delivered again after 2 min (5 failed tries)" when it comes back.
"""

from __future__ import annotations

from gpumon.util.net_words import duration_words

_KIND_WORDS = {"alertmanager": "Alertmanager", "webhook": "webhook"}


def receiver_words(kind: str, name: str) -> str:
    """Which receiver: "Alertmanager at URL" or "webhook at URL" (``name``: its URL without a password)."""
    return f"{_KIND_WORDS.get(kind, kind)} at {name}"


def failure_line(kind: str, name: str, detail: str, tries: int, next_in_seconds: float) -> str:
    """A failed delivery: the receiver, why (``detail``), failed tries in a row, when the next one is."""
    count = "1 try" if tries == 1 else f"{tries} tries"
    return f"{receiver_words(kind, name)}: {detail} ({count}, next in {duration_words(next_in_seconds)})"


def recovery_line(kind: str, name: str, failing_seconds: float, failed_tries: int) -> str:
    """A delivery that succeeded after ``failed_tries`` failed ones over ``failing_seconds``."""
    count = "1 failed try" if failed_tries == 1 else f"{failed_tries} failed tries"
    return f"{receiver_words(kind, name)}: delivered again after {duration_words(failing_seconds)} ({count})"
