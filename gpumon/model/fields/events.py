"""XID events, filled by the daemon from the XID event thread and the kernel log (not by a backend)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpumon.model.fields.spec import Metric, Sample, Tier, as_number, declare_mapping, natural


def _xid_counts(counts: Mapping[str, int]) -> Iterable[Sample]:
    """One sample per XID code; a GPU without any XID yet has one row without a code (``xid=""``) at 0, so
    its family is 0 from the first scrape, not blank (dcgm-exporter#646, #700: metrics that went blank)."""
    if not counts:
        return [(("",), 0.0)]
    return [((code,), v) for code in sorted(counts, key=natural) if (v := as_number(counts[code])) is not None]


@dataclass(frozen=True)
class EventFields:
    xid_errors_total: Mapping[str, int] | None = declare_mapping(
        Tier.DAEMON,
        "XID events seen by XID code (DCGM_FI_DEV_XID_ERRORS)",
        metric=Metric(
            "gpumon_xid_errors_total",
            "counter",
            "XID errors seen, by XID code, since the daemon started plus those found in the kernel log since boot "
            '(a GPU without any: one row xid="" at 0).',
            labels=("xid",),
            samples=_xid_counts,
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
