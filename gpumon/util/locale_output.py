"""Output that never fails on the locale: a character the terminal's encoding cannot write (a
process name in Chinese under a Latin-1 locale, ``°C`` under ``LANG=C`` with an ASCII encoding) is
written as a backslash escape (``\\u8bad``) instead of raising UnicodeEncodeError mid-table.

Any user of a GPU chooses their process's name, so what gpumon prints is not its own to pick.
"""

from __future__ import annotations

import contextlib
import io
import sys


def tolerate_unencodable() -> None:
    """Make stdout and stderr write what their encoding lacks as backslash escapes (their encoding kept)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            with contextlib.suppress(ValueError, OSError):  # closed, or not reconfigurable: left as it is
                stream.reconfigure(errors="backslashreplace")
