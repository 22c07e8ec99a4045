"""The log lines of XIDs: one per distinct fault, with a count, however many times the driver repeats it.

An XID storm writes the same fault hundreds of thousands of times (NVIDIA/NVSentinel#1120: about
800,000 lines of XID 95 for 29 distinct events). gpumon counts every one (``gpumon_xid_errors_total``),
but logs the first XID of a GPU (or PCI bus, when the GPU is not known) and code at once, and its
repeats in one summary line per ``interval_seconds``: ``XID 95 on GPU 3 repeated 799,999 times in the
last 60 s``. Summaries that are due are written by the next XID of that fault or by ``flush`` (the
tracker calls it every poll). At most ``max_faults`` distinct faults are remembered; beyond, repeats
of the others share one summary line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpumon.model.xid import XidEvent

INTERVAL_SECONDS = 60.0
MAX_FAULTS = 1024
_Key = tuple[str, int]


@dataclass
class _Repeats:
    since: float
    """When the last line about this fault was written (``clock``)."""
    count: int = 0
    """Repeats not written yet."""


class XidLog:
    """Thread-safe: the XID event thread and the kernel-log follower call ``note``."""

    def __init__(
        self,
        logger: logging.Logger,
        clock: Callable[[], float] = time.monotonic,
        interval_seconds: float = INTERVAL_SECONDS,
        max_faults: int = MAX_FAULTS,
    ) -> None:
        self._log = logger
        self._clock = clock
        self._interval = interval_seconds
        self._max = max_faults
        self._lock = threading.Lock()
        self._faults: dict[_Key, _Repeats] = {}

    def note(self, event: XidEvent, where: str, detail: str = "") -> None:
        """One counted XID on ``where`` (``GPU 3``, or ``PCI 00000000:AA:00.0, which is none of the GPUs
        gpumon watches``): logged when it is the first of its fault, else counted for the summary."""
        key = (where, event.xid)
        now = self._clock()
        due: list[tuple[_Key, int, float]] = []
        with self._lock:
            repeats = self._faults.get(key)
            if repeats is None and len(self._faults) >= self._max:
                key = ("other GPUs and codes", 0)
                repeats = self._faults.setdefault(key, _Repeats(since=now))
            if repeats is None:
                self._faults[key] = _Repeats(since=now)
            else:
                repeats.count += 1
                if now - repeats.since >= self._interval:
                    due.append((key, repeats.count, now - repeats.since))
                    repeats.since, repeats.count = now, 0
        if repeats is None:
            self._log.warning("XID %d on %s%s", event.xid, where, f" ({detail})" if detail else "")
        self._write(due)

    def flush(self) -> None:
        """Write the summaries that are due (repeats not written for ``interval_seconds``)."""
        if not self._faults:  # every poll of a host that saw no XID: no clock, no lock
            return
        now = self._clock()
        with self._lock:
            due = [
                (k, r.count, now - r.since)
                for k, r in self._faults.items()
                if r.count and now - r.since >= self._interval
            ]
            for key, _, _ in due:
                self._faults[key].since, self._faults[key].count = now, 0
        self._write(due)

    def _write(self, due: list[tuple[_Key, int, float]]) -> None:
        for (where, code), count, seconds in due:
            what = f"XID {code} on {where}" if code else f"XIDs on {where}"
            self._log.warning("%s repeated %s times in the last %.0f s", what, f"{count:,}", seconds)
