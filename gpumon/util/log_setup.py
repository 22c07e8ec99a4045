"""gpumon run's log lines: ``time LEVEL logger: message`` at the configured level, APScheduler kept quiet."""

from __future__ import annotations

import logging


def configure_logging(level: str) -> None:
    """Log from ``level`` up (debug, info, warning or error), replacing any handler set before."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    # gpumon logs skipped and late polls itself, once per overrun rather than once per skip
    logging.getLogger("apscheduler").setLevel(logging.ERROR if level != "debug" else logging.INFO)
