"""The Slurm prolog's and epilog's decisions on a verdict: a job let through unjudged, a job requeued, a
failed job's burn due and what that burn adds to the verdict; the Slurm step within the prolog's budget.

Pure but for ``act_within``, which carries out ``gpumon.health.slurm.act``: what to drain or resume and
the circuit breaker are decided there. ``gpumon.commands.health_slurm`` does the I/O (stderr, syslog,
the count of unjudged jobs, starting the burn) and ``gpumon.commands.health`` the exit codes.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpumon.health.config import SlurmConfig
from gpumon.health.unjudged import HOOKS
from gpumon.model.findings import CRITICAL, UNKNOWN, Finding, HealthReport

if TYPE_CHECKING:  # the Slurm step's modules load only when a Slurm mode acts
    from gpumon.health.slurm import Decision


def lets_through(hook: str, report: HealthReport) -> bool:
    """Whether a prolog or epilog (``hook``) lets the job through unjudged: its verdict is UNKNOWN, and
    gpumon that cannot judge never drains a node (exit 0, said and counted)."""
    return hook in HOOKS and report.status == UNKNOWN


def prolog_requeues(report: HealthReport, decision: Decision | None) -> bool:
    """Whether the prolog exits 1 (Slurm requeues the job and slurmd drains the node): only for a CRITICAL
    node the Slurm step drained or found drained, never past the circuit breaker or when the step is UNKNOWN."""
    return report.status == CRITICAL and decision is not None and decision.step in ("drain", "none")


def job_failed(env: Mapping[str, str]) -> bool:
    """Whether the epilog's job failed (SLURM_JOB_EXIT_CODE or SLURM_JOB_DERIVED_EC not 0)."""
    for name in ("SLURM_JOB_EXIT_CODE", "SLURM_JOB_DERIVED_EC"):
        value = env.get(name, "").split(":")[0].strip()
        if value and value != "0":
            return True
    return False


def epilog_burn_due(slurm: SlurmConfig, env: Mapping[str, str]) -> bool:
    """Whether the epilog burns the job's GPUs: ``health.slurm.epilog_burn`` is on and the job failed."""
    return slurm.epilog_burn and job_failed(env)


def burn_outcome(exit_code: int, report: HealthReport) -> Finding | None:
    """What the epilog's burn adds to the verdict: nothing when it passed; a fault (exit 1) is CRITICAL
    (``burn_failed``; from the burn's report in the state directory, or this finding where the verdict
    has none); a burn that could not run is UNKNOWN, never OK."""
    if exit_code == 0:
        return None
    if exit_code == 1:
        if any(f.kind == "burn_failed" for f in report.findings):
            return None
        return Finding(
            kind="burn_failed", severity=CRITICAL, action="inspect_hardware", summary="failed the epilog's gpumon burn"
        )
    return Finding(
        kind="burn_not_run",
        severity=UNKNOWN,
        action="none",
        summary=f"the epilog's gpumon burn could not run (exit {exit_code})",
        evidence={"exit_code": exit_code},
    )


def act_within(
    report: HealthReport,
    slurm: SlurmConfig,
    state_dir: Path,
    seconds_left: Callable[[], float],
    *,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> Decision:
    """The Slurm step (gpumon.health.slurm.act) within ``seconds_left()`` (the prolog's budget): every sinfo
    and scontrol call gets at most what is left and none starts once it is spent (the step is then
    UNKNOWN), and the circuit breaker's wait is cut to it, however slow the controller."""
    from gpumon.health.slurm import act
    from gpumon.health.slurm_commands import Scontrol

    client = Scontrol(slurm, run=run, seconds_left=seconds_left)
    return act(
        report, slurm, state_dir, client=client, clock=clock, sleep=lambda s: sleep(max(0.0, min(s, seconds_left())))
    )
