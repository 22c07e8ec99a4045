"""Slurm's view of its nodes, parsed: ``sinfo --json`` (Slurm 21.08 and later) and ``scontrol show node -o``.

``scontrol show node -o`` prints ``Reason=`` followed by ``Comment=``, ``ReservationName=`` and more:
the reason ends at Slurm's ``[user@time]`` suffix, never at the end of the line.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace

UNUSABLE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "FUTURE"})
"""State words of a node that cannot take new work."""


class SlurmError(Exception):
    """sinfo / scontrol failed or did not answer."""


@dataclass(frozen=True)
class NodeState:
    """One node as Slurm reports it."""

    name: str
    state: str
    """e.g. IDLE, MIXED+DRAIN, DOWN+DRAIN+NOT_RESPONDING."""
    reason: str
    """The reason without Slurm's ``[user@time]`` suffix; empty when none."""
    partitions: tuple[str, ...]
    reason_time_seconds: float | None = None
    """When the reason was set, Unix seconds on the controller's clock (whole seconds); None if unknown."""

    @property
    def words(self) -> frozenset[str]:
        return frozenset(w for w in self.state.upper().split("+") if w)

    @property
    def drained(self) -> bool:
        """Draining or drained (``DRAIN`` flag), whoever set it."""
        return bool(self.words & {"DRAIN", "DRAINED", "DRAINING"})

    @property
    def unusable(self) -> bool:
        """Cannot take new work: drained, down, failed, not responding or not yet in service."""
        return bool(self.words & UNUSABLE)


_SUFFIX = re.compile(r" \[[^\[\]@ ]*@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\](?= [A-Za-z][A-Za-z0-9_]*=|\s*$)")
"""Slurm's ``[user@time]`` after a reason, followed by the next field or the end of the line."""
_NEXT_FIELD = re.compile(r" (?=[A-Za-z][A-Za-z0-9_]*=)")
_AFTER_REASON = re.compile(r" (?=(?:Comment|Extra|ReservationName|ResumeAfterTime|NextState|Features)=)")


def parse_nodes(text: str) -> list[NodeState]:
    """Nodes from ``scontrol show node -o`` (one node per line, ``Key=Value`` pairs).

    Values may hold spaces and ``=``; fields such as ``Comment=`` follow ``Reason=``. The reason
    ends at Slurm's ``[user@time]`` suffix (without one, at the next field Slurm prints after it).
    """
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("NodeName="):
            continue
        head, found, rest = line.partition(" Reason=")
        reason, at = "", None
        if found:
            suffix = _SUFFIX.search(rest)
            if suffix:
                reason = rest[: suffix.start()]
                at = _local_seconds(suffix.group(1))
            else:
                reason = _AFTER_REASON.split(rest, maxsplit=1)[0]
        fields = dict(tok.split("=", 1) for tok in _NEXT_FIELD.split(head) if "=" in tok)
        partitions = tuple(p for p in fields.get("Partitions", "").strip().split(",") if p)
        out.append(
            NodeState(
                name=fields["NodeName"].strip(),
                state=fields.get("State", "").strip(),
                reason=reason.strip(),
                partitions=partitions,
                reason_time_seconds=at,
            )
        )
    return out


def _local_seconds(stamp: str) -> float | None:
    """Slurm's ``YYYY-MM-DDTHH:MM:SS`` (the local time zone, as scontrol prints it) as Unix seconds."""
    try:
        return float(time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")))
    except (ValueError, OverflowError):
        return None


class ControllerSilent(SlurmError):
    """sinfo ran but the controller did not answer it (``errors`` and no node in ``sinfo --json``)."""


def parse_sinfo_json(text: str) -> list[NodeState]:
    """Nodes from ``sinfo --json`` (22.05: ``state`` + ``state_flags``; later: a list ``state`` and
    numbers as ``{"set": .., "number": ..}``). Raises SlurmError on anything else."""
    try:
        data = json.loads(text)
        raw_nodes = data["nodes"]
        errors = data.get("errors") or []
        if errors and not raw_nodes:  # sinfo exits 0 when slurmctld does not answer
            first = errors[0]
            said = (first.get("description") or first.get("error")) if isinstance(first, dict) else first
            raise ControllerSilent(f"the Slurm controller did not answer sinfo: {said or 'no nodes, errors only'}")
        out = []
        for raw in raw_nodes:
            state = raw.get("state", "")
            words = [str(w) for w in state] if isinstance(state, list) else [str(state)]
            words += [str(w) for w in raw.get("state_flags") or []]
            changed = raw.get("reason_changed_at")
            if isinstance(changed, dict):
                changed = changed.get("number") if changed.get("set", True) else None
            at = float(changed) if isinstance(changed, (int, float)) and changed > 0 else None
            partitions = raw.get("partitions") or []
            out.append(
                NodeState(
                    name=str(raw["name"]),
                    state="+".join(w.upper() for w in words if w),
                    reason=str(raw.get("reason") or "").strip(),
                    partitions=tuple(str(p) for p in partitions),
                    reason_time_seconds=at,
                )
            )
        merged: dict[str, NodeState] = {}
        for node in out:  # a node in several partitions may be listed once for each
            seen = merged.get(node.name)
            parts = node.partitions if seen is None else (*seen.partitions, *node.partitions)
            merged[node.name] = replace(node, partitions=tuple(dict.fromkeys(parts)))
        return list(merged.values())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SlurmError(f"sinfo --json answered something gpumon cannot read ({exc})") from exc
