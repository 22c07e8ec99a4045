"""Operator clears (``gpumon health clear``) on disk: one file each under ``HEALTH/clears.d``, mode 0644
(the daemon reads them whoever wrote them: root, the admin group, the service user), made under a
temporary name and linked in, so a clear is never replaced by a later one: together they are the audit
trail. ``clears.json``, where an older gpumon kept them all in one file, is still read. What cannot be
read is listed (the health service says so), never silently ignored. Files are named by the clear's time
(nanoseconds, 20 digits), so their names sort as their times: the newest _MAX_CLEAR_FILES are read (a
clear older than those stays on disk for the audit; what it cleared is already resolved in xid.json).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.util.state.files import STATE_FILE_MODE, DamagedFile, ensure_dir, health_dir, json_text, read_state_json

CLEARS_DIR = "clears.d"
LEGACY_CLEARS = "clears.json"
_MAX_CLEAR_FILES = 10_000
_MAX_CLEAR_BYTES = 64 * 1024


@dataclass(frozen=True)
class Clear:
    """An operator's clear of one GPU's XID faults (``gpumon health clear``)."""

    gpu: int
    reason: str
    at_seconds: float
    user: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "reason": self.reason, "at_seconds": self.at_seconds, "user": self.user}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Clear:
        return cls(
            gpu=int(raw["gpu"]),
            reason=str(raw["reason"]),
            at_seconds=float(raw["at_seconds"]),
            user=str(raw.get("user", "")),
        )


@dataclass(frozen=True)
class ClearsRead:
    """The operator clears in a health folder, and what could not be read (path: reason)."""

    clears: list[Clear]
    unreadable: list[str]


def _clear_entries(path: Path) -> list[object]:
    """The clear(s) in one file: a list (``clears.json``) or one mapping (``clears.d/*.json``), read through
    the bounded state reader (no FIFO, device or link). Raises OSError (the file cannot be read) or
    DamagedFile (it is not a clears file)."""
    raw = read_state_json(path, max_bytes=_MAX_CLEAR_BYTES * 16)
    return raw if isinstance(raw, list) else [raw]


def read_clears(folder: Path) -> ClearsRead:
    """Every operator clear in the health ``folder``: ``clears.d/*.json`` and the older ``clears.json``."""
    clears: list[Clear] = []
    unreadable: list[str] = []
    files = [folder / LEGACY_CLEARS] if (folder / LEGACY_CLEARS).exists() else []
    try:
        files += sorted(
            folder / CLEARS_DIR / name
            for name in os.listdir(folder / CLEARS_DIR)
            if name.endswith(".json") and not name.startswith(".")
        )[-_MAX_CLEAR_FILES:]  # named by time: the newest, so a new clear always counts
    except FileNotFoundError:
        pass
    except OSError as exc:
        unreadable.append(f"{folder / CLEARS_DIR}: {exc.strerror or exc}")
    for path in files:
        try:
            entries = _clear_entries(path)
        except OSError as exc:
            unreadable.append(f"{path}: {exc.strerror or exc}")
            continue
        except DamagedFile as exc:
            unreadable.append(f"{path}: not a clear gpumon wrote ({exc})")
            continue
        for entry in entries:
            try:
                clears.append(Clear.from_json(entry))  # type: ignore[arg-type]
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
    return ClearsRead(clears, unreadable)


def add_clear(state_dir: Path, clear: Clear, simulated: str | None = None) -> Path:
    """Record an operator clear as a new file of ``clears.d`` in the health folder (``health_dir``) of
    ``state_dir``, mode 0644 so the daemon reads it whoever wrote it, never replaced so every clear stays
    (the audit trail). Returns the file."""
    clears = health_dir(state_dir, simulated) / CLEARS_DIR
    ensure_dir(clears)
    user = re.sub(r"[^A-Za-z0-9_.-]+", "_", clear.user)[:32] or "unknown"
    name = f"{int(clear.at_seconds * 1e9):020d}-{os.getpid()}-{user}.json"
    tmp = clears / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, STATE_FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fh.fileno(), STATE_FILE_MODE)  # whatever the umask
            fh.write(json_text(clear.to_json()))
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, clears / name)  # fails rather than replace an existing clear
    finally:
        tmp.unlink(missing_ok=True)
    return clears / name
