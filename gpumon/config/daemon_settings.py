"""What the daemon derives from its configuration and checks before a reload takes it: the poll
intervals, the interval checks, the alerting section when none is configured, and a failed reload's
reason on one line."""

from __future__ import annotations

import math

from gpumon.alerts import config as alerts_config
from gpumon.config.file import Config, ConfigError
from gpumon.model.poll_intervals import PollIntervals


def intervals_of(config: Config) -> PollIntervals:
    return PollIntervals(
        fast_seconds=config.interval_seconds,
        slow_seconds=config.slow_interval_seconds,
        static_seconds=config.static_interval_seconds,
    )


def check_intervals(config: Config) -> None:
    """Raise ConfigError unless every interval is a finite number > 0 (and stale_after_seconds finite, >= 0)."""
    problems = [
        f"{key} must be a finite number greater than 0, not {getattr(config, key)!r}"
        for key in ("interval_seconds", "slow_interval_seconds", "static_interval_seconds")
        if not (math.isfinite(getattr(config, key)) and getattr(config, key) > 0)
    ]
    if not (math.isfinite(config.stale_after_seconds) and config.stale_after_seconds >= 0):
        problems.append(f"stale_after_seconds must be a finite number >= 0, not {config.stale_after_seconds!r}")
    if problems:
        raise ConfigError(problems)


def one_line_reason(exc: BaseException) -> str:
    """Why a reload failed, on one line and not too long."""
    if isinstance(exc, ConfigError):
        text = "; ".join(exc.problems)
    elif isinstance(exc, RecursionError):
        text = "nested too deeply to read (RecursionError)"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= 600 else text[:600] + " …"


def default_alerting() -> alerts_config.AlertingConfig:
    """The alerting section as it is with nothing configured (the built-in pack, no receivers)."""
    parsed, problems = alerts_config.parse(None)
    if parsed is None:
        raise ConfigError(problems)
    return parsed
