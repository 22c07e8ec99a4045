"""Text from outside gpumon, for a terminal: a process's name and user, a GPU's model name, a
driver's version, a receiver's error body, a node's name.

``shown`` makes it a rich ``Text``: never read as markup (a process named ``[/]`` or ``[bold]``),
every control or format character (an ANSI escape sequence, a hyperlink, a bidi override) written
as a ``\\x1b``-style escape rather than to the operator's terminal, and every character the
output's encoding cannot write (a Latin-1 locale) escaped the same way, so the table is measured
as it is written.
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Callable

from rich.text import Text


def shown(value: object, missing: str = "?") -> Text:
    """``value`` (from outside: a process name, a user, a GPU name) as plain text for the terminal:
    no markup, and every control or format character (C0, C1, DEL, bidi overrides) as an escape."""
    if value is None or value == "":
        return Text(missing)
    text = str(value)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"  # what a Latin-1 locale cannot write, escaped
    unwritable = _unwritable(encoding)
    return Text("".join(_escape(c) if unicodedata.category(c) in _HIDDEN or unwritable(c) else c for c in text))


def _unwritable(encoding: str) -> Callable[[str], bool]:
    """Whether a character cannot be written in ``encoding`` (never, for UTF-8)."""
    if encoding.lower().replace("-", "").replace("_", "") in ("utf8", "utf8mb4"):
        return lambda char: False

    def unwritable(char: str) -> bool:
        try:
            char.encode(encoding)
        except (UnicodeEncodeError, LookupError):
            return True
        return False

    return unwritable


_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Unicode categories never written raw: controls, format characters, surrogates, private use,
unassigned, line and paragraph separators."""


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
