"""Files under the state directory: atomic JSON (a temporary file, fsynced, renamed), appended lines,
and the folders they go in, each given its mode explicitly (never the umask of whoever runs gpumon).

Modes: folders 0755 (``anchored.DIR_MODE``: written by their owner only; 2775 where the folder above is an admin
group's, setgid and group-writable, see docs/health.md "Who may clear"), files by their writer's choice
(0600 for the alert spool, 0644 for the health state, which holds nothing secret and which root, the
admin group and the daemon's service user all need to read). A folder that root makes inside a state
directory owned by another user (the daemon's service user) is given to that user, so the daemon can
still write beside it. Folders and the files appended to are opened through checked folder descriptors
(``gpumon.util.state.anchored``): never through a link or a folder another user planted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
import zlib
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from gpumon.util.boundedfile import read_up_to
from gpumon.util.state.anchored import group_writable_by_chance, open_file, open_folder

HEALTH_DIR = "health"
SIMULATED_DIR = "simulated"
STATE_FILE_MODE = 0o644


def health_dir(state_dir: str | Path, apart: str | None = None) -> Path:
    """``STATE_DIR/health``: inventory baseline, XID lifecycle, operator clears, action log.

    ``apart``: a run whose health state is kept apart from the node's (the caller says which: simulated
    GPUs, gpumon.backends.factory.simulated_spec), named by a spec of the form ``KIND`` or ``KIND:WHAT``:
    its state goes to ``STATE_DIR/simulated/<spec as a folder name>/health`` instead, one folder per spec,
    so it never writes into the node's own state (nor one spec into another's)."""
    if apart is None:
        return Path(state_dir) / HEALTH_DIR
    return Path(state_dir) / SIMULATED_DIR / folder_name(apart) / HEALTH_DIR


def folder_name(spec: str) -> str:
    """A folder name for a spec ``KIND:WHAT``: ``kind:some-name`` -> ``kind-some-name``; a spec that names a
    file gets ``KIND-<file name>-<hash of the whole spec>`` (two files of one name stay apart)."""
    kind = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.split(":", 1)[0]).strip(".-") or "state"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", spec.replace(":", "-")).strip(".-") or kind
    if "/" in spec or len(name) > 64:
        digest = f"{zlib.crc32(spec.encode('utf-8', errors='replace')):08x}"  # zlib: the daemon has it loaded
        base = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(spec.split(":", 1)[-1]).name).strip(".-")[:40]
        name = f"{kind}-{base}-{digest}" if base else f"{kind}-{digest}"
    return name


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text`` in one rename (flushed and fsynced first, then given ``mode``), then
    fsync the folder so the rename itself survives a power loss: a reader sees the old or the new file,
    never half, even after a crash. The temporary file is ``.NAME.<random>`` beside it
    (``remove_stale_temporaries`` removes one a killed writer left). The folder must exist."""
    folder_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        write_atomic_in(folder_fd, path.name, text, mode)
    finally:
        os.close(folder_fd)


def write_atomic_in(folder_fd: int, name: str, text: str, mode: int) -> None:
    """``write_text_atomic`` in the open folder ``folder_fd``: the temporary file is made with O_EXCL and
    given ``mode`` through its descriptor (nothing is chmodded by name, which another user could have
    swapped for a link meanwhile), then renamed over ``name`` (a link there is replaced, never followed)."""
    tmp = f".{name}.{os.urandom(4).hex()}"  # (secrets would load hashlib into the daemon)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder_fd)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder_fd)
        raise
    with contextlib.suppress(OSError):  # some file systems refuse: the file itself is already on disk
        os.fsync(folder_fd)


def json_text(data: Any) -> str:
    """``data`` as the JSON every gpumon file and ``--json`` output uses: indented, keys sorted, a final newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def ensure_dir(path: Path) -> None:
    """Make ``path`` and any missing folder above it, each with DIR_MODE (GROUP_DIR_MODE and the group
    of the folder above, where that one is setgid and group-writable) whatever the umask, through checked
    folder descriptors (``gpumon.util.state.anchored``: raises UnsafePath where a link or a folder another
    user planted is in the way)."""
    os.close(open_folder(path, create=True))


MAX_TREE_FOLDERS = 10_000
"""The most folders ``close_tree_to_others`` looks at (gpumon makes a few dozen)."""
MAX_TREE_DEPTH = 16
"""How far down ``close_tree_to_others`` goes (gpumon's folders are at most four down)."""
_WALK_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def close_tree_to_others(state_dir: Path) -> list[str]:
    """``close_to_others`` for ``state_dir`` and the folders under it (at most MAX_TREE_FOLDERS, at most
    MAX_TREE_DEPTH down), walked by directory descriptors: each folder is opened from the one above it
    without following a link, so a folder of the tree swapped for a link while root walks it (to ``/``,
    whose ``tmp`` every user may write) is never reached through it. One descriptor a level is open."""
    try:
        top = os.open(state_dir, _WALK_FLAGS)
    except OSError:
        return []
    walk = [(top, Path(state_dir), iter(_folder_names(top)))]
    try:
        said = _closed_to_others(top, Path(state_dir))
        seen = 1
        while walk:
            fd, folder, names = walk[-1]
            name = next(names, None)
            if name is None or seen >= MAX_TREE_FOLDERS:
                os.close(walk.pop()[0])
                continue
            try:
                child = os.open(name, _WALK_FLAGS, dir_fd=fd)
            except OSError:  # gone, a link (never followed), not a folder
                continue
            walk.append((child, folder / name, iter(_folder_names(child) if len(walk) < MAX_TREE_DEPTH else ())))
            seen += 1
            said.extend(_closed_to_others(child, folder / name))
        return said
    finally:
        for fd, _folder, _names in walk:
            os.close(fd)


def _folder_names(fd: int) -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(os.listdir(fd))
    return []


def close_to_others(folders: list[Path]) -> list[str]:
    """Take write access for "others" (and for the group, unless the folder is an admin group's, setgid)
    away from each of ``folders`` this process owns (a state directory made under a umask of 000 let any
    user replace its files); what was changed or could not be, as lines.
    A link is left alone (never followed); a folder is changed through its own descriptor."""
    said = []
    for folder in folders:
        try:
            fd = os.open(folder, _WALK_FLAGS)
        except OSError:
            continue
        try:
            said.extend(_closed_to_others(fd, folder))
        finally:
            os.close(fd)
    return said


def _closed_to_others(fd: int, folder: Path) -> list[str]:
    """Write access taken from every user, and from the group where it is not an admin group's (setgid)."""
    st = os.fstat(fd)
    if st.st_mode & stat.S_IWOTH:
        who, fix = "every user", "o-w"
    elif group_writable_by_chance(st.st_mode):
        who, fix = "its group", "g-w"
    else:
        return []
    if st.st_uid != os.geteuid():
        return [f"{folder} is writable by {who} and not ours to change: fix its mode (chmod {fix})"]
    mode = stat.S_IMODE(st.st_mode) & ~(stat.S_IWOTH | (0 if st.st_mode & stat.S_ISGID else stat.S_IWGRP))
    try:
        os.fchmod(fd, mode)
    except OSError as exc:
        return [f"{folder} is writable by {who} and cannot be changed: {exc.strerror or exc}"]
    return [f"{folder} was writable by {who}; now {mode:04o}"]


def write_json(path: Path, data: Any, mode: int = 0o600) -> None:
    """Replace the state file ``path`` with ``data`` as JSON (``mode``: readable by its owner only unless
    told), creating its folder (``write_state_text``)."""
    write_state_text(path, json_text(data), mode)


def write_state_text(path: Path, text: str, mode: int) -> None:
    """``write_text_atomic`` for a file under the state directory: its folder made where missing
    (``ensure_dir``) and reached through checked folder descriptors, never through a planted link."""
    folder_fd = open_folder(path.parent, create=True)
    try:
        write_atomic_in(folder_fd, path.name, text, mode)
    finally:
        os.close(folder_fd)


MAX_STATE_BYTES = 16 * 1024 * 1024
"""The largest state file gpumon reads (its own are kilobytes: a bigger one is not one it wrote)."""


class DamagedFile(Exception):
    """A state file that is not what gpumon writes: not a regular file, too large, not UTF-8, not JSON,
    nested too deeply, or of the wrong shape. The message says which, in a few words."""


def read_state_json(path: Path, max_bytes: int = MAX_STATE_BYTES) -> Any:
    """The JSON in the state file ``path``; None when there is none. Bounded: a symbolic link, a FIFO or a
    device (``/dev/zero``), more than ``max_bytes``, bytes that are not UTF-8, text that is not JSON or JSON
    nested deeper than Python can parse raise DamagedFile; a file that cannot be read raises OSError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DamagedFile("a symbolic link, not a file gpumon wrote") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DamagedFile("not a regular file")
        if st.st_size > max_bytes:
            raise DamagedFile(f"{st.st_size} bytes, more than the {max_bytes} a state file may have")
        data = read_up_to(fd, max_bytes)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise DamagedFile(f"more than the {max_bytes} bytes a state file may have")
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise DamagedFile("not UTF-8") from exc
    except RecursionError as exc:
        raise DamagedFile("nested too deeply") from exc
    except ValueError as exc:
        raise DamagedFile(f"not JSON ({exc})") from exc


def move_aside(path: Path, now_seconds: float) -> Path:
    """Rename a damaged state file to ``NAME.damaged-<unix time>`` beside it (kept for the operator)."""
    target = path.with_name(f"{path.name}.damaged-{int(now_seconds)}")
    n = 1
    while target.exists() or target.is_symlink():
        target = path.with_name(f"{path.name}.damaged-{int(now_seconds)}-{n}")
        n += 1
    os.rename(path, target)
    return target


def remove_stale_temporaries(folder: Path, names: tuple[str, ...], patterns: tuple[str, ...] = ()) -> list[Path]:
    """Remove the temporary files ``write_text_atomic`` leaves when killed mid-write (``.NAME.*``) of each of
    ``names`` in ``folder``, and those matching any of ``patterns`` (fnmatch globs: the temporaries an
    earlier gpumon's writer named otherwise, ``.spool-*.tmp``); the caller makes sure no writer is using one."""
    removed: list[Path] = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        if any(entry.startswith(f".{name}.") for name in names) or any(fnmatchcase(entry, p) for p in patterns):
            try:
                (folder / entry).unlink()
                removed.append(folder / entry)
            except OSError:
                continue
    return removed


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when it is missing, unreadable or damaged (``read_state_json``'s bounds:
    a damaged file is not fatal, and /dev/zero or a FIFO in its place is not read for ever)."""
    try:
        return read_state_json(path)
    except (OSError, DamagedFile):
        return None


def append_line(path: Path, data: Any) -> None:
    """Append one JSON line (the action log); O_APPEND keeps concurrent writers' lines whole. Through a
    checked folder descriptor; a link, a FIFO or a hard link at ``path`` raises UnsafePath."""
    line = json.dumps(data, sort_keys=True) + "\n"
    folder_fd = open_folder(path.parent, create=True)
    try:
        fd, _ = open_file(folder_fd, path.name, os.O_WRONLY | os.O_APPEND, STATE_FILE_MODE)
    finally:
        os.close(folder_fd)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
