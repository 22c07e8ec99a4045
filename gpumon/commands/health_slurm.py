"""``gpumon health`` as Slurm Prolog and Epilog: a job let through when gpumon cannot judge (said and
counted), and the epilog's burn of a failed job's GPUs."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpumon.config.file import Config
from gpumon.health.config import HealthConfig, SlurmConfig
from gpumon.model.findings import CRITICAL, UNKNOWN, Finding, HealthReport

if TYPE_CHECKING:
    from gpumon.health.slurm import Decision

log = logging.getLogger("gpumon")


def let_through(hook: str, reason: str, state_dir: Path | None, env: Mapping[str, str]) -> int:
    """The Slurm prolog or epilog could not judge: the job goes through (exit 0), said on stderr and to
    syslog (slurmd keeps neither stdout nor stderr of a prolog), counted for the daemon's metrics."""
    from gpumon.health.unjudged import record_unjudged

    job = env.get("SLURM_JOB_ID", "")
    through = f"lets job {job} through" if job else "would let the job through (no SLURM_JOB_ID: not run by slurmd)"
    line = f"gpumon health: UNKNOWN - {reason}; {hook} {through}"
    print(line, file=sys.stderr)
    _syslog(line)
    if state_dir is not None:
        try:
            record_unjudged(state_dir, hook, reason, job, time.time())
        except OSError as exc:
            print(f"gpumon: cannot count it in {state_dir}: {exc.strerror or exc}", file=sys.stderr)
    return 0


def _syslog(line: str) -> None:
    import syslog

    syslog.openlog("gpumon", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(syslog.LOG_WARNING, line)
    syslog.closelog()


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


def _job_failed(env: Mapping[str, str]) -> bool:
    for name in ("SLURM_JOB_EXIT_CODE", "SLURM_JOB_DERIVED_EC"):
        value = env.get(name, "").split(":")[0].strip()
        if value and value != "0":
            return True
    return False


EPILOG_BURN_TIMEOUT_SECONDS = 300.0
BURN_TIMED_OUT = 124
"""``epilog_burn``'s answer when the burn ran past its time (as timeout(1) exits)."""
BURN_NOT_STARTED = 127
"""``epilog_burn``'s answer when the burn could not be started (as a shell's command not found)."""


def burn_command(config: Config, state_dir: Path, gpus: str) -> list[str]:
    """``gpumon burn --quick`` as burn takes it: state directory, GPUs, and for simulated GPUs (a
    ``fake`` backend) the same backend on ``--device cpu`` (there is no GPU to load)."""
    cmd = [sys.executable, "-m", "gpumon", "burn", "--quick", "--state-dir", str(state_dir)]
    if gpus:
        cmd += ["--gpus", gpus]
    if config.backend.startswith("fake"):
        cmd += ["--device", "cpu", "--backend", config.backend]
    return cmd


END_GRACE_SECONDS = 5.0
"""How long a timed-out burn and what it started have after SIGTERM before SIGKILL."""


def run_ending_tree(
    cmd: list[str], *, timeout: float, grace_seconds: float = END_GRACE_SECONDS, **_: object
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)``, except that a command past
    ``timeout`` ends with every process it started (SIGTERM, SIGKILL after ``grace_seconds``): the burn's
    fork server and workers too, which subprocess.run would leave running. TimeoutExpired is raised then.
    The burn stays in this process group, so slurmd ending the epilog's group ends it as well."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_tree(proc, grace_seconds)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _end_tree(proc: subprocess.Popen[str], grace_seconds: float) -> None:
    """SIGTERM to ``proc`` and all its descendants (as they are now), SIGKILL to those left after ``grace_seconds``."""
    import psutil

    try:
        root = psutil.Process(proc.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for member in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _gone, alive = psutil.wait_procs(tree, timeout=grace_seconds)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(alive, timeout=grace_seconds)
    proc.communicate()  # its pipes close once every process that held them is gone


def epilog_burn(
    config: Config,
    state_dir: Path,
    env: Mapping[str, str],
    run: Callable[..., subprocess.CompletedProcess[str]] = run_ending_tree,
    timeout_seconds: float = EPILOG_BURN_TIMEOUT_SECONDS,
) -> int | None:
    """``gpumon burn --quick`` on the job's GPUs when the job failed and ``epilog_burn`` is on: its exit
    code (BURN_TIMED_OUT, BURN_NOT_STARTED when it did not finish); None when no burn was due. A burn past
    ``timeout_seconds`` ends with every process it started (``run_ending_tree``)."""
    if not (config.health or HealthConfig()).slurm.epilog_burn or not _job_failed(env):
        return None
    cmd = burn_command(config, state_dir, env.get("SLURM_JOB_GPUS", ""))
    log.warning("job %s failed; running %s", env.get("SLURM_JOB_ID", "?"), " ".join(cmd))
    try:
        done = run(cmd, capture_output=True, text=True, timeout=timeout_seconds, check=False)
    except subprocess.TimeoutExpired:
        log.error("gpumon burn did not finish within %g s; it and every process it started were ended", timeout_seconds)
        return BURN_TIMED_OUT
    except OSError as exc:
        log.error("gpumon burn could not start: %s", exc)
        return BURN_NOT_STARTED
    if done.returncode not in (0, 1):
        last = (done.stderr or "").strip().splitlines()
        log.error("gpumon burn exited %d: %s", done.returncode, last[-1] if last else "")
    return int(done.returncode)


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
