"""An open XID fault of the lifecycle (``xid.json``'s ``faults``) as the CRITICAL finding users see."""

from __future__ import annotations

from typing import Any

from gpumon.health.wording import duration
from gpumon.model.findings import CRITICAL, Finding


def fault_finding(fault: dict[str, Any]) -> Finding:
    """``xid 79 fallen off the bus``, with the NVLink class and link of an XID 74 and an escalation's
    count and window; the evidence holds the fault's counts and times (Unix seconds)."""
    summary = f"xid {fault['xid']} {fault['meaning']}"
    nvlink = fault.get("nvlink")
    if isinstance(nvlink, dict):
        summary += f" ({str(nvlink.get('class', '')).replace('_', ' ')}, link {nvlink.get('link')})"
    escalated = fault.get("escalated")
    if escalated:
        summary += f" ({escalated['count']} in {duration(escalated['window_seconds'], style='spelled')})"
    return Finding(
        kind="xid",
        severity=CRITICAL,
        action=fault["action"],
        summary=summary,
        gpu=fault["gpu"],
        uuid=fault.get("uuid"),
        evidence={
            "xid": fault["xid"],
            "lifecycle": fault["lifecycle"],
            "count": fault["count"],
            "first_seconds": fault["first_seconds"],
            "last_seconds": fault.get("last_seconds"),
            "followed_by": fault.get("followed_by", []),
            "source": fault.get("source"),
            **({"nvlink": nvlink} if nvlink else {}),
            **({"escalated": escalated} if escalated else {}),
        },
    )
