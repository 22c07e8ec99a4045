"""The marker ``gpumon burn`` leaves while it runs: ``<state_dir>/burn/running.json``.

Format (agreed with gpumon burn): ``{"pid": int, "gpus": [indices], "uuids": [...],
"started_at": unix seconds}``. The burn writes it at start and removes it at the end; a
marker whose pid is not alive (a burn killed with SIGKILL) is stale and ignored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpumon.state.burn_record import MARKER_NAME, MAX_BURN_FILE_BYTES, burn_dir, pid_alive
from gpumon.util.file_stamp import FileStamp, file_stamp
from gpumon.util.state.files import DamagedFile, read_state_json

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BurnHoldBack:
    """A running ``gpumon burn`` (from its marker file): which GPUs, since when."""

    pid: int
    gpu_indices: frozenset[int]
    uuids: frozenset[str]
    started_at: float
    """Unix seconds."""

    def covers(self, gpu: str, uuid: str) -> bool:
        return (uuid != "" and uuid in self.uuids) or (gpu.isdigit() and int(gpu) in self.gpu_indices)

    def note(self) -> str:
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at))
        return f"held back: gpumon burn running since {since} (pid {self.pid})"


def marker_path(state_dir: Path) -> Path:
    return burn_dir(state_dir) / MARKER_NAME


class BurnMarkerReader:
    """Reads the marker; re-parses only when the file changed, checks the pid every time."""

    def __init__(self, state_dir: Path, alive: Callable[[int], bool] = pid_alive) -> None:
        self.path = marker_path(state_dir)
        self._path_text = str(self.path)
        """The path as text, made once: ``os.stat`` of a Path calls its ``__fspath__`` and ``__str__`` (the
        health engines read the marker every poll)."""
        self._alive = alive
        self._key: FileStamp | None = None
        self._parsed: BurnHoldBack | None = None

    def read(self) -> BurnHoldBack | None:
        """The running burn, or None (no marker, a bad marker, or its process gone)."""
        key = file_stamp(self._path_text)
        if key is None:
            self._key, self._parsed = None, None
            return None
        if key != self._key:
            self._key = key
            self._parsed = self._parse()
        if self._parsed is None or not self._alive(self._parsed.pid):
            return None
        return self._parsed

    def _parse(self) -> BurnHoldBack | None:
        try:
            raw = read_state_json(self.path, MAX_BURN_FILE_BYTES)
            marker = BurnHoldBack(
                pid=int(raw["pid"]),
                gpu_indices=frozenset(int(i) for i in raw.get("gpus") or ()),
                uuids=frozenset(str(u) for u in raw.get("uuids") or ()),
                started_at=float(raw.get("started_at") or 0.0),
            )
        except (OSError, DamagedFile, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("ignoring burn marker %s: %s", self.path, exc)
            return None
        return marker
