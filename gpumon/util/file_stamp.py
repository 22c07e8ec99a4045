"""A file's stamp: what tells a reader that keeps a file's contents that the file was rewritten since."""

from __future__ import annotations

import os
from pathlib import Path

FileStamp = tuple[int, int, int]
"""(inode, modification time in ns, size in bytes): a rename over the file (an atomic write) changes the
inode, a write in place the time or the size."""


def file_stamp(path: str | Path) -> FileStamp | None:
    """``path``'s FileStamp (following a symbolic link), None when it is absent or cannot be looked at."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
