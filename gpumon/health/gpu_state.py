"""Findings from one snapshot alone: NVML down, GPUs lost, memory and fabric faults."""

from __future__ import annotations

from gpumon.model.findings import CRITICAL, UNKNOWN, WARNING, Finding
from gpumon.model.snapshot import GpuSnapshot, Snapshot

RECOVERY_LADDER = {
    "gpu_reset": (CRITICAL, "reset_gpu"),
    "drain_and_reset": (CRITICAL, "reset_gpu"),
    "bus_reset": (CRITICAL, "reset_gpu"),
    "drain_p2p": (WARNING, "reset_gpu"),
    "node_reboot": (CRITICAL, "reboot_node"),
    "system_reboot": (CRITICAL, "reboot_node"),
    "recover_imex_domain": (WARNING, "inspect_hardware"),
}
"""NVML's recovery action (``recovery_action``) -> severity and the rung of the action ladder. DRAIN_P2P asks
to stop peer-to-peer work and reset when idle (a warning: jobs keep running); the others make the GPU
unusable until done. An action this table does not know is CRITICAL, inspect_hardware."""


def snapshot_findings(snapshot: Snapshot | None) -> list[Finding]:
    """What the latest snapshot shows is wrong now (no history)."""
    if snapshot is None:
        return [Finding(kind="no_data", severity=UNKNOWN, action="none", summary="no GPU reading yet")]
    if not snapshot.nvml_up:
        return [
            Finding(
                kind="nvml_down",
                severity=UNKNOWN,
                action="none",
                summary=f"NVML unavailable: {snapshot.nvml_error or 'unknown error'}",
                evidence={"nvml_error": snapshot.nvml_error},
            )
        ]
    out: list[Finding] = []
    for g in snapshot.gpus:
        out.extend(_gpu_findings(g))
    return out


def _gpu_findings(g: GpuSnapshot) -> list[Finding]:
    """What one GPU shows is wrong now: lost (then nothing else), else its memory, recovery, fabric and heat."""
    if not g.up:
        return [
            _finding(g, "gpu_lost", CRITICAL, "reboot_node", f"lost: {g.lost_reason or 'NVML reports the GPU as lost'}")
        ]
    return [*_row_remapping(g), *_recovery_action(g), *_memory_errors(g), *_fabric(g), *_overheating(g)]


def _finding(g: GpuSnapshot, kind: str, severity: str, action: str, summary: str, **evidence: object) -> Finding:
    return Finding(
        kind=kind,
        severity=severity,
        action=action,
        summary=summary,
        gpu=g.index,
        uuid=g.uuid,
        evidence=evidence,
    )


def _row_remapping(g: GpuSnapshot) -> list[Finding]:
    """A failed or pending row remap, and memory banks with no spare rows left."""
    out: list[Finding] = []
    if g.row_remap_failure:
        out.append(_finding(g, "row_remap_failure", CRITICAL, "replace", "row remapping failed (no spare rows left)"))
    elif g.row_remap_pending:
        out.append(
            _finding(g, "row_remap_pending", WARNING, "reset_gpu", "row remap pending (applied at the next GPU reset)")
        )
    banks_without_spares = (g.row_remap_bank_availability or {}).get("none", 0)
    if banks_without_spares and not g.row_remap_failure:
        out.append(
            _finding(
                g,
                "row_remap_banks_exhausted",
                WARNING,
                "inspect_hardware",
                f"{banks_without_spares} memory bank(s) have no spare rows left: the next uncorrectable error in one"
                " of them cannot be remapped",
                banks=banks_without_spares,
            )
        )
    return out


def _recovery_action(g: GpuSnapshot) -> list[Finding]:
    """The recovery the driver asks for, on the ladder (RECOVERY_LADDER)."""
    if g.recovery_action in (None, "none"):
        return []
    severity, action = RECOVERY_LADDER.get(g.recovery_action, (CRITICAL, "inspect_hardware"))
    summary = f"the driver asks for recovery: {g.recovery_action.replace('_', ' ')} (nvidia-smi gpu_recovery_action)"
    return [_finding(g, "recovery_action", severity, action, summary, recovery_action=g.recovery_action)]


def _memory_errors(g: GpuSnapshot) -> list[Finding]:
    """Pending page retirement, and uncorrectable ECC errors no row remap already answers."""
    out: list[Finding] = []
    if g.retired_pages_pending:
        summary = "page retirement pending (applied at the next GPU reset)"
        out.append(_finding(g, "retired_pages_pending", WARNING, "reset_gpu", summary))
    uncorrected = (g.ecc_errors_total or {}).get("uncorrected_volatile")
    if uncorrected and not g.row_remap_failure and not g.row_remap_pending:
        summary = f"{uncorrected} uncorrectable ECC errors since the last reset"
        out.append(_finding(g, "ecc_uncorrectable", WARNING, "reset_gpu", summary, count=uncorrected))
    return out


def _fabric(g: GpuSnapshot) -> list[Finding]:
    """An NVSwitch fabric registration that failed or is not complete."""
    if g.fabric_status_ok is not False and (g.fabric_state is None or g.fabric_state in ("completed", "not_supported")):
        return []
    return [
        _finding(
            g,
            "fabric_not_ready",
            CRITICAL,
            "reset_gpu",
            f"NVSwitch fabric registration {g.fabric_state or 'failed'}",
            fabric_state=g.fabric_state,
            fabric_status_ok=g.fabric_status_ok,
        )
    ]


def _overheating(g: GpuSnapshot) -> list[Finding]:
    """A temperature at or above the GPU's slowdown temperature."""
    slowdown = g.temperature_slowdown_threshold_celsius
    if g.temperature_celsius is not None and slowdown is not None and g.temperature_celsius >= slowdown:
        summary = f"{g.temperature_celsius:g} °C, at or above its slowdown temperature {slowdown:g} °C"
        return [
            _finding(g, "overheating", WARNING, "inspect_hardware", summary, temperature_celsius=g.temperature_celsius)
        ]
    return []
