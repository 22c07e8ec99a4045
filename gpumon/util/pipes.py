"""A command whose reader went away (``gpumon scenarios | head -1``) ends quietly.

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError, and the interpreter's
last flush at exit would print a traceback. ``reader_gone()`` follows the recipe of Python's
signal module documentation ("Note on SIGPIPE"): stdout is pointed at /dev/null, so nothing more
can fail, and the command exits EXIT_BROKEN_PIPE.
"""

from __future__ import annotations

import os
import sys

EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE (13): the status a shell gives a command that SIGPIPE ended, so a ``set -o pipefail``
script sees of ``gpumon scenarios | head -1`` what it sees of ``yes | head -1``."""


def reader_gone() -> int:
    """Point stdout at /dev/null and give EXIT_BROKEN_PIPE."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_BROKEN_PIPE
