"""Jobs a Slurm prolog or epilog let through because gpumon could not judge the node, counted.

A prolog that cannot judge (a bad config, a daemon named with ``--daemon-url`` that does not
answer, GPUs that do not answer within the prolog's budget, an UNKNOWN verdict) exits 0 and the
job runs: a typo in a shared config must not drain a fleet. So that this is never silent, each
such run appends one line to ``STATE_DIR/health/unjudged.jsonl``::

    {"hook": "prolog", "job": "42", "reason": "...", "time_seconds": 1700000000.0}

(O_APPEND: concurrent prologs never lose a line) and the daemon exports the count:

* ``gpumon_health_unjudged_total{hook}`` — runs of the prolog / epilog that could not judge
* ``gpumon_health_unjudged_last_timestamp_seconds{hook}`` — Unix time of the last one (absent before)
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from gpumon.model.families import Family
from gpumon.util.boundedfile import read_up_to
from gpumon.util.state.files import append_line, health_dir

HOOKS = ("prolog", "epilog")
FILE_NAME = "unjudged.jsonl"


READ_BYTES = 1 << 20
"""The most a scrape reads of the file (about 5,000 lines); what is left is read by the next scrapes."""


def unjudged_path(state_dir: str | Path) -> Path:
    return health_dir(state_dir) / FILE_NAME


def record_unjudged(state_dir: str | Path, hook: str, reason: str, job: str, time_seconds: float) -> None:
    """Append one line; raises OSError when the state directory cannot be written."""
    append_line(unjudged_path(state_dir), {"hook": hook, "job": job, "reason": reason, "time_seconds": time_seconds})


class UnjudgedCollector:
    """``UnjudgedCollector(state_dir)``: a metric source reading the file incrementally (from where
    the last scrape stopped; from the start again when the file was replaced or truncated)."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = unjudged_path(state_dir)
        self._inode: int | None = None
        self._offset = 0
        self._counts = dict.fromkeys(HOOKS, 0)
        self._last: dict[str, float] = {}

    def _read_new(self) -> None:
        """Up to READ_BYTES of what was appended since the last scrape, from a regular file only
        (opened without following a FIFO's wait; a device or FIFO linked in its place is not read)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            if st.st_ino != self._inode or st.st_size < self._offset:
                self._inode, self._offset = st.st_ino, 0
                self._counts, self._last = dict.fromkeys(HOOKS, 0), {}
            os.lseek(fd, self._offset, os.SEEK_SET)
            data = read_up_to(fd, READ_BYTES)
        except OSError:
            return
        finally:
            os.close(fd)
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next scrape
        if not complete and len(data) > READ_BYTES:  # no line ends within the read: not ours, skipped
            self._offset += len(data)
            return
        self._offset += len(complete)
        for line in complete.splitlines():
            try:
                entry = json.loads(line)
                hook, when = str(entry["hook"]), float(entry["time_seconds"])
            except (ValueError, KeyError, TypeError):
                continue
            if hook not in HOOKS:
                continue
            self._counts[hook] += 1
            self._last[hook] = max(self._last.get(hook, when), when)

    def families(self) -> Iterator[Family]:
        self._read_new()
        total = Family(
            "gpumon_health_unjudged_total",
            "counter",
            "Runs of gpumon health as Slurm prolog or epilog that could not judge the node and let the job through.",
            ("hook",),
            plain_labels=True,
        )
        last = Family(
            "gpumon_health_unjudged_last_timestamp_seconds",
            "gauge",
            "Unix time of the last run of gpumon health as Slurm prolog or epilog that could not judge the node.",
            ("hook",),
            plain_labels=True,
        )
        for hook in sorted(self._counts):
            total.add([hook], self._counts[hook])
            if hook in self._last:
                last.add([hook], self._last[hook])
        yield total
        yield last
