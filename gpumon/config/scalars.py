"""One top-level setting's value, from the YAML file, a ``GPUMON_*`` variable or a flag, as its key's type.

``convert`` turns the value into a bool, int, float, Path or str, or adds a problem line and gives None;
the environment and flags give text, so numbers and booleans written as words are read here too.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpumon.util.yamlfile import brief

MAX_PATH_BYTES = 4095
"""Longest path Linux accepts (PATH_MAX less the final NUL); each part at most 255 bytes."""
_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def convert(name: str, value: Any, want: type, problems: list[str], where: str) -> Any:
    """``value`` (from YAML, the environment or a flag) as ``want``, or None with a problem added."""
    if want is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.strip().lower()]
        problems.append(f"{where}: {name} must be true or false, got {brief(value)}")
        return None
    if want is int:
        number = _number(value)
        if number is None or not float(number).is_integer():
            problems.append(f"{where}: {name} must be a whole number, got {brief(value)}")
            return None
        return int(number)
    if want is float:
        number = _number(value)
        if number is None:
            problems.append(f"{where}: {name} must be a number, got {brief(value)}")
            return None
        return float(number)
    if want is Path:
        problem = path_problem(value)
        if problem is not None:
            problems.append(f"{where}: {name} {problem}")
            return None
        return Path(value)
    if not isinstance(value, str):
        problems.append(f"{where}: {name} must be a string, got {brief(value)}")
        return None
    return value


def _number(value: Any) -> float | int | None:
    """An int or float from YAML, or a number written as text (environment, flags); None if not a number.

    Infinite and NaN values pass through (the range checks reject them with the range in the message);
    integers too large for a float become infinity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 2**63 else math.copysign(math.inf, value)
    if isinstance(value, float):
        return value
    if isinstance(value, str) and 0 < len(value.strip()) <= 40:
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def path_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a file or directory name (a phrase after the setting's name), or None."""
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str) or not value:
        return f"must be a path, got {brief(value)}"
    if "\0" in value:
        return f"must not contain a NUL byte, got {brief(value)}"
    encoded = value.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_PATH_BYTES or any(len(part) > 255 for part in encoded.split(b"/")):
        return f"is too long for a path ({len(encoded)} bytes; at most {MAX_PATH_BYTES}, 255 per name)"
    return None
