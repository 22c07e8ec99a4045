"""Command-line pieces shared by gpumon's commands (gpumon.cli and the commands of its packages, such as
``gpumon health``): the common options, ``--tick``, the configuration gate and the usable state directory."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from gpumon.config.file import DEFAULT_STATE_DIR, Config, ConfigError, load
from gpumon.util.state.files import close_tree_to_others, ensure_dir
from gpumon.util.state.handback import give_back

log = logging.getLogger("gpumon")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The options every command that reads the configuration takes: --config, --backend, --fake-gpus,
    --state-dir, --log-level."""
    parser.add_argument("--config", type=Path, help="YAML config file (default /etc/gpumon/gpumon.yaml if it exists)")
    parser.add_argument(
        "--backend",
        help="nvml (real GPUs, the default), fake (simulated GPUs), fake:NAME (a named scenario: gpumon scenarios), "
        "fake:PATH (a scenario file), replay:FILE (a recording or bundle of a real host: gpumon record, gpumon bundle)",
    )
    parser.add_argument("--fake-gpus", type=int, dest="fake_gpus", help="number of simulated GPUs for --backend fake")
    parser.add_argument(
        "--state-dir", type=Path, dest="state_dir", help=f"state directory (default {DEFAULT_STATE_DIR})"
    )
    parser.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])


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


def config_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The options given on the command line that override the configuration file, by setting name."""
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
    config = checked_config(args.config, config_flags(args), path_must_exist=args.config is not None)
    if isinstance(config, Config):
        return config
    print(f"gpumon: {len(config)} problem(s) in the configuration:", file=sys.stderr)
    for problem in config:
        print(problem_line(problem), file=sys.stderr)
    return None


def usable_state_dir(config: Config, explicit: bool) -> Path | None:
    """The state dir, created if needed. The default falls back to ~/.local/state/gpumon for non-root users."""
    candidates = [config.state_dir]
    if not explicit and config.state_dir == DEFAULT_STATE_DIR:
        base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        candidates.append(Path(base) / "gpumon")
    for path in candidates:
        # a tree made under a umask of 000 is closed to other users where it is ours, or said to be open
        # and, run as root, the folders an older root run left root's in the service user's tree are given back
        for line in [*close_tree_to_others(path), *give_back(path)]:
            log.warning("state directory: %s", line)
        try:
            ensure_dir(path)  # 0755 whatever the umask; refused where others may write (gpumon.util.state.files)
        except OSError:
            continue
        if os.access(path, os.W_OK):
            if path != config.state_dir:
                log.warning("state directory %s is not writable; using %s", config.state_dir, path)
            return path
    return None


def terminal_columns(stream: TextIO) -> int | None:
    """The terminal's width when ``stream`` is one, else None: a pipe (Nagios, NHC, a log) gets whole lines."""
    import shutil

    return shutil.get_terminal_size().columns if stream.isatty() else None


def wrapped(first: str, text: str, indent: int, columns: int | None) -> str:
    """``first`` then ``text``, wrapped between words to ``columns`` with later lines indented by
    ``indent`` (None: one line); a figure and its unit (``90 °C``) stay together."""
    if columns is None:
        return first + text
    import textwrap

    kept = text.replace(" °C", "\u00a0°C")
    lines = textwrap.wrap(kept, max(20, columns - indent), break_long_words=False, break_on_hyphens=False) or [""]
    lines = [line.replace("\u00a0", " ") for line in lines]
    return "\n".join([first + lines[0], *(" " * indent + line for line in lines[1:])])


def problem_line(problem: str) -> str:
    """One problem of a list on stderr: ``  - `` and the problem, wrapped between words under itself in a
    terminal (whole in a pipe or a log)."""
    return wrapped("  - ", problem, 4, terminal_columns(sys.stderr))
