"""Atomic JSON files under the state directory: written to a temporary file, fsynced, renamed."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

HEALTH_DIR = "health"


def health_dir(state_dir: str | Path) -> Path:
    """``STATE_DIR/health``: inventory baseline, XID lifecycle, operator clears, action log."""
    return Path(state_dir) / HEALTH_DIR


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` in one rename (flushed and fsynced first, then given ``mode``):
    a reader sees the old or the new file, never half. The folder must exist."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_text(data: Any) -> str:
    """``data`` as the JSON every gpumon file and ``--json`` output uses: indented, keys sorted, a final newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_json(path: Path, data: Any) -> None:
    """Replace the state file ``path`` with ``data`` as JSON (readable by its owner only), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json_text(data), mode=0o600)


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing or unreadable (a damaged file is not fatal)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def append_line(path: Path, data: Any) -> None:
    """Append one JSON line (the action log); O_APPEND keeps concurrent writers' lines whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(data, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
