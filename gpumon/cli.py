"""Command line: subcommands map to functions; exit 0 ok, 1 fault, 2 usage or bad config."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gpumon import __version__
from gpumon.config.file import DEFAULT_PORT, DEFAULT_STATE_DIR, Config, ConfigError, load
from gpumon.early_hangup import hold_hangups
from gpumon.util.jsonout import add_json_option, emit_json, to_stdout
from gpumon.util.pipes import reader_gone
from gpumon.util.state.files import ensure_dir

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

    from gpumon.http.webconfig import WebConfigError

EXIT_OK = 0
EXIT_FAULT = 1
EXIT_USAGE = 2

log = logging.getLogger("gpumon")


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML config file (default /etc/gpumon/gpumon.yaml if it exists)")
    parser.add_argument(
        "--backend",
        help="nvml (real GPUs, the default), fake (simulated GPUs), fake:NAME (a named scenario: gpumon scenarios), "
        "fake:PATH (a scenario file)",
    )
    parser.add_argument("--fake-gpus", type=int, dest="fake_gpus", help="number of simulated GPUs for --backend fake")
    parser.add_argument(
        "--state-dir", type=Path, dest="state_dir", help=f"state directory (default {DEFAULT_STATE_DIR})"
    )
    parser.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])


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
}
"""Commands whose module (with a ``configure(parser)``) is imported only to parse that command:
name -> (module, the line ``gpumon --help`` shows)."""


def named_command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (gpumon's own options,
    --help and --version, take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


class UsageError(Exception):
    """A command line argparse rejects; ``main`` decides what the user sees and the exit code."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors raise UsageError instead of exiting 2 (its subparsers too), so a
    command can answer them its own way: ``gpumon health`` says UNKNOWN (a check that cannot judge)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        """As argparse's, but a closed stdout is not silently ignored: main() answers it (exit 141)."""
        if message:
            (file or sys.stderr).write(message)


def _command(
    sub: argparse._SubParsersAction[_Parser], name: str, help_line: str, more: str = ""
) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` starts with the line ``gpumon --help`` shows for it (a module's
    ``configure`` may give a longer description)."""
    description = help_line[0].upper() + help_line[1:] + "." + (f" {more}" if more else "")
    return sub.add_parser(name, help=help_line, description=description)


def build_parser(configured: Collection[str] | None = None) -> argparse.ArgumentParser:
    """gpumon's parser. Of MODULE_COMMANDS, only those in ``configured`` (None: all) get their
    options, which imports their modules; the others are listed with their help line. main()
    configures only the command it runs, so ``gpumon run`` loads no other command's code."""
    parser = _Parser(
        prog="gpumon",
        description="GPU monitoring, alerting and burn-in for Linux GPU servers.",
    )
    parser.add_argument("--version", action="version", version=f"gpumon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = _command(sub, "run", "run the daemon: poll GPUs, serve /metrics, send alerts")
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

    once = _command(
        sub,
        "once",
        "poll once and print a table (or JSON), then exit",
        "The table fits 80 columns; --wide (or a terminal of 150 columns or more) adds Bus-Id, clocks, "
        "P-state, ECC and NVLink. Simulated GPUs are marked.",
    )
    _add_common(once)
    add_json_option(once, "the snapshot")
    once.add_argument(
        "--wide", action="store_true", help="every column (about 150 characters: Bus-Id, clocks, ECC, NVLink)"
    )
    add_tick_option(once)
    once.set_defaults(func=cmd_once)

    check = _command(
        sub,
        "check-config",
        "validate a config file and the files it names (web config, scenario) as run would; print every problem",
        "Exit 0 when gpumon run --config FILE would start, else 2 with every problem, each with the line and "
        "column of the file where it has one.",
    )
    check.add_argument("file", type=Path, help="the gpumon YAML config file")
    check.set_defaults(func=cmd_check_config)

    scen = _command(sub, "scenarios", "list the named fake-backend scenarios (--backend fake:NAME)")
    scen.set_defaults(func=cmd_scenarios)

    for name, (module, help_line) in MODULE_COMMANDS.items():
        command = _command(sub, name, help_line)
        if configured is None or name in configured:
            # gpumon.burn.command registers options only; torch is imported when a burn runs
            importlib.import_module(module).configure(command)
    return parser


def add_tick_option(parser: argparse.ArgumentParser) -> None:
    """``--tick N``: the tick of a scenario a one-shot command shows (gpumon.backends.play)."""
    parser.add_argument(
        "--tick",
        type=_tick,
        help="with --backend fake:NAME, the scenario's tick to show (default: its last scripted event; 0: the first poll)",
    )


def _tick(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if not 0 <= value <= 100_000:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 100000, got {text!r}")
    return value


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    names = (
        "backend",
        "fake_gpus",
        "state_dir",
        "log_level",
        "listen",
        "interval_seconds",
        "web_config_file",
        "compat",
        "compat_hostname_label",
        "compat_labels",
        "processes",
    )
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def checked_config(path: Path | None, flags: dict[str, Any], path_must_exist: bool) -> Config | list[str]:
    """The configuration, or every problem in it: the one gate that ``check-config``, ``run`` and
    ``once`` go through (``run``'s SIGHUP reload calls the same ``gpumon.config.file.load``)."""
    try:
        return load(path, os.environ, flags, path_must_exist=path_must_exist)
    except ConfigError as exc:
        return exc.problems


def load_or_report(args: argparse.Namespace) -> Config | None:
    """``run``/``once``: the checked configuration, or None after printing every problem."""
    config = checked_config(args.config, _flags(args), path_must_exist=args.config is not None)
    if isinstance(config, Config):
        return config
    print(f"gpumon: {len(config)} problem(s) in the configuration:", file=sys.stderr)
    for problem in config:
        print(f"  - {problem}", file=sys.stderr)
    return None


def _usable_state_dir(config: Config, explicit: bool) -> Path | None:
    """The state dir, created if needed. The default falls back to ~/.local/state/gpumon for non-root users."""
    candidates = [config.state_dir]
    if not explicit and config.state_dir == DEFAULT_STATE_DIR:
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        candidates.append(Path(base) / "gpumon")
    for path in candidates:
        try:
            ensure_dir(path)  # 0755 whatever the umask (gpumon.util.state.files)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            if path != config.state_dir:
                log.warning("state directory %s is not writable; using %s", config.state_dir, path)
            return path
    return None


def cmd_run(args: argparse.Namespace) -> int:
    import dataclasses

    from gpumon.backends.base import ScenarioError
    from gpumon.backends.factory import make_backend
    from gpumon.config.file import reloader
    from gpumon.daemon import Daemon, configure_logging
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
            print(f"  - {problem}", file=sys.stderr)
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
    from gpumon.backends.play import play, tick_note, tick_to_show
    from gpumon.collect.processes import enrich

    tick = tick_to_show(backend, args.tick)
    if tick is None and args.tick is not None:
        print("gpumon: --tick plays a scenario: it needs --backend fake:NAME or fake:PATH", file=sys.stderr)
        return EXIT_USAGE
    poller = Poller(backend, SnapshotStore(), enrich_processes=enrich)
    snapshot = play(poller.poll, tick)
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
            print(f"  - {problem}", file=sys.stderr)
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
