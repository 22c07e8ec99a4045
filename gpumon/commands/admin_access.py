"""Who may change a node's health state by hand (``gpumon health clear``, ``accept-inventory``).

Root; the owner of the state directory (the daemon's service user, or whoever runs gpumon with a state
directory of their own); and the members of the state directory's group where that folder is
group-writable (the admin group: ``chgrp gpumon-admin /var/lib/gpumon && chmod 2770 /var/lib/gpumon``,
docs/health.md "Who may clear"). Anyone else is refused before anything is written, whatever the
folder's other-permissions say (a state directory made world-writable by a umask of 000 gives nobody
the right to clear a fault).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path


def _name_of_user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _name_of_group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _existing(path: Path) -> Path:
    """``path``, or the nearest folder above it that exists."""
    path = path.absolute()
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def refusal(state_dir: Path, what: str) -> str | None:
    """Why the calling user may not ``what`` (e.g. "clear faults") in ``state_dir``; None when they may."""
    euid = os.geteuid()
    if euid == 0:
        return None
    where = _existing(Path(state_dir))
    if where != Path(state_dir).absolute():
        return (
            f"cannot {what}: the state directory {state_dir} does not exist (no gpumon has used it); "
            f"give the daemon's --state-dir (you are {_name_of_user(euid)}; nothing was written)"
        )
    try:
        st = where.stat()
    except OSError as exc:
        return f"cannot {what}: {where}: {exc.strerror or exc}"
    if st.st_uid == euid:
        return None
    group_writable = bool(st.st_mode & stat.S_IWGRP)
    member = st.st_gid == os.getegid() or st.st_gid in os.getgroups()
    if group_writable and member:
        return None
    admins = (
        f"members of group {_name_of_group(st.st_gid)}"
        if group_writable
        else "its group's members (were it group-writable)"
    )
    return (
        f"only root, the owner of {where} ({_name_of_user(st.st_uid)}) or {admins} may {what}; "
        f"you are {_name_of_user(euid)} (nothing was written)"
    )
