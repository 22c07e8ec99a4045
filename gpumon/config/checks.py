"""The settings that name something outside the config file, checked as ``gpumon run`` would use them.

``listen`` (a host name or IP address and a port), ``backend`` (a ``fake:NAME`` scenario or a
``fake:PATH`` file, read with the code ``run`` uses) and ``web_config_file`` (read with
``WebConfig.load``, imported only when a web config is named). Each adds its problems, one line each.

``named_path_problems`` checks every other path the config names, as ``run`` and ``gpumon health``
will meet it: a file that exists must be a regular file of a sane size (a FIFO would hang the read, a
device such as /dev/zero would never end), a folder that exists must be a folder. A path that does not
exist is left to its reader (a missing boot id is no boot id; a missing CA bundle is a send error).
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from gpumon.config.scalars import path_problem
from gpumon.util.boundedfile import FileReadError, read_regular_file
from gpumon.util.yamlfile import brief

if TYPE_CHECKING:
    from gpumon.alerts.config import AlertingConfig
    from gpumon.health.config import HealthConfig

MAX_NAMED_FILE_BYTES = 16 * 1024 * 1024
"""The largest file a path setting may name (a CA bundle, a token, slurm.conf, the boot id: kilobytes)."""

_HOST_NAME = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def validate_listen(value: str, problems: list[str], where: str) -> None:
    """``listen``: HOST:PORT, the host a name, an IPv4 address or an IPv6 address in brackets."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit() and len(port) <= 5) or not 0 < int(port) < 65536:
        problems.append(f"{where}: listen must be HOST:PORT with a port 1-65535, got {brief(value)}")
        return
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            problems.append(f"{where}: listen: {brief(host)} is not an IPv6 address in brackets")
        return
    if ":" in host:
        problems.append(f"{where}: listen: write an IPv6 address in brackets, e.g. [::1]:{port}, got {brief(value)}")
    elif host and not (host.isascii() and _HOST_NAME.match(host) and len(host) <= 253):
        problems.append(f"{where}: listen: {brief(host)} is not a host name or IP address")


def validate_backend(value: str, problems: list[str], where: str) -> None:
    """``backend``: nvml, fake, a scenario (named or a file) or a recording (replay:FILE) that reads without problems."""
    if value in ("nvml", "fake"):
        return
    if value.startswith("fake:") and len(value) > 5:
        from gpumon.backends import scenarios

        target = value[5:]
        named = scenarios.path_of(target)
        if named is None:
            problem = path_problem(target)
            if problem is None and not Path(target).exists():
                problem = "does not exist"
            if problem is not None:
                problems.append(
                    f"{where}: backend {brief(value)}: no named scenario of that name "
                    f"({', '.join(scenarios.names())}; gpumon scenarios describes them) and the scenario file {problem}"
                )
                return
        from gpumon.backends.base import ScenarioError
        from gpumon.backends.scenario import read_scenario

        try:
            read_scenario(named or Path(target))
        except ScenarioError as exc:
            problems.extend(exc.problems)
        return
    if value.startswith("replay:") and len(value) > 7:
        from gpumon.backends.base import ScenarioError
        from gpumon.backends.recording import load

        problem = path_problem(value[7:])
        if problem is not None:
            problems.append(f"{where}: backend {brief(value)}: the recording {problem}")
            return
        try:
            load(value[7:])
        except ScenarioError as exc:
            problems.extend(exc.problems)
        return
    problems.append(f"{where}: backend must be nvml, fake, fake:NAME, fake:PATH or replay:FILE, got {brief(value)}")


def web_config_problems(path: Path) -> list[str]:
    """Every problem of the web config file, as ``gpumon run`` would meet them (it calls the same loader)."""
    from gpumon.http.webconfig import WebConfig, WebConfigError

    # WebConfig.load reads it with read_yaml (not UTF-8, too deep, alias bombs, duplicate keys,
    # numbers out of range: with positions; a FIFO or a device refused; at most its MAX_FILE_BYTES)

    try:
        WebConfig.load(path)
    except WebConfigError as exc:
        return [_one_line(p) for p in exc.problems] or [f"{path}: not a usable web config"]
    except Exception as exc:  # a defect of the web config reader must still be one line here, never a traceback
        return [f"{path}: the web config cannot be checked ({type(exc).__name__}: {brief(str(exc), 120)})"]
    return []


def _one_line(text: str) -> str:
    """A problem as one line (a YAML error's text spans several, with a caret under the column)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def named_path_problems(
    state_dir: Path | None, health: HealthConfig | None, alerting: AlertingConfig | None, where: str
) -> list[str]:
    """Every problem of the files and folders these settings name (the module's docstring says which)."""
    files: list[tuple[str, str | Path | None]] = []
    folders: list[tuple[str, str | Path | None]] = [("state_dir", state_dir)]
    if health is not None:
        files += [("health.boot_id_path", health.boot_id_path), ("health.slurm.slurm_conf", health.slurm.slurm_conf)]
        folders.append(("health.sysfs_root", health.sysfs_root))
    if alerting is not None:
        for url, http in alerting.receiver_http.items():
            for key in ("ca_file", "cert_file", "key_file", "bearer_token_file"):
                files.append((f"alerting receiver {brief(url)} {key}", getattr(http, key)))
    problems = []
    for name, path in files:
        problem = None if path is None else file_problem(Path(path))
        if problem is not None:
            problems.append(f"{where}: {name} {str(path)!r} {problem}")
    for name, path in folders:
        problem = None if path is None else folder_problem(Path(path))
        if problem is not None:
            problems.append(f"{where}: {name} {str(path)!r} {problem}")
    return problems


def file_problem(path: Path) -> str | None:
    """Why the file at ``path`` cannot be read as its setting's file (a phrase), or None: it is a regular
    file of at most MAX_NAMED_FILE_BYTES, or it does not exist. Opened without blocking, never read whole."""
    if not os.path.lexists(path):
        return None
    try:
        read_regular_file(path, MAX_NAMED_FILE_BYTES)
    except FileReadError as exc:
        return str(exc)
    return None


def folder_problem(path: Path) -> str | None:
    """Why ``path`` cannot be its setting's folder (a phrase), or None: a folder, or nothing yet."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return f"cannot be looked at: {getattr(exc, 'strerror', None) or exc}"
    return None if stat.S_ISDIR(mode) else "is not a folder"
