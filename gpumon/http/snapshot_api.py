"""/api/snapshot: the latest snapshot as JSON; who runs what is shown only where process metrics are on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumon.http.messages import json_response
from gpumon.model.snapshot import to_jsonable

if TYPE_CHECKING:
    from gpumon.model.snapshot import Snapshot

ANONYMOUS_PROCESS_KEYS = ("used_memory_bytes", "sm_utilization_ratio")
"""What /api/snapshot shows of a process while exporter.processes is off: no PID, name, user or place."""


def snapshot_response(
    snapshot: Snapshot | None, *, processes: bool, monotonic: Callable[[], float]
) -> tuple[int, str, bytes]:
    """The route's answer: 503 before the first snapshot, else the snapshot with its ``age_seconds``
    on ``monotonic``'s clock; ``processes``: exporter.processes (False: processes anonymous)."""
    if snapshot is None:
        return json_response({"error": "no snapshot yet"}, 503)
    data = to_jsonable(snapshot)
    if not processes:  # who runs what is shown only where process metrics are on
        for gpu in data.get("gpus") or ():
            if isinstance(gpu.get("processes"), list):
                gpu["processes"] = [{k: p.get(k) for k in ANONYMOUS_PROCESS_KEYS} for p in gpu["processes"]]
    data["age_seconds"] = monotonic() - snapshot.monotonic_seconds
    return json_response(data)
