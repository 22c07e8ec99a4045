"""``gpumon health``: the node verdict, operator clears, the inventory baseline, Slurm and NPD modes.

Exit codes (one table in docs/health.md):

* default (Nagios / NHC / HealthCheckProgram): 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN;
* ``--mode npd`` (Kubernetes node-problem-detector custom plugin): 0 OK (also WARNING),
  1 problem (CRITICAL), 2 UNKNOWN; one line of at most 80 bytes;
* ``--slurm-prolog``: 1 when the node is CRITICAL and drained (Slurm requeues the job), else 0 (also when
  the circuit breaker refused the drain or the Slurm step is UNKNOWN: slurmd would drain on a 1);
* ``--slurm-epilog``: 0 (a failed epilog makes slurmd drain the node; gpumon drains it itself);
* a check that cannot judge (a bad command line or config, a daemon named with ``--daemon-url``
  that does not answer, GPUs that do not answer within the prolog's budget) is UNKNOWN with the
  reason in one line, never a drain: 3, npd 2, prolog and epilog 0 (the job goes through, logged
  and counted in ``gpumon_health_unjudged_total``);
* ``clear`` / ``accept-inventory`` (admin commands, not checks): 0 done, 1 could not, 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpumon.commands.health_admin import cmd_accept_inventory, cmd_clear
from gpumon.commands.health_daemon import DAEMON_TIMEOUT_SECONDS, DaemonSilent, ask_daemon, daemon_url, health_url
from gpumon.commands.health_local import BackendProblem, CannotJudge, local_report
from gpumon.commands.health_slurm import epilog_burn, let_through
from gpumon.commands.support import (
    add_common_options,
    add_tick_option,
    checked_config,
    config_flags,
    problem_line,
    terminal_columns,
    usable_state_dir,
    wrapped,
)
from gpumon.config.file import DEFAULT_STATE_DIR, Config
from gpumon.health.config import HealthConfig
from gpumon.health.health_series import STATUS_VALUES
from gpumon.health.slurm_hooks import act_within, burn_outcome, lets_through, prolog_requeues
from gpumon.model.findings import ACTION_WORDS, UNKNOWN, Finding, HealthReport, verdict
from gpumon.util.jsonout import add_json_option, emit_json, to_stdout

if TYPE_CHECKING:
    from gpumon.health.slurm import Decision

NPD_MAX_OUTPUT = 80
"""node-problem-detector's default ``max_output_length`` for custom plugins, in bytes."""
NPD_EXIT = {"OK": 0, "WARNING": 0, "CRITICAL": 1, "UNKNOWN": 2}
HOOKS = ("prolog", "epilog")
"""Modes whose job goes through when gpumon cannot judge."""
ADMIN_COMMANDS = ("clear", "accept-inventory")

log = logging.getLogger("gpumon")


def configure(p: argparse.ArgumentParser) -> None:
    """Give ``gpumon health``'s parser (made by gpumon.cli) its description, options and commands."""
    p.description = (
        "The node's health verdict with the findings and recommended actions behind it. "
        "Asks the running daemon (/api/health), else polls the GPUs itself."
    )
    add_common_options(p)
    add_tick_option(p)
    add_json_option(p, "the verdict")
    p.add_argument(
        "--mode",
        choices=["nagios", "npd"],
        default="nagios",
        help="exit codes: nagios (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN; also NHC) or npd "
        "(node-problem-detector: 0 OK, 1 problem, 2 unknown; one line of at most 80 bytes)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="do not ask the daemon; poll the GPUs here")
    where.add_argument(
        "--daemon-url",
        dest="daemon_url",
        help="the daemon's base URL, e.g. http://127.0.0.1:10480 (like gpumon alerts --url; a URL ending in "
        "/api/health works too). A daemon named here that does not answer is UNKNOWN, never a local poll",
    )
    slurm = p.add_mutually_exclusive_group()
    slurm.add_argument("--slurm", action="store_true", help="Slurm HealthCheckProgram: drain / resume this node")
    slurm.add_argument(
        "--slurm-prolog",
        dest="slurm_prolog",
        action="store_true",
        help="Slurm Prolog: answers within health.slurm.prolog_timeout_seconds; the job goes through unless CRITICAL",
    )
    slurm.add_argument(
        "--slurm-epilog", dest="slurm_epilog", action="store_true", help="Slurm Epilog (may burn a failed job's GPUs)"
    )
    p.set_defaults(func=cmd_health)
    hs = p.add_subparsers(dest="health_command", metavar="SUBCOMMAND")
    clear = hs.add_parser("clear", help="clear a GPU's XID faults after a repair (recorded with the reason)")
    add_common_options(clear)
    clear.add_argument("--gpu", type=int, required=True, help="GPU index")
    clear.add_argument("--reason", required=True, help="what was done, e.g. 'reseated, passed burn'")
    clear.set_defaults(func=cmd_clear)
    accept = hs.add_parser("accept-inventory", help="make the GPUs seen now the expected inventory")
    add_common_options(accept)
    accept.set_defaults(func=cmd_accept_inventory)


# ---- cannot judge: UNKNOWN, never a drain --------------------------------------------------------
def mode_of(args: argparse.Namespace) -> str:
    """``prolog``, ``epilog``, ``npd`` or ``nagios`` (also NHC and ``--slurm``): what decides the exit code."""
    if args.slurm_prolog:
        return "prolog"
    if args.slurm_epilog:
        return "epilog"
    return "npd" if args.mode == "npd" else "nagios"


def _option_value(words: Sequence[str], option: str) -> str | None:
    for i, word in enumerate(words):
        if word == option and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(option + "="):
            return word.partition("=")[2]
    return None


def usage_error(words: Sequence[str], message: str) -> int | None:
    """A command line argparse rejected (called by gpumon.cli): UNKNOWN for the check, with the exit
    code of its mode as far as the words tell it; None for clear / accept-inventory (argparse's exit 2)."""
    if any(word in ADMIN_COMMANDS for word in words if not word.startswith("-")):
        return None
    if "--slurm-prolog" in words:
        mode = "prolog"
    elif "--slurm-epilog" in words:
        mode = "epilog"
    else:
        mode = "npd" if _option_value(words, "--mode") == "npd" else "nagios"
    given = _option_value(words, "--state-dir")
    state_dir = Path(given) if given else Path(os.environ.get("GPUMON_STATE_DIR") or DEFAULT_STATE_DIR)
    return cannot_judge(mode, f"usage: {message}", state_dir, os.environ)


def cannot_judge(
    mode: str, reason: str, state_dir: Path | None, env: Mapping[str, str], json_to: str | None = None
) -> int:
    """Say UNKNOWN with ``reason`` the way ``mode`` is read, and return its exit code: prolog and epilog
    let the job through (0) with a line on stderr and syslog and a count in the state directory."""
    report = unknown_report(reason)
    if mode in HOOKS:
        return let_through(mode, report.reason(), state_dir, env)
    if json_to is not None and not (mode == "npd" and to_stdout(json_to)):
        try:
            emit_json(report.to_json(), json_to)
        except OSError as exc:
            print(f"gpumon: cannot write {json_to}: {exc.strerror or exc}", file=sys.stderr)
    if mode == "npd":
        print(npd_line(report))
        print(f"gpumon health: UNKNOWN - {report.reason()}", file=sys.stderr)  # whole: NPD logs a plugin's stderr
        return NPD_EXIT[UNKNOWN]
    if not to_stdout(json_to):
        print(f"gpumon health: UNKNOWN - {report.reason()}")
    return STATUS_VALUES[UNKNOWN]


def unknown_report(reason: str) -> HealthReport:
    finding = Finding(kind="cannot_judge", severity=UNKNOWN, action="none", summary=f"not judged: {reason}")
    return verdict([finding], [], time.time(), source="none")


# ---- helpers ----------------------------------------------------------------
def _logging(args: argparse.Namespace) -> None:
    level = getattr(logging, (args.log_level or "warning").upper())
    logging.basicConfig(level=level, format="gpumon: %(message)s", stream=sys.stderr)
    if not args.log_level:  # the verdict says it; the daemon's retry wording would mislead here
        logging.getLogger("gpumon.collect.poller").setLevel(logging.CRITICAL)


def _state_dir(config: Config, args: argparse.Namespace) -> Path | None:
    explicit = args.state_dir is not None or "GPUMON_STATE_DIR" in os.environ
    return usable_state_dir(config, explicit)


def _judge_setup(args: argparse.Namespace) -> tuple[Config, Path]:
    """The check's config and state directory; CannotJudge (every config problem on stderr) when not usable."""
    config = checked_config(args.config, config_flags(args), path_must_exist=args.config is not None)
    if not isinstance(config, Config):
        print(f"gpumon: {len(config)} problem(s) in the configuration:", file=sys.stderr)
        for problem in config:
            print(problem_line(problem), file=sys.stderr)
        more = f" (and {len(config) - 1} more)" if len(config) > 1 else ""
        raise CannotJudge(f"configuration: {config[0]}{more}")
    _logging(args)
    state_dir = _state_dir(config, args)
    if state_dir is None:
        raise CannotJudge(f"state directory {config.state_dir} cannot be created or written")
    return dataclasses.replace(config, state_dir=state_dir), state_dir


def _health_config(config: Config) -> HealthConfig:
    return config.health or HealthConfig()


def get_report(
    args: argparse.Namespace,
    config: Config,
    state_dir: Path,
    *,
    kernel_log: bool = True,
    budget: Callable[[], float] | None = None,
) -> HealthReport:
    """The daemon's verdict, else a local poll. A daemon named with ``--daemon-url`` that gives none is
    CannotJudge; the default one (from ``listen``) not answering means no daemon runs: poll here.
    ``budget`` (the prolog) gives the seconds left."""
    if not args.local:
        explicit = args.daemon_url is not None
        if explicit and not args.daemon_url.startswith(("http://", "https://")):
            raise CannotJudge(f"--daemon-url must be an http:// or https:// URL, got {args.daemon_url!r}")
        url = health_url(args.daemon_url) if explicit else None
        if url is None and not config.web_config_file:
            url = health_url(daemon_url(config))
        if url is not None:
            timeout = DAEMON_TIMEOUT_SECONDS if budget is None else max(0.1, min(DAEMON_TIMEOUT_SECONDS, budget()))
            try:
                return ask_daemon(url, timeout)
            except DaemonSilent as exc:
                if explicit:
                    raise CannotJudge(f"the daemon at {url} {exc}") from exc
                log.info("no daemon at %s (%s); polling the GPUs here", url, exc)
    return local_report(
        config,
        state_dir,
        kernel_log=kernel_log,
        budget_seconds=None if budget is None else budget(),
        tick=getattr(args, "tick", None),
    )


def npd_line(report: HealthReport) -> str:
    """One line for node-problem-detector, at most NPD_MAX_OUTPUT bytes of UTF-8 (NPD cuts its plugin's
    output at ``max_output_length`` bytes); cut on a character boundary, ending in ``...``."""
    line = f"{report.status}: {report.reason()}"
    data = line.encode()
    if len(data) > NPD_MAX_OUTPUT:
        line = data[: NPD_MAX_OUTPUT - 3].decode("utf-8", "ignore") + "..."
    return line


def print_report(report: HealthReport, columns: int | None = None) -> None:
    """The verdict, one row per GPU and node finding; in a terminal of ``columns`` the reasons wrap
    between words under their own column (None: lines whole, as a pipe gets them)."""
    where = "from the daemon" if report.source == "daemon" else "polled here"
    print(wrapped("", f"gpumon health: {report.status} - {report.reason()} ({where})", 2, columns))
    if report.gpus:
        print(f"{'GPU':<4} {'STATUS':<9} {'ACTION':<17} REASON")
        for g in report.gpus:
            print(wrapped(f"{g.index:<4} {g.status:<9} {g.action:<17} ", g.reason, 33, columns))
    host = [f for f in report.findings if f.gpu is None]
    if host:
        print("node:")
        for f in host:
            print(wrapped(f"  {f.severity:<9} {f.action:<17} ", f.summary, 30, columns))
    if report.action != "none":
        print(f"recommended: {ACTION_WORDS[report.action]}" if report.action in ACTION_WORDS else report.action)


def with_finding(report: HealthReport, finding: Finding) -> HealthReport:
    gpus = [(g.index, g.uuid) for g in report.gpus]
    return verdict([*report.findings, finding], gpus, report.timestamp_seconds, report.source)


# ---- commands -----------------------------------------------------------------
def process_age_seconds() -> float:
    """How long ago this process started (Linux: /proc/self/stat's start time against /proc/uptime), 0 when
    not known: the prolog's budget counts Python's start-up and gpumon's imports too."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime_seconds = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime_seconds - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def cmd_health(args: argparse.Namespace) -> int:
    started = time.monotonic() - process_age_seconds()  # the prolog's budget runs from the process's start
    mode = mode_of(args)
    given = args.state_dir or os.environ.get("GPUMON_STATE_DIR")
    state_dir: Path | None = Path(given) if given else DEFAULT_STATE_DIR
    try:
        config, state_dir = _judge_setup(args)
        report, decision = _judge_alone(args, mode, config, state_dir, started)
    except (CannotJudge, BackendProblem) as exc:
        return cannot_judge(mode, str(exc), state_dir, os.environ, args.json)
    if report.source == "local" and config.backend.startswith("fake"):  # on stderr: stdout stays the verdict
        given = getattr(args, "tick", None)
        when = "its last scripted event" if given is None else f"tick {given} (--tick)"
        played = f", played to {when}" if config.backend != "fake" else ", not real hardware"
        simulated = f"gpumon health: simulated GPUs ({config.backend}){played}"
        print(wrapped("", simulated, 2, terminal_columns(sys.stderr)), file=sys.stderr)
    json_failed = False
    if args.json is not None and not (mode == "npd" and to_stdout(args.json)):  # npd's stdout is its one line
        data = report.to_json()
        if decision is not None:
            data["slurm"] = decision.to_json()
        try:
            emit_json(data, args.json)
        except OSError as exc:
            print(f"gpumon: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr)
            json_failed = True
    if mode == "npd":
        print(npd_line(report))
        return NPD_EXIT[UNKNOWN] if json_failed else NPD_EXIT[report.status]
    if not to_stdout(args.json):
        print_report(report, terminal_columns(sys.stdout))
        if decision is not None:
            print(f"slurm: {decision.step}: {decision.message}")
    if lets_through(mode, report):
        return let_through(mode, report.reason(), state_dir, os.environ)
    if mode == "prolog":  # 1 requeues the job and slurmd drains the node
        return 1 if prolog_requeues(report, decision) else 0
    if mode == "epilog":
        return 0
    return STATUS_VALUES[UNKNOWN] if json_failed else STATUS_VALUES[report.status]


def _judge_alone(
    args: argparse.Namespace, mode: str, config: Config, state_dir: Path, started: float
) -> tuple[HealthReport, Decision | None]:
    """``_judge`` while no other ``gpumon health`` run on this state directory judges (STATE_DIR/health/
    check.lock): an overlapping run waits for the one before it, within its own budget (the prolog's, else
    the poll timeout and Slurm's timeout), and cannot judge when that passes."""
    from gpumon.util.state.files import health_dir
    from gpumon.util.state.lock import CHECK_LOCK_NAME, state_lock

    health = _health_config(config)
    if mode == "prolog":
        wait_seconds = health.slurm.prolog_timeout_seconds
    else:
        wait_seconds = health.poll_timeout_seconds + health.slurm.timeout_seconds
    try:
        with state_lock(health_dir(state_dir), wait_seconds, name=CHECK_LOCK_NAME):
            return _judge(args, mode, config, state_dir, started)
    except TimeoutError:
        raise CannotJudge(
            f"another gpumon health run on {state_dir} did not finish within {wait_seconds:g} s"
        ) from None


def _judge(
    args: argparse.Namespace, mode: str, config: Config, state_dir: Path, started: float
) -> tuple[HealthReport, Decision | None]:
    """The verdict and the Slurm step taken on it (None outside the Slurm modes)."""
    slurm_mode = args.slurm or mode in HOOKS
    slurm = _health_config(config).slurm
    if slurm_mode and not slurm.enabled:
        raise CannotJudge("health.slurm.enabled is not true in the configuration; gpumon drains no node unless told to")
    budget = _seconds_left(started + slurm.prolog_timeout_seconds) if mode == "prolog" else None

    if slurm.slurm_conf is not None:  # slurmd gives HealthCheckProgram no SLURM_CONF; scontrol reads it
        os.environ["SLURM_CONF"] = str(slurm.slurm_conf)
    burned = epilog_burn(config, state_dir, os.environ) if mode == "epilog" else None
    report = get_report(args, config, state_dir, kernel_log=mode != "prolog", budget=budget)
    if burned is not None:
        finding = burn_outcome(burned, report)
        if finding is not None:
            report = with_finding(report, finding)
    decision = None
    if slurm_mode:
        from gpumon.health.slurm import act

        # the prolog's: sinfo and scontrol too, and the breaker's wait, within what is left of its budget
        decision = act(report, slurm, state_dir) if budget is None else act_within(report, slurm, state_dir, budget)
    return report, decision


def _seconds_left(deadline: float) -> Callable[[], float]:
    """The seconds from now until ``deadline`` (time.monotonic), each time it is called."""
    return lambda: deadline - time.monotonic()
