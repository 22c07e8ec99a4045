"""Folders and files under the state directory, opened through checked folder descriptors, never through a
link or a folder another user planted.

The state directory belongs to the daemon's service user, while ``gpumon health`` and ``gpumon burn`` also
run there as root. A service user (or anyone, where a folder is world-writable) could put a symbolic link
at ``health/check.lock`` to the password database, or swap a folder for a link to ``/etc``, and have root
chmod, append to or truncate what it points at. So every folder on the way is opened with ``openat`` from
the one above it:

* a symbolic link is followed only where root or the calling user made it (a link ``/var/run -> /run``
  the system made is fine; one another user planted is refused);
* a folder that every user may write (without the sticky bit, or as the folder a file goes in) is refused:
  anyone could have replaced what it holds; so is one inside another user's tree that its group may
  write without being an admin group's setgid folder (``close_to_others``, called by ``gpumon run`` and
  ``gpumon health``, repairs a tree made under a umask of 000);
* below the first folder owned by another user than root and the caller (the service user's state
  directory, as root sees it), every folder belongs to root, the caller or that same user;
* a file is created with O_EXCL and then given its mode; one that exists is opened without following a
  link, must be a regular file with one name (not a hard link to a file elsewhere), and is never chmodded.

Whatever is refused raises ``UnsafePath``, an OSError, so a caller that copes with a folder it cannot write
copes with this one too; its text says what was found and where.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

DIR_MODE = 0o755
GROUP_DIR_MODE = 0o2775
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class UnsafePath(OSError):
    """A folder or file under the state directory that gpumon will not use (a link another user made, a
    folder every user may write, a file that is not a regular file of one name); ``str()`` says which."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)

    def __str__(self) -> str:
        return str(self.strerror)


def open_folder(path: str | Path, *, create: bool) -> int:
    """A descriptor (O_DIRECTORY) on the folder ``path``, reached from ``/`` one folder at a time as the
    module says; missing folders are made (``create``) with DIR_MODE (GROUP_DIR_MODE and the group of the
    folder above where that one is setgid and group-writable) whatever the umask, and, made by root in a
    folder another user owns, given to that user. Raises UnsafePath, FileNotFoundError (not ``create``) or
    another OSError; the caller closes the descriptor."""
    where = Path(os.path.abspath(path))
    fd = os.open("/", _DIR_FLAGS)
    owner: int | None = None
    try:
        for depth, name in enumerate(where.parts[1:], start=2):
            here = Path(*where.parts[:depth])
            child = _step_or_make(fd, name, here, create)
            os.close(fd)
            fd = child
            owner = _checked_owner(os.fstat(fd), owner, here)
        if os.fstat(fd).st_mode & stat.S_IWOTH:
            raise UnsafePath(f"{where} is writable by every user: gpumon keeps nothing there (chmod o-w)")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _step_or_make(fd: int, name: str, here: Path, create: bool) -> int:
    """The folder ``name`` in the folder ``fd`` (``here`` is its path, for messages), made where missing."""
    for _ in range(3):  # a folder made or removed meanwhile by another process: look again
        try:
            return _step(fd, name, here)
        except FileNotFoundError:
            if not create:
                raise
        try:
            return _make(fd, name, here)
        except FileExistsError:
            continue
    return _step(fd, name, here)


def _step(fd: int, name: str, here: Path) -> int:
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode):
            raise
        if st.st_uid not in (0, os.geteuid()):
            raise UnsafePath(f"{here} is a symbolic link made by user {st.st_uid}: gpumon does not follow it") from None
        return os.open(name, _DIR_FLAGS, dir_fd=fd)


def _make(fd: int, name: str, here: Path) -> int:
    """Make the folder ``name`` in ``fd`` and give it its mode (and owner) through its own descriptor."""
    parent = os.fstat(fd)
    os.mkdir(name, 0o700, dir_fd=fd)
    child = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    try:
        if os.fstat(child).st_uid == os.geteuid():  # ours: the one just made
            grouped = bool(parent.st_mode & stat.S_ISGID and parent.st_mode & stat.S_IWGRP)
            os.fchmod(child, GROUP_DIR_MODE if grouped else DIR_MODE)
            if os.geteuid() == 0 and parent.st_uid != 0:  # root working in the service user's state directory
                os.fchown(child, parent.st_uid, parent.st_gid)
    except BaseException:
        os.close(child)
        raise
    return child


def _checked_owner(st: os.stat_result, owner: int | None, here: Path) -> int | None:
    """The tree's owner after the folder ``here`` (``st``): the first owner other than root and the caller;
    raises UnsafePath for a folder every user may write (not sticky) or one a third user owns."""
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise UnsafePath(f"{here} is writable by every user: gpumon keeps nothing under it (chmod o-w)")
    uid = st.st_uid
    if uid not in (0, os.geteuid(), owner if owner is not None else uid):
        raise UnsafePath(f"{here} belongs to user {uid}, not to the owner of the folders above it ({owner})")
    if uid not in (0, os.geteuid()):
        owner = uid
    if owner is not None and group_writable_by_chance(st.st_mode):
        raise UnsafePath(f"{here} is writable by its group without being an admin group's (chmod g-w, or 2775)")
    return owner


def group_writable_by_chance(mode: int) -> bool:
    """Whether a folder's group may write it without the setgid bit that marks an admin group's folder
    (docs/health.md "Who may clear": ``chmod 2770``): a umask of 000 or 002 left it so."""
    return bool(mode & stat.S_IWGRP and not mode & stat.S_ISGID)


def open_file(folder_fd: int, name: str, flags: int, mode: int) -> tuple[int, bool]:
    """A descriptor on the file ``name`` in ``folder_fd``, opened with ``flags`` (O_WRONLY|O_APPEND, O_RDWR),
    and whether this call created it (then with ``mode`` exactly, whatever the umask). One that exists is
    opened without following a link and must be a regular file of one name; its mode is left alone.
    Raises UnsafePath or another OSError."""
    for _ in range(3):  # a file removed between the two opens: create it after all
        try:
            fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder_fd)
        except FileExistsError:
            pass
        else:
            try:
                os.fchmod(fd, mode)
            except BaseException:
                os.close(fd)
                raise
            return fd, True
        try:
            return existing_file(folder_fd, name, flags), False
        except FileNotFoundError:
            continue
    return existing_file(folder_fd, name, flags), False


def existing_file(folder_fd: int, name: str, flags: int) -> int:
    """A descriptor on the existing regular file ``name`` in ``folder_fd`` (not a link, one name only)."""
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, dir_fd=folder_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise UnsafePath(f"{name} is a symbolic link or a FIFO, not a file gpumon wrote") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = (
            "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} names (a hard link)"
        )
        raise UnsafePath(f"{name} is {what}, not a file gpumon wrote")
    return fd
