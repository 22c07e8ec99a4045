"""The counted XIDs of the XID lifecycle within its windows, bounded under an XID storm.

A storm repeats one fault hundreds of thousands of times (NVIDIA/NVSentinel#1120: about 800,000 lines of
XID 95 for 29 distinct events). Every event is still counted, but once one GPU and code hold
``per_code`` entries, a new event of them is folded into the latest entry: its ``n`` (events it stands
for) grows and its ``ts`` moves to the newest. So the list, ``xid.json`` and the work per event stay
bounded by GPUs x codes, not by events. A folded entry counts all its events at its newest time: in
windows (escalation, transient WARNING) a storm's older events count a little longer than they
happened, never less.

Entries are the JSON of ``xid.json``'s ``recent``: ``{gpu, uuid, xid, ts, deferred, id}``, with ``n``
once folded, ``resolved`` once their fault was resolved, ``matched`` for an entry of a gpumon before
XID identities that a re-read record matched.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PER_CODE = 16
"""Entries kept per GPU and code (and deferred or not) before new events are folded into the latest."""

_Key = tuple[int, int, bool]


def events_of(entry: dict[str, Any]) -> int:
    """How many XID events ``entry`` stands for (1 unless folded)."""
    n = entry.get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def _key(entry: dict[str, Any]) -> _Key:
    return int(entry["gpu"]), int(entry["xid"]), bool(entry.get("deferred"))


class RecentXids:
    """The list of recent entries with an index by (GPU, code, deferred). Not thread-safe."""

    def __init__(self, entries: Iterable[dict[str, Any]] = (), per_code: int = PER_CODE) -> None:
        self.per_code = max(1, per_code)
        self.entries: list[dict[str, Any]] = []
        self._by_key: dict[_Key, list[dict[str, Any]]] = {}
        self._legacy = 0
        self.replace(list(entries))

    def replace(self, entries: list[dict[str, Any]]) -> None:
        """Take ``entries`` (kept in order) as the list and index them again."""
        self.entries = entries
        self._by_key = {}
        for entry in entries:
            self._by_key.setdefault(_key(entry), []).append(entry)
        self._legacy = sum(1 for e in entries if "id" not in e and not e.get("matched"))

    def __iter__(self) -> Any:
        return iter(self.entries)

    def add(self, entry: dict[str, Any]) -> bool:
        """Append ``entry``, or fold it into the latest of its GPU and code once they hold ``per_code``
        (that latest not resolved). True when it is the first entry of its GPU, code and deferral."""
        same = self._by_key.setdefault(_key(entry), [])
        latest = same[-1] if same else None
        if latest is not None and len(same) >= self.per_code and not latest.get("resolved"):
            latest["n"] = events_of(latest) + 1
            latest["ts"] = max(float(latest["ts"]), float(entry["ts"]))
            latest["id"] = entry.get("id", latest.get("id"))
            return False
        self.entries.append(entry)
        same.append(entry)
        return latest is None

    def count(self, gpu: int, code: int, ts: float, window: float) -> int:
        """Events (not deferred) of ``code`` on ``gpu`` within ``window`` seconds up to ``ts``."""
        return sum(events_of(e) for e in self._by_key.get((gpu, code, False), ()) if 0 <= ts - e["ts"] <= window)

    def predecessor(self, gpu: int, code: int, ts: float, follows: tuple[int, ...] | None, window: float) -> int | None:
        """The code of the latest XID (not deferred, not ``code``) on ``gpu`` within ``window`` seconds
        before ``ts`` that ``follows`` allows (None: any code); None when there is none."""
        best: tuple[float, int] | None = None
        for (g, other, deferred), same in self._by_key.items():
            if g != gpu or deferred or other == code or (follows is not None and other not in follows):
                continue
            for e in reversed(same):  # newest first: usually the first one fits
                if 0 <= ts - e["ts"] <= window:
                    if best is None or e["ts"] > best[0]:
                        best = (float(e["ts"]), other)
                    break
        return None if best is None else best[1]

    def match_legacy(self, gpu: int, code: int, ts: float, within: float) -> bool:
        """An entry without an ``id`` (recorded by a gpumon before XID identities) of ``gpu`` and ``code``
        within ``within`` seconds of ``ts``, not matched yet: marked matched, True. Free when none is left."""
        if not self._legacy:
            return False
        for entry in self._by_key.get((gpu, code, False), []) + self._by_key.get((gpu, code, True), []):
            if "id" not in entry and not entry.get("matched") and abs(entry["ts"] - ts) <= within:
                entry["matched"] = True
                self._legacy -= 1
                return True
        return False
