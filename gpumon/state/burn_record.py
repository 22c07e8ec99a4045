"""Files ``gpumon burn`` leaves in the state directory for the daemon.

* ``<state_dir>/burn/running.json`` — ``{"pid", "gpus": [indices], "uuids": [...], "started_at"}``
  while a burn runs (the alert engine holds back temperature/power alerts for those GPUs);
  removed at the end, also on failure and Ctrl-C. The format is agreed with alerting: keep it.
* ``<state_dir>/burn/last.json`` — the last report (see docs/burn.md), written atomically;
  ``gpumon.exposition.burn_results`` exports it.

When the directory is not writable (a user without root), one warning is printed and the
burn carries on without these files.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumon.util.state.files import STATE_FILE_MODE, write_json

MARKER_NAME = "running.json"
LAST_NAME = "last.json"
MAX_BURN_FILE_BYTES = 4 * 1024 * 1024
"""The largest burn file the daemon reads (a report of 64 GPUs is about 100 KiB): a bigger one is not a
burn's, nor is anything but a regular file (a FIFO, /dev/zero, a link), read through
``gpumon.util.state.files.read_state_json``."""


def burn_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "burn"


def pid_alive(pid: object) -> bool:
    """Whether process ``pid`` exists (also when it belongs to another user); False for a non-pid.

    A marker whose pid is gone was left by a burn killed with SIGKILL: it is stale.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` via a temporary file and rename (readers never see half a file),
    mode 0644; its folders made 0755 whatever the umask and, made by root in the service user's state
    directory, given to that user; never through a link another user planted (gpumon.util.state.files)."""
    write_json(path, data, mode=STATE_FILE_MODE)


@dataclass
class StateFiles:
    """Writes the marker and last.json, warning once if the state directory is not writable."""

    state_dir: str
    warn: Callable[[str], None]
    _warned: bool = False
    _marker_written: bool = field(default=False)

    @property
    def marker_path(self) -> Path:
        return burn_dir(self.state_dir) / MARKER_NAME

    @property
    def last_path(self) -> Path:
        return burn_dir(self.state_dir) / LAST_NAME

    def _try(self, what: str, action: Callable[[], None]) -> bool:
        try:
            action()
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                self.warn(
                    f"warning: cannot write {what} in {burn_dir(self.state_dir)} ({exc.strerror or exc}); "
                    "the daemon will not see this run (use --state-dir)"
                )
            return False

    def write_marker(self, pid: int, gpus: list[int], uuids: list[str], started_at: float) -> None:
        data = {"pid": pid, "gpus": gpus, "uuids": uuids, "started_at": started_at}
        self._marker_written = True  # first: a stop (Ctrl-C, SIGTERM) while it is written still removes it
        self._marker_written = self._try("the running marker", lambda: write_json_atomic(self.marker_path, data))

    def remove_marker(self) -> None:
        if self._marker_written:
            self._marker_written = False
            self._try("the running marker", lambda: self.marker_path.unlink(missing_ok=True))

    def write_last(self, report: dict[str, Any]) -> None:
        self._try("the last report", lambda: write_json_atomic(self.last_path, report))
