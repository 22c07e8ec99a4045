"""``exporter.detail``: the opt-ins to series the default leaves out (gpumon.model.fields.spec.DETAILS)."""

from __future__ import annotations

from typing import Any

from gpumon.model.fields.spec import DETAILS
from gpumon.util.yamlfile import brief


def parse_detail(raw: Any, problems: list[str], where: str) -> tuple[str, ...]:
    """``exporter.detail``: a list (or comma-separated words) of DETAILS, or ``all``."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [d.strip() for d in raw.split(",") if d.strip()]
    if not isinstance(raw, list):
        problems.append(f"{where}: exporter.detail must be a list, got {brief(raw)}")
        return ()
    detail: list[str] = []
    for d in raw:
        if d == "all":
            detail.extend(x for x in DETAILS if x not in detail)
        elif d not in DETAILS:
            problems.append(f"{where}: exporter.detail: unknown opt-in {brief(d)} (known: {', '.join(DETAILS)}, all)")
        elif d not in detail:
            detail.append(d)
    return tuple(detail)
