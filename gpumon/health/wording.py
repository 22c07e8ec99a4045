"""Words of finding summaries: durations, the short form of an XID's meaning."""

from __future__ import annotations

import re
from typing import Literal


def duration(seconds: float, *, style: Literal["spelled", "units"]) -> str:
    """``seconds`` as a finding says it. ``spelled`` (an XID escalation's window): ``a day``, ``3 days``,
    ``an hour``, ``6 hours``, else ``90 s``; ``units`` (an error trend's window): ``1 h``, ``2 h``,
    ``30 min``, else ``90 s``."""
    if style == "spelled":
        if seconds % 86400 == 0:
            days = int(seconds // 86400)
            return "a day" if days == 1 else f"{days} days"
        if seconds % 3600 == 0:
            hours = int(seconds // 3600)
            return "an hour" if hours == 1 else f"{hours} hours"
    else:
        if seconds % 3600 == 0:
            return f"{seconds / 3600:g} h"
        if seconds % 60 == 0:
            return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def short_meaning(meaning: str) -> str:
    """``GPU has fallen off the bus (it no longer ...)`` -> ``fallen off the bus``."""
    short = re.sub(r" \([^)]*\)", "", meaning)
    for lead in ("GPU has ", "GPU "):
        if short.startswith(lead):
            return short[len(lead) :]
    return short
