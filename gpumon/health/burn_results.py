"""Findings from the last ``gpumon burn`` on this host (``STATE_DIR/burn/last.json``).

A GPU that failed a test stays CRITICAL (inspect the hardware) until a later burn passes it or
an operator clears the GPU after the burn finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpumon.health.clears import Clear
from gpumon.model.findings import CRITICAL, Finding
from gpumon.state.burn_record import LAST_NAME, burn_dir
from gpumon.util.state.files import read_json


def burn_findings(state_dir: Path, clears: Sequence[Clear]) -> list[Finding]:
    report = read_json(burn_dir(state_dir) / LAST_NAME)
    if not isinstance(report, dict):
        return []
    finished = report.get("finished_at")
    if not isinstance(finished, (int, float)):
        return []
    node = report.get("node", 0)
    out = []
    for g in report.get("gpus") or []:
        if not isinstance(g, dict) or g.get("node", 0) != node or not isinstance(g.get("gpu"), int):
            continue
        failed = sorted(str(t) for t, ok in (g.get("tests") or {}).items() if ok is False)
        if not failed:
            continue
        if any(c.gpu == g["gpu"] and c.at_seconds >= finished for c in clears):
            continue
        out.append(
            Finding(
                kind="burn_failed",
                severity=CRITICAL,
                action="inspect_hardware",
                summary=f"failed gpumon burn ({', '.join(failed)})",
                gpu=g["gpu"],
                uuid=g.get("uuid"),
                evidence={"finished_at": finished, "failed": failed},
            )
        )
    return out
