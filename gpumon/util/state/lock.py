"""Locks on the state directory (fcntl.flock on a lock file): one daemon per state directory, and one
read-modify-write of the health state at a time.

* ``DaemonLock``: ``STATE_DIR/daemon.lock``, held by ``gpumon run`` for as long as it runs (the kernel
  drops it when the process ends, however it ends). A second daemon on the same state directory does not
  start: ``StateDirBusy`` names the holder's pid, and ``gpumon run`` exits 2 (a configuration problem,
  which systemd's ``RestartPreventExitStatus=2`` does not retry).
* ``state_lock(folder, name=CHECK_LOCK_NAME)``: ``STATE_DIR/health/check.lock``, held by one ``gpumon
  health`` run from its judging to its Slurm step: slurmd starts a check every HealthCheckInterval even
  while the last one still runs, and the next waits for it (within its own budget) instead of judging
  and draining beside it.
* ``state_lock(folder)``: ``folder/.lock``, held for the few milliseconds of one read-modify-write
  (``gpumon health`` runs that Slurm starts while the last one still runs, the daemon's saves, an accepted
  inventory), so overlapping runs lose nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from gpumon.util.state.anchored import existing_file, open_file, open_folder

DAEMON_LOCK_NAME = "daemon.lock"
LOCK_NAME = ".lock"
CHECK_LOCK_NAME = "check.lock"
LOCK_FILE_MODE = 0o644
"""Readable by all (a lock held through a read-only descriptor is still a lock): who holds it is no secret."""


class StateDirBusy(Exception):
    """Another gpumon daemon holds the state directory."""


def _open_lock_file(folder: Path, name: str) -> int:
    """A descriptor on ``folder/name``, reached through checked folder descriptors and never through a
    link (``gpumon.util.state.anchored``): created with LOCK_FILE_MODE whatever the umask; one that exists
    is left as it is (never chmodded), read-only where it is not ours to write (flock needs no write
    access). Raises UnsafePath (a link, a FIFO, a hard link, a planted folder) or another OSError."""
    folder_fd = open_folder(folder, create=True)
    try:
        try:
            fd, _created = open_file(folder_fd, name, os.O_RDWR, LOCK_FILE_MODE)
        except PermissionError:
            fd = existing_file(folder_fd, name, os.O_RDONLY)
    finally:
        os.close(folder_fd)
    return fd


class DaemonLock:
    """``STATE_DIR/daemon.lock`` held until ``release`` (or the process ends)."""

    def __init__(self, state_dir: Path) -> None:
        """Raises StateDirBusy when another process holds it, OSError when it cannot be made."""
        self.path = Path(state_dir) / DAEMON_LOCK_NAME
        self._fd: int | None = _open_lock_file(Path(state_dir), DAEMON_LOCK_NAME)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(self._fd)
            self.release()
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateDirBusy(
                    f"another gpumon daemon{f' (pid {holder})' if holder else ''} uses the state directory "
                    f"{state_dir}; stop it or give this one its own --state-dir"
                ) from exc
            raise
        try:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass  # opened read-only: the lock holds all the same

    @classmethod
    def take(cls, state_dir: Path, logger: logging.Logger) -> DaemonLock | _NoLock:
        """The lock, or (where the lock file cannot be made at all, a read-only state directory) a stand-in,
        said in one log line. Raises StateDirBusy when another daemon holds it."""
        try:
            return cls(state_dir)
        except StateDirBusy:
            raise
        except OSError as exc:
            logger.warning(
                "cannot lock the state directory %s (%s): a second daemon on it would go unnoticed",
                state_dir,
                exc.strerror or exc,
            )
            return _NoLock()

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


class _NoLock:
    """What ``DaemonLock.take`` gives where no lock could be made."""

    def release(self) -> None:
        return None


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return ""


@contextlib.contextmanager
def state_lock(folder: Path, timeout_seconds: float = 30.0, name: str = LOCK_NAME) -> Iterator[bool]:
    """Hold ``folder/name`` (``.lock``) exclusively for the block; yields True when held.

    Yields False (and the block runs unlocked) where the lock file cannot be opened at all: a reader
    without write access to the folder, whose own writes fail anyway. Raises TimeoutError when another
    process holds it longer than ``timeout_seconds`` (a read-modify-write takes milliseconds)."""
    try:
        fd = _open_lock_file(folder, name)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"{folder / name} held by another gpumon for {timeout_seconds:g} s") from None
                time.sleep(0.01)
        yield True
    finally:
        os.close(fd)
