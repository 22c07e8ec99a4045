"""The alert spool: alert states and delivery queues on disk, written atomically.

One JSON file, ``<state_dir>/alerts/spool.json``, replaced as a whole
(``gpumon.util.state.files.write_text_atomic``): written to a temporary file in the same directory,
flushed and fsync'ed, then ``os.replace``d over the old one and the directory fsync'ed. A crash
(even SIGKILL) leaves either the old or the new file, never a torn one. A file that cannot be parsed is moved aside
(``spool.json.corrupt``) and gpumon starts empty rather than not at all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from gpumon.util.state.files import DamagedFile, read_state_json, remove_stale_temporaries, write_state_text

log = logging.getLogger(__name__)

SPOOL_VERSION = 1
LEGACY_TEMPORARIES = (".spool-*.tmp",)
"""The temporary files the spool's own writer named before it used the state directory's (``.spool.json.*``):
one a gpumon of then left when killed mid-write is removed like the others."""


class Spool:
    """Reads and atomically writes one JSON document."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = Path(state_dir) / "alerts"
        self.path = self.directory / "spool.json"
        self.set_aside = False
        """Whether ``load`` found the spool damaged and moved it aside."""

    def load(self) -> dict[str, Any]:
        """The saved document, or {} when there is none. Read through the state directory's bounded reader
        (gpumon.util.state.files.read_state_json): a file that is not what gpumon writes (not a regular file,
        too large, not UTF-8, not JSON, nested too deeply, not a spool of this version) is moved aside
        (``spool.json.corrupt``, kept for the operator), said in one line, and gpumon starts with no saved
        alerts rather than not at all. Temporary files a writer killed mid-write left are removed."""
        remove_stale_temporaries(self.directory, (self.path.name,), LEGACY_TEMPORARIES)
        try:
            data = read_state_json(self.path)
            if data is None:
                return {}
            if not isinstance(data, dict) or data.get("version") != SPOOL_VERSION:
                raise DamagedFile(f"not a gpumon alert spool of version {SPOOL_VERSION}")
        except OSError as exc:
            log.error("alert spool %s cannot be read (%s); starting with no saved alerts", self.path, exc.strerror)
            return {}
        except DamagedFile as exc:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.error("alert spool %s is not valid (%s); moved to %s, starting empty", self.path, exc, aside)
            self.set_aside = True
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            return {}
        return data

    def save(self, data: dict[str, Any]) -> None:
        """Replace the spool with ``data`` (plus the version), readable by its owner only (0600), through
        the state directory's atomic writer (its folder fsynced after the rename); raises OSError on failure."""
        body = json.dumps({**data, "version": SPOOL_VERSION}, separators=(",", ":"), sort_keys=True)
        write_state_text(self.path, body, mode=0o600)  # its folder made 0755, never through a planted link
