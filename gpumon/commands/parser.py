"""The argparse parts of gpumon's command line, apart from what the commands are.

``CommandParser`` raises ``UsageError`` where argparse would exit 2, so a command can answer a
bad command line its own way; ``add_command`` makes a subcommand whose ``--help`` starts with the
line ``gpumon --help`` shows for it; ``named_command`` says which command a command line names.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from _typeshed import SupportsWrite


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


class CommandParser(argparse.ArgumentParser):
    """argparse whose usage errors raise UsageError instead of exiting 2 (its subparsers too), so a
    command can answer them its own way: ``gpumon health`` says UNKNOWN (a check that cannot judge)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        """As argparse's, but a closed stdout is not silently ignored: main() answers it (exit 141)."""
        if message:
            (file or sys.stderr).write(message)


def add_command(
    sub: argparse._SubParsersAction[CommandParser], name: str, help_line: str, more: str = ""
) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` starts with the line ``gpumon --help`` shows for it (a module's
    ``configure`` may give a longer description)."""
    description = help_line[0].upper() + help_line[1:] + "." + (f" {more}" if more else "")
    return sub.add_parser(name, help=help_line, description=description)
