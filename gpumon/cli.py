"""Command line: subcommands map to functions; exit 0 ok, 1 fault, 2 usage or bad config."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpumon import __version__
from gpumon.commands.parser import CommandParser, UsageError, add_command, named_command
from gpumon.commands.support import add_common_options as _add_common
from gpumon.commands.support import add_tick_option, checked_config, load_or_report, problem_line
from gpumon.commands.support import config_flags as _flags
from gpumon.commands.support import usable_state_dir as _usable_state_dir
from gpumon.config.file import DEFAULT_PORT, Config
from gpumon.early_hangup import hold_hangups
from gpumon.util.jsonout import add_json_option, emit_json, to_stdout
from gpumon.util.locale_output import tolerate_unencodable
from gpumon.util.pipes import reader_gone

if TYPE_CHECKING:
    from gpumon.http.webconfig import WebConfigError

EXIT_OK = 0
EXIT_FAULT = 1
EXIT_USAGE = 2

log = logging.getLogger("gpumon")


MODULE_COMMANDS = {
    "alerts": ("gpumon.commands.alerts", "show the active alerts of a running gpumon daemon"),
    "assets": (
        "gpumon.commands.assets",
        "list, print or write the dashboards, Prometheus rules, systemd unit, examples",
    ),
    "burn": ("gpumon.burn.command", "burn-in and fault triage"),
    "hash-password": ("gpumon.commands.hash_password", "print a bcrypt hash for basic_auth_users in web-config.yml"),
    "health": (
        "gpumon.commands.health",
        "node health verdict (OK, WARNING, CRITICAL, UNKNOWN) with the action to take",
    ),
    "record": ("gpumon.commands.record", "record what NVML answers on this host, for --backend replay:FILE"),
    "bundle": ("gpumon.commands.bundle", "collect a bug-report archive (recording, config, health, burn, versions)"),
}
"""Commands whose module (with a ``configure(parser)``) is imported only to parse that command:
name -> (module, the line ``gpumon --help`` shows)."""


def build_parser(configured: Collection[str] | None = None) -> argparse.ArgumentParser:
    """gpumon's parser. Of MODULE_COMMANDS, only those in ``configured`` (None: all) get their
    options, which imports their modules; the others are listed with their help line. main()
    configures only the command it runs, so ``gpumon run`` loads no other command's code."""
    parser = CommandParser(
        prog="gpumon",
        description="GPU monitoring, alerting and burn-in for Linux GPU servers.",
    )
    parser.add_argument("--version", action="version", version=f"gpumon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_run(sub)
    _add_once(sub)
    _add_check_config(sub)
    scen = add_command(sub, "scenarios", "list the named fake-backend scenarios (--backend fake:NAME)")
    scen.set_defaults(func=cmd_scenarios)

    for name, (module, help_line) in MODULE_COMMANDS.items():
        command = add_command(sub, name, help_line)
        if configured is None or name in configured:
            # gpumon.burn.command registers options only; torch is imported when a burn runs
            importlib.import_module(module).configure(command)
    return parser


def _add_run(sub: argparse._SubParsersAction[CommandParser]) -> None:
    """``gpumon run`` and its options (those of the config it may override)."""
    run = add_command(sub, "run", "run the daemon: poll GPUs, serve /metrics, send alerts")
    _add_common(run)
    run.add_argument("--listen", help=f"HOST:PORT to serve on (default 0.0.0.0:{DEFAULT_PORT})")
    run.add_argument("--interval-seconds", type=float, dest="interval_seconds", help="fast poll interval (default 1)")
    run.add_argument(
        "--compat",
        help="extra metric names: dcgm (dcgm-exporter <= 4.8.x), dcgm-4.9 (4.9's DCGM 4.7 names), or dcgm,dcgm-4.9",
    )
    run.add_argument(
        "--compat-hostname-label",
        dest="compat_hostname_label",
        help="host label of the DCGM names: Hostname (dcgm-exporter <= 4.8.2) or hostname (>= 4.8.3)",
    )
    run.add_argument(
        "--compat-labels",
        dest="compat_labels",
        help="optional labels of the DCGM names: nvml_version, serial, vbios_version, hpc_job (comma-separated)",
    )
    run.add_argument("--processes", action="store_true", default=None, help="export per-process series")
    run.add_argument("--web-config-file", type=Path, dest="web_config_file", help="exporter-toolkit web-config.yml")
    run.set_defaults(func=cmd_run)


def _add_once(sub: argparse._SubParsersAction[CommandParser]) -> None:
    """``gpumon once``: one poll as a table or JSON."""
    once = add_command(
        sub,
        "once",
        "poll once and print a table (or JSON), then exit",
        "The table fits 80 columns; --wide (or a terminal of 150 columns or more) adds Bus-Id, clocks, "
        "P-state, ECC and NVLink, in parts one under the other where the terminal is narrower. "
        "Simulated GPUs are marked.",
    )
    _add_common(once)
    add_json_option(once, "the snapshot")
    once.add_argument(
        "--wide", action="store_true", help="every column (about 150 characters: Bus-Id, clocks, ECC, NVLink)"
    )
    add_tick_option(once)
    once.set_defaults(func=cmd_once)


def _add_check_config(sub: argparse._SubParsersAction[CommandParser]) -> None:
    """``gpumon check-config FILE``."""
    check = add_command(
        sub,
        "check-config",
        "validate a config file and the files it names (web config, scenario) as run would; print every problem",
        "Exit 0 when gpumon run --config FILE would start, else 2 with every problem, each with the line and "
        "column of the file where it has one.",
    )
    check.add_argument("file", type=Path, help="the gpumon YAML config file")
    check.set_defaults(func=cmd_check_config)


def cmd_run(args: argparse.Namespace) -> int:
    import dataclasses

    from gpumon.backends.base import ScenarioError
    from gpumon.backends.factory import make_backend
    from gpumon.config.file import reloader
    from gpumon.daemon import Daemon
    from gpumon.util.log_setup import configure_logging
    from gpumon.util.state.lock import StateDirBusy

    config = load_or_report(args)
    if config is None:
        return EXIT_USAGE
    configure_logging(config.log_level)
    # nothing the daemon makes is writable by group or others whatever umask it was started with (a state
    # directory made under umask 000 let any user clear a fault); the files that need more say so themselves
    os.umask(os.umask(0o022) | 0o022)
    explicit_state = args.state_dir is not None or "GPUMON_STATE_DIR" in os.environ
    state_dir = _usable_state_dir(config, explicit_state)
    if state_dir is None:
        print(f"gpumon: state directory {config.state_dir} cannot be created or written", file=sys.stderr)
        return EXIT_FAULT
    config = dataclasses.replace(config, state_dir=state_dir)
    try:
        backend = make_backend(config.backend, config.fake_gpus, daemon=True)
    except ScenarioError as exc:
        print(f"gpumon: bad scenario:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    # the web config's errors, where one is given (otherwise its modules are not loaded)
    web_config_errors: tuple[type[WebConfigError], ...] = ()
    if config.web_config_file:
        from gpumon.http.webconfig import WebConfigError

        web_config_errors = (WebConfigError,)
    try:
        daemon = Daemon(config, backend, reloader(args.config, _flags(args)))
    except web_config_errors as exc:
        print(f"gpumon: web config {config.web_config_file}: {len(exc.problems)} problem(s):", file=sys.stderr)
        for problem in exc.problems:
            print(problem_line(problem), file=sys.stderr)
        return EXIT_USAGE
    except StateDirBusy as exc:  # two daemons on one state directory: a configuration problem
        print(f"gpumon: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        print(f"gpumon: cannot listen on {config.listen}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAULT
    return daemon.run_forever()


def cmd_once(args: argparse.Namespace) -> int:
    from gpumon.backends.base import ScenarioError
    from gpumon.backends.factory import make_backend
    from gpumon.collect.poller import Poller
    from gpumon.collect.store import SnapshotStore
    from gpumon.model.snapshot import to_jsonable

    config = load_or_report(args)
    if config is None:
        return EXIT_USAGE
    logging.basicConfig(level=getattr(logging, config.log_level.upper()) if args.log_level else logging.CRITICAL)
    try:
        backend = make_backend(config.backend, config.fake_gpus)
    except ScenarioError as exc:
        print(f"gpumon: bad scenario:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    from gpumon.backends.play import PlayClock, play, tick_note, tick_to_show
    from gpumon.collect.processes import enrich

    tick = tick_to_show(backend, args.tick)
    if tick is None and args.tick is not None:
        print("gpumon: --tick plays a scenario: it needs --backend fake:NAME or fake:PATH", file=sys.stderr)
        return EXIT_USAGE
    clock = PlayClock()
    poller = Poller(backend, SnapshotStore(), monotonic=clock, enrich_processes=enrich)
    snapshot = play(poller.poll, tick, clock)
    backend.shutdown()
    if not snapshot.nvml_up:
        print(f"gpumon: NVML unavailable: {snapshot.nvml_error}", file=sys.stderr)
        return EXIT_FAULT
    if args.json is not None:
        try:
            emit_json(to_jsonable(snapshot), args.json)
        except OSError as exc:
            print(f"gpumon: cannot write --json {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
    if not to_stdout(args.json):
        from gpumon.commands.table import print_snapshot

        print_snapshot(snapshot, wide=True if args.wide else None)
        if tick:
            print(tick_note(tick, args.tick is not None))
    return EXIT_OK


def cmd_scenarios(args: argparse.Namespace) -> int:
    import shutil
    import textwrap

    from gpumon.backends import scenarios

    names = scenarios.names()
    width = max(len(n) for n in names)
    columns = max(60, shutil.get_terminal_size((80, 24)).columns)  # 80 in a pipe, as COLUMNS says
    for name in names:
        lines = textwrap.wrap(scenarios.description(name), columns - width - 2) or [""]
        print(f"{name:<{width}}  {lines[0]}")
        for line in lines[1:]:
            print(f"{'':<{width}}  {line}")
    print("\nplay one: gpumon run --backend fake:NAME (or gpumon once --backend fake:NAME);")
    print("see docs/scenarios.md")
    return EXIT_OK


def cmd_check_config(args: argparse.Namespace) -> int:
    """Exit 2 listing every problem that ``gpumon run --config FILE`` would meet, else 0."""
    config = checked_config(args.file, {}, path_must_exist=True)
    if not isinstance(config, Config):
        print(f"{args.file}: {len(config)} problem(s):", file=sys.stderr)
        for problem in config:
            print(problem_line(problem), file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.file}: OK (listen {config.listen}, backend {config.backend}, every {config.interval_seconds:g}s)")
    return EXIT_OK


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace | None:
    """The parsed command line; None (after printing the help) when it names no command."""
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(configured={named_command(words) or ""})
    args = parser.parse_args(words)
    if not getattr(args, "func", None):
        parser.print_help()
        return None
    return args


def _usage_error(words: Sequence[str], exc: UsageError) -> int:
    """The exit code of a command line argparse rejected: the command's own ``usage_error(words,
    message)`` where its module has one and it answers (``gpumon health``: UNKNOWN), else argparse's
    usage and error lines and exit 2."""
    command = named_command(words) or ""
    if command in MODULE_COMMANDS:
        handler = getattr(importlib.import_module(MODULE_COMMANDS[command][0]), "usage_error", None)
        code = handler(words, exc.message) if handler is not None else None
        if code is not None:
            return int(code)
    exc.parser.print_usage(sys.stderr)
    print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; a closed stdout (its reader went away) ends it quietly with 141
    (gpumon.util.pipes)."""
    hold_hangups(sys.argv[1:] if argv is None else argv)  # gpumon run: a SIGHUP while it starts is kept
    tolerate_unencodable()  # a process name the locale cannot encode never fails the output
    try:
        try:
            code = _main(argv)
        finally:  # what is still buffered meets a closed pipe here, not in the interpreter's exit
            sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()
    except SystemExit as exc:  # rich's Console meets a closed pipe with SystemExit(1); emit_json with 141
        if isinstance(exc.__context__, BrokenPipeError):
            return reader_gone()
        raise
    return code


def _main(argv: Sequence[str] | None) -> int:
    # The parser is garbage once the command line is parsed: it is not held while a daemon runs.
    try:
        args = parse_args(argv)
    except UsageError as exc:
        return _usage_error(sys.argv[1:] if argv is None else argv, exc)
    if args is None:
        return EXIT_USAGE
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
