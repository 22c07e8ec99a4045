"""What the alert spool held, put back at start: the engine's states, the announced set, the queues.

A restart (even after SIGKILL) resumes with the same ``startsAt`` and delivers what was queued.
A damaged part is dropped (an engine state; a whole engine section not of the shape gpumon writes,
the spool then copied to ``spool.json.corrupt``) or given this start's time (a notification whose
start or end is not a time), said in one warning line each, never a reason not to start.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpumon.alerts.engine import AlertEngine
from gpumon.alerts.notification import Notification, from_spool
from gpumon.alerts.notify import Receiver


def restore_spool(
    data: Mapping[str, Any],
    engine: AlertEngine,
    delivered: dict[str, Notification],
    receivers: Mapping[str, Receiver],
    clock: Callable[[], float],
    path: Path,
    log: logging.Logger,
) -> int:
    """Put back what the spool at ``path`` held (``data``): the engine's states, the announced set
    (into ``delivered``) and each receiver's queue (by URL). ``clock``: Unix seconds, read once for
    this start's time; ``log``: the logger its lines go to. Returns the damaged parts met (an engine
    section set aside, states and notifications dropped or clamped), each said in a log line."""
    engine_state = data.get("engine")
    damaged = 0
    if isinstance(engine_state, dict):
        damaged = _restore_engine(engine_state, engine, path, log)
    elif engine_state is not None:
        _set_engine_aside(path, TypeError(f"it is {type(engine_state).__name__}, not an object"), log)
        damaged = 1
    now = clock()
    clamped, dropped = _restore_delivered(data.get("delivered"), delivered, now)
    queues = data.get("queues") or {}
    if isinstance(queues, dict):
        for url, items in queues.items():
            receiver = receivers.get(url)
            if receiver is not None and isinstance(items, list):
                more_clamped, more_dropped = receiver.restore(items, now)
                clamped += more_clamped
                dropped += more_dropped
    if clamped or dropped:
        log.warning(
            "alert spool %s: %d notification(s) with a start or end that is not a time (NaN, Infinity, past "
            "year 9999) restored with the time of this start; %d entry(ies) that are not notifications dropped",
            path,
            clamped,
            dropped,
        )
    restored = sum(r.queue_length() for r in receivers.values())
    log.info(
        "alert spool restored: %d active alert(s), %d announced, %d queued notification(s)",
        len(engine.alerts()),
        len(delivered),
        restored,
    )
    return damaged + clamped + dropped


def _restore_engine(engine_state: dict[str, Any], engine: AlertEngine, path: Path, log: logging.Logger) -> int:
    """The engine's states put back; the damaged parts met (1 for a section set aside, else the states dropped)."""
    # Staleness is judged from this process's start until its first snapshot (the
    # start-up grace is the rule's threshold): the previous process's last snapshot
    # says nothing about this one, and a first poll slower than the 1 s timer would
    # otherwise find a snapshot hours old.
    engine_state = {k: v for k, v in engine_state.items() if k != "last_snapshot_at"}
    try:
        dropped_states = engine.restore_state(engine_state)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError) as exc:
        _set_engine_aside(path, exc, log)
        return 1
    if dropped_states:
        log.warning(
            "alert spool %s: %d saved alert state(s) damaged (a time that is not a time, a field "
            "missing); dropped, those alerts are evaluated afresh",
            path,
            dropped_states,
        )
    return dropped_states


def _restore_delivered(raw_delivered: Any, delivered: dict[str, Notification], now: float) -> tuple[int, int]:
    """The announced set put back into ``delivered``: (clamped, dropped) notifications."""
    notifications, clamped, dropped = from_spool(raw_delivered if isinstance(raw_delivered, list) else [], now)
    for n in notifications:
        delivered[n.fingerprint] = n
    return clamped, dropped


def _set_engine_aside(path: Path, exc: BaseException, log: logging.Logger) -> None:
    """An engine section not of the shape gpumon writes: the spool is copied aside (``spool.json.corrupt``,
    kept for the operator), said in one line, and the alert states start afresh; the announced set and
    the queues are still restored (nothing queued is lost)."""
    aside = path.with_name(path.name + ".corrupt")
    try:
        shutil.copyfile(path, aside, follow_symlinks=False)
        kept = f"copied to {aside}"
    except OSError as err:
        kept = f"not copied aside: {err.strerror or err}"
    log.error(
        "alert spool %s: 1 damaged engine section (%s); %s, alerts are evaluated afresh, queued notifications are kept",
        path,
        exc,
        kept,
    )
