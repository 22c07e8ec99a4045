"""Fake-backend scenario files (docs/scenarios.md): read and checked, every problem listed at once.

``read_scenario(path)`` returns the scenario mapping or raises ``ScenarioError`` whose ``problems``
list every reason, one line each: the file (not UTF-8, not YAML, too deep: see gpumon.util.yamlfile),
unknown keys and field names, and every value of the wrong type or out of range. The fake backend
plays only scenarios that ``scenario_problems`` found nothing wrong in, so playing one never fails.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpumon.backends.base import ScenarioError
from gpumon.model.snapshot import GpuSnapshot, P2pStatus, ProcessSnapshot
from gpumon.model.xid_catalog import MAX_XID, MIN_XID, xid_code
from gpumon.util.yamlfile import YamlFileError, brief, read_yaml

SCENARIO_KEYS = ("gpus", "count", "base", "nvml_missing_inits", "driver_version", "cuda_driver_version")
GPU_KEYS = (
    "values",
    "unsupported",
    "lost_at_tick",
    "lost_reason",
    "hang_at_tick",
    "hang_seconds",
    "raise_at_ticks",
    "uuid",
    "xid_events",
)
MAX_GPUS = 4096
MAX_TICK = 1_000_000_000
MAX_HANG_SECONDS = 86400.0
MAX_MISSING_INITS = 1000
_NOT_VALUES = ("index", "uuid", "up", "lost_reason")
"""GpuSnapshot fields a scenario cannot set through ``values`` (uuid and lost_reason have their own keys)."""
_LIST_FIELDS = ("processes", "p2p_status")
"""Fields whose value is itself a list (not a list of values by tick)."""


def read_scenario(path: str | Path) -> dict[Any, Any]:
    """The checked scenario mapping in ``path``; raises ScenarioError listing every problem."""
    try:
        raw = read_yaml(path)
    except YamlFileError as exc:
        raise ScenarioError(exc.problems) from None
    problems = scenario_problems(raw, str(path))
    if problems:
        raise ScenarioError(problems)
    assert isinstance(raw, dict)
    return raw


def scenario_problems(raw: Any, source: str = "scenario") -> list[str]:
    """Every problem of a scenario mapping, one line each; empty when the fake backend can play it."""
    if not isinstance(raw, dict):
        return [f"{source}: the top level must be a mapping with gpus or count, got {brief(raw)}"]
    problems: list[str] = []
    for key in raw:
        if key not in SCENARIO_KEYS:
            problems.append(f"{source}: unknown key {brief(key)} (known: {', '.join(SCENARIO_KEYS)})")
    if raw.get("base") is not None:
        _values_problems(raw["base"], f"{source}: base", problems)
    gpus = raw.get("gpus")
    count = raw.get("count")
    if count is not None and _whole(count, 0, MAX_GPUS) is None:
        problems.append(f"{source}: count must be a whole number from 0 to {MAX_GPUS}, got {brief(count)}")
        count = None
    if gpus is None and count is None and "count" not in raw:
        problems.append(f"{source}: needs gpus (a list) or count")
    if gpus is not None:
        if not isinstance(gpus, list):
            problems.append(f"{source}: gpus must be a list of GPUs, got {brief(gpus)}")
        elif len(gpus) > MAX_GPUS:
            problems.append(f"{source}: gpus lists {len(gpus)} GPUs; at most {MAX_GPUS}")
        else:
            if count is not None and count != len(gpus):
                problems.append(f"{source}: count {count} does not match the {len(gpus)} GPUs under gpus")
            for i, gpu in enumerate(gpus):
                _gpu_problems(gpu, f"{source}: gpus[{i}]", problems)
    missing = raw.get("nvml_missing_inits")
    if missing is not None and _whole(missing, 0, MAX_MISSING_INITS) is None:
        problems.append(
            f"{source}: nvml_missing_inits must be a whole number from 0 to {MAX_MISSING_INITS}, got {brief(missing)}"
        )
    for key in ("driver_version", "cuda_driver_version"):
        value = raw.get(key)
        if value is not None and not _version(value):
            problems.append(f'{source}: {key} must be a version string like "580.159.04", got {brief(value)}')
    return problems


def _gpu_problems(gpu: Any, where: str, problems: list[str]) -> None:
    if gpu is None:
        return
    if not isinstance(gpu, dict):
        problems.append(f"{where} must be a mapping (or {{}} for a healthy GPU), got {brief(gpu)}")
        return
    for key in gpu:
        if key not in GPU_KEYS:
            problems.append(f"{where}: unknown key {brief(key)} (known: {', '.join(GPU_KEYS)})")
    if gpu.get("values") is not None:
        _values_problems(gpu["values"], f"{where}.values", problems)
    unsupported = gpu.get("unsupported")
    if unsupported is not None:
        if not isinstance(unsupported, list):
            problems.append(f"{where}: unsupported must be a list of field names, got {brief(unsupported)}")
        else:
            for name in unsupported:
                if not isinstance(name, str) or name not in _fields():
                    problems.append(f"{where}.unsupported: unknown field {brief(name)}")
    for key in ("lost_at_tick", "hang_at_tick"):
        if gpu.get(key) is not None and _whole(gpu[key], 0, MAX_TICK) is None:
            problems.append(
                f"{where}: {key} must be a tick, a whole number from 0 to {MAX_TICK}, got {brief(gpu[key])}"
            )
    ticks = gpu.get("raise_at_ticks")
    if ticks is not None and (not isinstance(ticks, list) or any(_whole(t, 0, MAX_TICK) is None for t in ticks)):
        problems.append(
            f"{where}: raise_at_ticks must be a list of ticks (whole numbers from 0 to {MAX_TICK}) like [3], "
            f"got {brief(ticks)}"
        )
    hang = gpu.get("hang_seconds")
    if hang is not None and not (_finite(hang) and 0 <= hang <= MAX_HANG_SECONDS):
        problems.append(f"{where}: hang_seconds must be a number from 0 to {MAX_HANG_SECONDS:g}, got {brief(hang)}")
    for key in ("uuid", "lost_reason"):
        value = gpu.get(key)
        if value is not None and not (isinstance(value, str) and value.strip()):
            problems.append(f"{where}: {key} must be a non-empty string, got {brief(value)}")
    _xid_events_problems(gpu.get("xid_events"), f"{where}.xid_events", problems)


def _xid_events_problems(raw: Any, where: str, problems: list[str]) -> None:
    """``[{tick: 3, xid: 79}, {tick: 5, xid: [13, 13]}]``."""
    if raw is None:
        return
    if not isinstance(raw, list):
        problems.append(f"{where} must be a list of {{tick, xid}}, got {brief(raw)}")
        return
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != {"tick", "xid"}:
            problems.append(f"{where}[{i}] must be a mapping with exactly tick and xid, got {brief(item)}")
            continue
        if _whole(item["tick"], 0, MAX_TICK) is None:
            problems.append(
                f"{where}[{i}]: tick must be a whole number from 0 to {MAX_TICK}, got {brief(item['tick'])}"
            )
        codes = item["xid"] if isinstance(item["xid"], list) else [item["xid"]]
        if not codes or any(isinstance(c, bool) or not isinstance(c, int) or xid_code(c) is None for c in codes):
            problems.append(
                f"{where}[{i}]: xid must be an XID code or a list of them (whole numbers from {MIN_XID} to {MAX_XID}), "
                f"got {brief(item['xid'])}"
            )


def _values_problems(raw: Any, where: str, problems: list[str]) -> None:
    """``values``/``base``: field name -> a value, or a list of values by tick (the last repeats)."""
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a mapping of field name to value, got {brief(raw)}")
        return
    for name, spec in raw.items():
        if not isinstance(name, str) or name not in _fields() or name in _NOT_VALUES:
            problems.append(f"{where}: unknown field {brief(name)}")
            continue
        kind = _fields()[name]
        if name in _LIST_FIELDS or not isinstance(spec, list):
            problem = _value_problem(kind, spec)
            if problem is not None:
                problems.append(f"{where}.{name}{problem}")
            continue
        if not spec:
            problems.append(f"{where}.{name}: a list of values by tick needs at least one value")
        for tick, value in enumerate(spec):
            problem = _value_problem(kind, value)
            if problem is not None:
                problems.append(f"{where}.{name}[{tick}]{problem}")
                break  # one line per field is enough


def _value_problem(kind: str, value: Any) -> str | None:
    """Why ``value`` cannot be a GpuSnapshot field of type ``kind`` (its annotation), or None.

    The reason starts with ``": "``, or with the key or index path into the value (``.sm: ...``,
    ``[0].pid: ...``). None (null) is always allowed: the field was not read."""
    if value is None:
        return None
    kind = kind.removesuffix(" | None")
    if kind.startswith("Mapping[str, "):
        inner = kind[len("Mapping[str, ") : -1]
        if not isinstance(value, dict):
            return f": must be a mapping of key to {_describe(inner)}, got {brief(value)}"
        for key, item in value.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)):
                return f": key {brief(key)} must be a string or a whole number"
            problem = _value_problem(inner, item)
            if problem is not None:
                return f".{key}{problem}"
        return None
    if kind == "tuple[ProcessSnapshot, ...]":
        return _records_problem(value, ProcessSnapshot, required=("pid",))
    if kind == "tuple[P2pStatus, ...]":
        return _records_problem(value, P2pStatus, required=("peer_index", "capability", "ok"))
    if _scalar_ok(kind, value):
        return None
    return f": must be {_describe(kind)}, got {brief(value)}"


def _scalar_ok(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return _whole(value, 0, 2**63 - 1) is not None
    if kind == "float":
        return _finite(value)
    if kind == "str":
        return isinstance(value, str)
    return False


def _describe(kind: str) -> str:
    return {
        "bool": "true or false",
        "int": "a whole number from 0",
        "float": "a finite number",
        "str": "a string",
    }.get(kind, "a mapping" if kind.startswith("Mapping") else kind)


def _records_problem(value: Any, cls: type, required: tuple[str, ...]) -> str | None:
    """A list of mappings whose keys are ``cls``'s fields, each value of its field's type."""
    kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    if not isinstance(value, list):
        return f": must be a list of mappings with {', '.join(kinds)}, got {brief(value)}"
    for i, record in enumerate(value):
        if not isinstance(record, dict):
            return f"[{i}]: must be a mapping with {', '.join(kinds)}, got {brief(record)}"
        for key in record:
            if key not in kinds:
                return f"[{i}]: unknown key {brief(key)} (known: {', '.join(kinds)})"
        for key in required:
            if record.get(key) is None:
                return f"[{i}]: {key} is required"
        for key, item in record.items():
            problem = _value_problem(kinds[key], item)
            if problem is not None:
                return f"[{i}].{key}{problem}"
    return None


def _whole(value: Any, low: int, high: int) -> int | None:
    """``value`` as a whole number from ``low`` to ``high`` (3 or 3.0), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and low <= value <= high:
        return value
    return None


def _finite(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return abs(value) < 2**63 if isinstance(value, int) else math.isfinite(value)


def _version(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return _finite(value)


@functools.cache
def _fields() -> Mapping[str, str]:
    """GpuSnapshot field name -> its annotation (``"float | None"``, ``"Mapping[str, int] | None"``...)."""
    return {f.name: str(f.type) for f in dataclasses.fields(GpuSnapshot)}
