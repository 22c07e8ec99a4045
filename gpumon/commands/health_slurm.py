"""``gpumon health`` as Slurm Prolog and Epilog, its I/O: a job let through when gpumon cannot judge (said
on stderr and syslog, counted), and the epilog's burn of a failed job's GPUs started and ended.

What is decided (let through, requeue, a burn due, what it adds to the verdict, the Slurm step within the
prolog's budget) is gpumon.health.slurm_hooks'; what to drain or resume and the breaker gpumon.health.slurm's."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gpumon.config.file import Config
from gpumon.health.config import HealthConfig
from gpumon.health.slurm_hooks import epilog_burn_due

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
    if not epilog_burn_due((config.health or HealthConfig()).slurm, env):
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
