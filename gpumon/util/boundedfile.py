"""Reading a file someone else may have replaced: only a regular file, only so many bytes.

``read_regular_file(path, max_bytes)`` opens without blocking (a FIFO put where a config was
would otherwise wait for a writer for ever, and a SIGHUP reload with it), refuses anything but a
regular file (a FIFO, a device such as /dev/zero, a socket, a directory) and any file larger than
``max_bytes``, and raises ``FileReadError`` with a one-line reason."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileReadError(Exception):
    """The file cannot be read as a config; ``str()`` is the reason, one line, without the path."""


_KINDS = (
    (stat.S_ISDIR, "is a directory, not a file"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
)


def read_regular_file(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path`` (symbolic links followed), at most ``max_bytes``;
    raises FileReadError (no such file, not a regular file, too large, cannot be read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise FileReadError("no such file") from None
    except ValueError:  # a NUL byte in the name
        raise FileReadError("not a usable file name") from None
    except OSError as exc:
        raise FileReadError(f"cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        for test, reason in _KINDS:
            if test(mode):
                raise FileReadError(reason)
        if not stat.S_ISREG(mode):
            raise FileReadError("is not a regular file")
        data = read_up_to(fd, max_bytes)
    except OSError as exc:
        raise FileReadError(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise FileReadError(f"larger than {_size(max_bytes)}; this is not a config file")
    return data


def read_up_to(fd: int, max_bytes: int) -> bytes:
    """At most ``max_bytes`` + 1 bytes from the open ``fd``, read in chunks of 1 MiB: more than
    ``max_bytes`` means the file is too large, without reading a file that never ends (/dev/zero)."""
    chunks: list[bytes] = []
    size = 0
    while size <= max_bytes:
        chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 and n % (1024 * 1024) == 0 else f"{n // 1024} KiB"
