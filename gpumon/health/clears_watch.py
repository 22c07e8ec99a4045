"""The operator clears as the health service sees them: read again only when their files changed (a report
is made every poll); clears that cannot be read are logged once, shown as a finding, and tried again."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from gpumon.health.clears import CLEARS_DIR, LEGACY_CLEARS, Clear, ClearsRead, read_clears
from gpumon.model.findings import WARNING, Finding
from gpumon.util.file_stamp import file_stamp as stat_key


class ClearsWatch:
    """The clears of some health folders. Not thread-safe: the owner locks."""

    def __init__(self, folders: Sequence[Path], log: logging.Logger) -> None:
        """``folders``: where clears are read, in order; ``log``: the owner's, which says what cannot be read."""
        self.folders = list(folders)
        self.paths = [p for f in self.folders for p in (f / CLEARS_DIR, f / LEGACY_CLEARS)]
        """The clears files and folders, whose stat keys say whether a cached report still holds."""
        self._log = log
        self._read: tuple[object, ClearsRead] | None = None
        """The clears files' stat keys when they were last read, and what was read."""
        self._said: tuple[str, ...] = ()
        """The unreadable clears last logged (each problem is logged once)."""

    def clears(self, key: tuple[object, ...] | None = None) -> list[Clear]:
        """The operator clears, read again only when their files changed (or some could not be read); ``key``:
        the stamps of ``paths`` as the caller just took them (taken here when None)."""
        key = tuple(stat_key(p) for p in self.paths) if key is None else key
        kept = self._read
        if kept is None or kept[0] != key or kept[1].unreadable:  # unreadable: tried again (perhaps fixed)
            parts = [read_clears(folder) for folder in self.folders]
            read = ClearsRead([c for p in parts for c in p.clears], [u for p in parts for u in p.unreadable])
            kept = self._read = (key, read)
            said = tuple(kept[1].unreadable)
            if said and said != self._said:
                self._log.error(
                    "cannot read %d operator clear(s), not applied: %s (clears are written 0644 by gpumon "
                    "health clear; one written otherwise must be made readable to this user)",
                    len(said),
                    "; ".join(said[:5]),
                )
            self._said = said
        return kept[1].clears

    def last_read(self) -> list[Clear] | None:
        """The clears as last read by ``clears()``, None before the first read."""
        return None if self._read is None else self._read[1].clears

    def findings(self) -> list[Finding]:
        """A WARNING while clears cannot be read (as of the last read)."""
        kept = self._read
        if kept is None or not kept[1].unreadable:
            return []
        problems = kept[1].unreadable
        return [
            Finding(
                kind="clears_unreadable",
                severity=WARNING,
                action="none",
                summary=f"{len(problems)} operator clear(s) cannot be read and are not applied ({problems[0]})",
                evidence={"unreadable": problems[:20]},
            )
        ]
