"""The settings that name something outside the config file, checked as ``gpumon run`` would use them.

``listen`` (a host name or IP address and a port), ``backend`` (a ``fake:NAME`` scenario or a
``fake:PATH`` file, read with the code ``run`` uses) and ``web_config_file`` (read with
``WebConfig.load``, imported only when a web config is named). Each adds its problems, one line each.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from gpumon.config.scalars import path_problem
from gpumon.util.yamlfile import brief

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
