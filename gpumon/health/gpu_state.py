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
    out: list[Finding] = []

    def add(kind: str, severity: str, action: str, summary: str, **evidence: object) -> None:
        out.append(
            Finding(
                kind=kind,
                severity=severity,
                action=action,
                summary=summary,
                gpu=g.index,
                uuid=g.uuid,
                evidence=evidence,
            )
        )

    if not g.up:
        add("gpu_lost", CRITICAL, "reboot_node", f"lost: {g.lost_reason or 'NVML reports the GPU as lost'}")
        return out
    if g.row_remap_failure:
        add("row_remap_failure", CRITICAL, "replace", "row remapping failed (no spare rows left)")
    elif g.row_remap_pending:
        add("row_remap_pending", WARNING, "reset_gpu", "row remap pending (applied at the next GPU reset)")
    banks_without_spares = (g.row_remap_bank_availability or {}).get("none", 0)
    if banks_without_spares and not g.row_remap_failure:
        add(
            "row_remap_banks_exhausted",
            WARNING,
            "inspect_hardware",
            f"{banks_without_spares} memory bank(s) have no spare rows left: the next uncorrectable error in one of"
            " them cannot be remapped",
            banks=banks_without_spares,
        )
    if g.recovery_action not in (None, "none"):
        severity, action = RECOVERY_LADDER.get(g.recovery_action, (CRITICAL, "inspect_hardware"))
        add(
            "recovery_action",
            severity,
            action,
            f"the driver asks for recovery: {g.recovery_action.replace('_', ' ')} (nvidia-smi gpu_recovery_action)",
            recovery_action=g.recovery_action,
        )
    if g.retired_pages_pending:
        add("retired_pages_pending", WARNING, "reset_gpu", "page retirement pending (applied at the next GPU reset)")
    uncorrected = (g.ecc_errors_total or {}).get("uncorrected_volatile")
    if uncorrected and not g.row_remap_failure and not g.row_remap_pending:
        add(
            "ecc_uncorrectable",
            WARNING,
            "reset_gpu",
            f"{uncorrected} uncorrectable ECC errors since the last reset",
            count=uncorrected,
        )
    if g.fabric_status_ok is False or (
        g.fabric_state is not None and g.fabric_state not in ("completed", "not_supported")
    ):
        add(
            "fabric_not_ready",
            CRITICAL,
            "reset_gpu",
            f"NVSwitch fabric registration {g.fabric_state or 'failed'}",
            fabric_state=g.fabric_state,
            fabric_status_ok=g.fabric_status_ok,
        )
    slowdown = g.temperature_slowdown_threshold_celsius
    if g.temperature_celsius is not None and slowdown is not None and g.temperature_celsius >= slowdown:
        add(
            "overheating",
            WARNING,
            "inspect_hardware",
            f"{g.temperature_celsius:g} °C, at or above its slowdown temperature {slowdown:g} °C",
            temperature_celsius=g.temperature_celsius,
        )
    return out
