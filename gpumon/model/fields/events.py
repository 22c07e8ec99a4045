"""XID events, filled by the daemon from the XID event thread and the kernel log (not by a backend)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpumon.model.fields.spec import Metric, Tier, declare_mapping


@dataclass(frozen=True)
class EventFields:
    xid_errors_total: Mapping[str, int] | None = declare_mapping(
        Tier.DAEMON,
        "XID events seen by XID code (DCGM_FI_DEV_XID_ERRORS)",
        metric=Metric(
            "gpumon_xid_errors_total",
            "counter",
            "XID errors seen, by XID code, since the daemon started plus those found in the kernel log since boot.",
            labels=("xid",),
        ),
    )
    xid_last_timestamp_seconds: Mapping[str, float] | None = declare_mapping(
        Tier.DAEMON,
        "Unix time of the last XID by code",
        metric=Metric(
            "gpumon_xid_last_timestamp_seconds",
            "gauge",
            "Unix time of the last XID error, by XID code.",
            labels=("xid",),
        ),
    )
