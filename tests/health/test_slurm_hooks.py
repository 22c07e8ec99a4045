"""The Slurm prolog's and epilog's decisions, as gpumon.health.slurm_hooks makes them (the commands only turn
them into exit codes and I/O): a job that cannot be judged goes through, only a CRITICAL node the Slurm step
drained requeues the prolog's job, a failed job's burn is due only when asked for, and a burn that could not
run is UNKNOWN, never OK."""

from __future__ import annotations

import pytest

from gpumon.health.config import SlurmConfig
from gpumon.health.slurm import Decision
from gpumon.health.slurm_hooks import burn_outcome, epilog_burn_due, lets_through, prolog_requeues
from gpumon.model.findings import CRITICAL, OK, UNKNOWN, WARNING, Finding, HealthReport, verdict

STEPS = ("none", "drain", "resume", "refused", "unknown")


def _report(severity: str | None) -> HealthReport:
    findings = [] if severity is None else [Finding(kind="k", severity=severity, action="none", summary="s", gpu=0)]
    return verdict(findings, [(0, None)], 0.0, source="local")


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("severity", [None, WARNING, CRITICAL, UNKNOWN])
def test_the_prolog_requeues_only_a_critical_node_the_slurm_step_drained_or_found_drained(
    severity: str | None, step: str
) -> None:
    report = _report(severity)
    decision = Decision(step, "n1", "m")
    assert prolog_requeues(report, decision) == (report.status == CRITICAL and step in ("drain", "none"))
    assert not prolog_requeues(report, None)  # no Slurm step taken: never a requeue


@pytest.mark.parametrize("hook", ["prolog", "epilog", "nagios", "npd"])
@pytest.mark.parametrize("severity", [None, WARNING, CRITICAL, UNKNOWN])
def test_only_the_hooks_let_an_unjudged_job_through(hook: str, severity: str | None) -> None:
    report = _report(severity)
    assert report.status in (OK, WARNING, CRITICAL, UNKNOWN)
    assert lets_through(hook, report) == (hook in ("prolog", "epilog") and report.status == UNKNOWN)


@pytest.mark.parametrize(
    ("env", "failed"),
    [
        ({}, False),
        ({"SLURM_JOB_EXIT_CODE": "0"}, False),
        ({"SLURM_JOB_EXIT_CODE": "3"}, True),
        ({"SLURM_JOB_DERIVED_EC": "0:9"}, False),
        ({"SLURM_JOB_DERIVED_EC": "1:0"}, True),
    ],
)
def test_a_failed_jobs_burn_is_due_only_when_epilog_burn_is_on(env: dict[str, str], failed: bool) -> None:
    assert epilog_burn_due(SlurmConfig(epilog_burn=True), env) == failed
    assert not epilog_burn_due(SlurmConfig(epilog_burn=False), env)


def test_a_burn_adds_nothing_when_it_passed_critical_when_it_failed_and_unknown_when_it_could_not_run() -> None:
    report = _report(None)
    assert burn_outcome(0, report) is None
    failed = burn_outcome(1, report)
    assert failed is not None and (failed.kind, failed.severity) == ("burn_failed", CRITICAL)
    not_run = burn_outcome(124, report)
    assert not_run is not None and (not_run.kind, not_run.severity) == ("burn_not_run", UNKNOWN)
    already = verdict([failed], [(0, None)], 0.0, source="local")
    assert burn_outcome(1, already) is None  # the burn's own report says so already
