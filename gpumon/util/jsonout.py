"""One ``--json`` convention for every command that can answer in JSON (once, alerts, burn).

``--json`` alone or ``--json -`` prints the JSON to stdout (and nothing else goes there: a
human-readable table or report is left out, or sent to stderr); ``--json PATH`` writes it to
PATH (atomically: a reader never sees half a file) and the command prints as usual.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gpumon.util.pipes import reader_gone
from gpumon.util.state.files import json_text, write_text_atomic

STDOUT = "-"


def add_json_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--json [PATH]`` on ``parser``; ``args.json`` is None, ``"-"`` (stdout) or a path."""
    parser.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        default=None,
        metavar="PATH",
        help=f"{what} as JSON: on stdout (--json or --json -) or written to PATH",
    )


def to_stdout(dest: str | None) -> bool:
    """True when ``--json`` sends the JSON to stdout."""
    return dest == STDOUT


def emit_json(data: Any, dest: str) -> None:
    """Print ``data`` as JSON (``dest`` is ``-``) or write it to the file ``dest``; OSError when it cannot."""
    text = json_text(data)
    if dest == STDOUT:
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:  # the reader went away: quietly, not "cannot write --json"
            raise SystemExit(reader_gone()) from None
        return
    write_text_atomic(Path(dest).absolute(), text)
