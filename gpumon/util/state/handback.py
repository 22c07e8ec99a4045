"""Folders an older gpumon left root's inside the service user's state directory, given to that user.

Before this release, ``gpumon burn`` and ``gpumon health`` run as root made their folders
(``STATE_DIR/burn``, ``STATE_DIR/health/clears.d``, ``STATE_DIR/simulated/...``) root:root inside a state
directory owned by the daemon's service user, whose own burn then could not write its marker there. Folders
made since are given to the state directory's owner as they are made (``anchored``); ``give_back`` does
the same for those left before, each time root runs gpumon there.

Only the folders gpumon makes, at the places it makes them (``GPUMON_FOLDERS``), are looked at; each is
opened from the one above it without following a link (O_NOFOLLOW | O_DIRECTORY) and changed through its
own descriptor; one on another file system (a mount point) is left alone. Nothing is done where the
caller is not root or the state directory is root's own.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from gpumon.util.state.anchored import group_writable_by_chance, open_folder

_Layout = dict[str, "_Layout"]
ANY = "*"
"""In a layout: a folder of any name (one per simulated backend under ``simulated``)."""
_OWN_FOLDERS: _Layout = {"health": {"clears.d": {}}, "burn": {}}
GPUMON_FOLDERS: _Layout = {**_OWN_FOLDERS, "alerts": {}, "energy": {}, "simulated": {ANY: _OWN_FOLDERS}}
"""The folders gpumon makes in a state directory, by name, with those it makes inside each."""
MAX_SIMULATED = 1_000
"""The most folders looked at under ``simulated`` (one per simulated backend a demo ran)."""
_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def give_back(state_dir: str | Path) -> list[str]:
    """Give each folder of ``GPUMON_FOLDERS`` in ``state_dir`` that root owns to the state directory's owner
    (and the group of the folder above it, as a folder root makes there now), when this process is root
    and the state directory is another user's; what was given or left, one line per folder."""
    if os.geteuid() != 0:
        return []
    try:
        top = open_folder(state_dir, create=False)
    except OSError:
        return []  # missing or refused: the caller's own checks say why
    try:
        st = os.fstat(top)
        if st.st_uid == 0:
            return []
        return _walk(top, Path(state_dir), GPUMON_FOLDERS, st, st)
    finally:
        os.close(top)


def _walk(fd: int, where: Path, layout: _Layout, above: os.stat_result, top: os.stat_result) -> list[str]:
    """The folders of ``layout`` in the open folder ``fd`` (``where``), given back, then those inside each."""
    said: list[str] = []
    for name in _names(fd, layout):
        try:
            child = os.open(name, _FLAGS, dir_fd=fd)
        except OSError:
            continue  # missing, a link (never followed), not a folder
        try:
            said.extend(_given(child, where / name, above, top))
            inner = layout.get(name, layout.get(ANY))
            if inner:
                said.extend(_walk(child, where / name, inner, os.fstat(child), top))
        finally:
            os.close(child)
    return said


def _names(fd: int, layout: _Layout) -> list[str]:
    if ANY not in layout:
        return list(layout)
    with contextlib.suppress(OSError):
        return sorted(os.listdir(fd))[:MAX_SIMULATED]
    return []


def _given(fd: int, folder: Path, above: os.stat_result, top: os.stat_result) -> list[str]:
    """Give the open folder ``fd`` to the state directory's owner where root owns it."""
    st = os.fstat(fd)
    if st.st_uid != 0 or st.st_dev != top.st_dev:
        return []
    if st.st_mode & stat.S_IWOTH or group_writable_by_chance(st.st_mode):
        return [f"{folder} belongs to root and others may write it: not given to user {top.st_uid} (chmod go-w)"]
    try:
        os.fchown(fd, top.st_uid, above.st_gid)
    except OSError as exc:
        return [f"{folder} belongs to root and cannot be given to user {top.st_uid}: {exc.strerror or exc}"]
    return [f"{folder} belonged to root (left by an earlier gpumon run as root); now user {top.st_uid}'s"]
