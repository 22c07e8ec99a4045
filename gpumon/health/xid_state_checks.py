"""What a saved XID lifecycle (``xid.json``, ``XidLifecycle.to_json``) must hold: each check says whether an
entry has its keys with the types gpumon writes (a file of other types would fail later comparisons)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpumon.model.findings import ACTIONS, LIFECYCLE_OF_ACTION


def finite_number(value: Any) -> bool:
    """An int or a float (not a bool), neither infinite nor NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def whole_number(value: Any) -> bool:
    """An int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def none_or(value: Any, kind: type) -> bool:
    """None or an instance of ``kind``."""
    return value is None or isinstance(value, kind)


def valid_fault(f: dict[str, Any]) -> bool:
    """An open fault as ``XidLifecycle.record`` makes it."""
    escalated = f.get("escalated")
    return (
        whole_number(f.get("gpu"))
        and whole_number(f.get("xid"))
        and whole_number(f.get("count"))
        and finite_number(f.get("first_seconds"))
        and (f.get("last_seconds") is None or finite_number(f.get("last_seconds")))
        and f.get("action") in LIFECYCLE_OF_ACTION
        and f.get("lifecycle") in LIFECYCLE_OF_ACTION.values()
        and isinstance(f.get("meaning", ""), str)
        and none_or(f.get("uuid"), str)
        and none_or(f.get("source"), str)
        and (f.get("energy_joules") is None or finite_number(f.get("energy_joules")))
        and isinstance(f.get("followed_by", []), list)
        and all(whole_number(c) for c in f.get("followed_by", []))
        and (
            escalated is None
            or (
                isinstance(escalated, dict)
                and whole_number(escalated.get("count"))
                and finite_number(escalated.get("window_seconds"))
                and escalated.get("action") in ACTIONS
            )
        )
    )


def valid_recent(e: dict[str, Any]) -> bool:
    """A counted XID of ``XidLifecycle.recent``."""
    return (
        whole_number(e.get("gpu"))
        and whole_number(e.get("xid"))
        and finite_number(e.get("ts"))
        and none_or(e.get("uuid"), str)
        and none_or(e.get("id"), str)
    )


def valid_clear(c: dict[str, Any]) -> bool:
    """An applied operator clear (``Clear.to_json``)."""
    return whole_number(c.get("gpu")) and finite_number(c.get("at_seconds"))


def entries(raw: dict[str, Any], key: str, valid: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """``raw[key]``: a list of mappings each ``valid``; raises ValueError naming the key otherwise."""
    entries = raw.get(key) or []
    if not isinstance(entries, list):
        raise ValueError(f"{key}: not a list")
    for entry in entries:
        if not isinstance(entry, dict) or not valid(entry):
            raise ValueError(f"{key}: an entry without its keys or of the wrong types")
    return entries
