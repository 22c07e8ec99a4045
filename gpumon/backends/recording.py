"""A recording of what NVML answered on a real host: the file ``gpumon record`` writes and ``replay:`` plays.

The file is JSON text, one call per line, versioned (``format``, ``version``)::

    {"format": "gpumon-nvml-recording", "version": 1,
     "made_at": "2026-11-29T03:41:07Z", "gpumon": "0.9.0", "driver_version": "580.159.04",
     "nvml_version": "13.580.159.04", "cuda_driver_version": 13000, "models": ["NVIDIA H200"],
     "gpus": 1, "polls": 10, "label": "idle", "redacted": true,
     "attributes": {"NVML_FI_DEV_MEMORY_TEMP": 82, "nvmlDeviceGetPowerUsage": "function", ...},
     "calls": {
      "nvmlDeviceGetPowerUsage(gpu0)": [[3, 75512], [1, 76020]],
      "nvmlDeviceGetFanSpeed_v2(gpu0, 0)": [[4, {"error": 3}]],
      ...}}

``attributes``: every name the backend looked up on the binding and what it was (a constant's value,
``"function"``, ``"object"`` for a class, ``null`` for a name this binding lacks). ``calls``: per call
(the function and its arguments, a GPU handle written ``gpuN``; arguments that change from call to call,
such as a timestamp or a timeout, left out) the answers in the order NVML gave them, as runs of
``[how many times, answer]``. An answer is the value in plain JSON, or an object with one of the keys
of ``encode``: ``struct`` (a ctypes structure's fields), ``bytes``, ``gpu`` (a handle), ``opaque`` (an
event set or GPM sample), ``float`` (nan, inf), ``error`` (an NVML return code raised as NVMLError),
``raise`` (another exception, e.g. the ctypes argument error of DESIGN.md), ``return`` with ``out``
(a call that fills in a structure passed to it).
"""

from __future__ import annotations

import ctypes
import json
import math
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpumon.backends.base import ScenarioError

FORMAT = "gpumon-nvml-recording"
VERSION = 1
BUNDLE_MEMBER = "recording.json"
"""The recording's name inside a ``gpumon bundle`` archive (which ``replay:`` also plays)."""
MAX_BYTES = 64 * 1024 * 1024
HEADER_KEYS = (
    "made_at",
    "gpumon",
    "binding",
    "driver_version",
    "nvml_version",
    "cuda_driver_version",
    "models",
    "gpus",
    "polls",
    "interval_seconds",
    "label",
    "redacted",
    "python",
    "edited",
)

VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""c_nvmlValue_t's member by NVML_VALUE_TYPE_* (as gpumon.backends.nvml.reader reads it)."""

Runs = list[list[Any]]
"""[[count, answer], ...]: the answers of one call in order, each repeated ``count`` times."""


class RecordingError(ScenarioError):
    """A file that is not a recording gpumon can play; ``problems`` lists every reason."""


@dataclass
class Recording:
    """A recording in memory: the header facts, the binding's attributes and every call's answers."""

    header: dict[str, Any] = field(default_factory=dict)
    attributes: dict[str, Any] = field(default_factory=dict)
    calls: dict[str, Runs] = field(default_factory=dict)

    def add(self, key: str, answer: Any) -> None:
        """Append ``answer`` (encoded) to the call ``key``'s answers."""
        runs = self.calls.setdefault(key, [])
        if runs and runs[-1][1] == answer:
            runs[-1][0] += 1
        else:
            runs.append([1, answer])

    def dumps(self) -> str:
        """The file's text: the header, then one attribute and one call per line, sorted (diffable)."""
        head = {"format": FORMAT, "version": VERSION, **self.header}
        lines = ["{"]
        lines += [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}," for k, v in head.items()]
        for name, table in (("attributes", self.attributes), ("calls", self.calls)):
            lines.append(f' "{name}": {{')
            rows = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(table.items())]
            lines.append(",\n".join(rows))
            lines.append(" }," if name == "attributes" else " }")
        lines.append("}")
        return "\n".join(lines) + "\n"


def load(path: str | Path) -> Recording:
    """Read a recording file, or the recording inside a ``gpumon bundle`` archive (.tar.gz).

    Raises RecordingError naming every problem (not JSON, another format, a newer version, bad tables).
    """
    path = Path(path)
    try:
        if tarfile.is_tarfile(path):
            text = _from_bundle(path)
        else:
            with path.open("rb") as fh:
                raw = fh.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:
                raise RecordingError([f"recording {path}: larger than {MAX_BYTES // 1024 // 1024} MiB"])
            text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, tarfile.TarError) as exc:
        raise RecordingError([f"recording {path}: cannot read: {exc}"]) from None
    return loads(text, str(path))


def _from_bundle(path: Path) -> str:
    with tarfile.open(path, "r:*") as tar:
        member = next((m for m in tar.getmembers() if Path(m.name).name == BUNDLE_MEMBER and m.isfile()), None)
        if member is None or member.size > MAX_BYTES:
            raise RecordingError([f"recording {path}: the archive holds no {BUNDLE_MEMBER}"])
        fh = tar.extractfile(member)
        assert fh is not None  # a regular file
        return fh.read().decode("utf-8")


def loads(text: str, where: str = "recording") -> Recording:
    """Parse a recording's text (see ``load``)."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise RecordingError([f"recording {where}: not JSON: {exc}"]) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise RecordingError([f'recording {where}: not a gpumon NVML recording (no "format": "{FORMAT}")'])
    problems = []
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
        problems.append(f"recording {where}: version {version!r}: this gpumon plays version 1 to {VERSION}")
    attributes, calls = raw.get("attributes"), raw.get("calls")
    if not isinstance(attributes, dict):
        problems.append(f"recording {where}: attributes: expected an object of binding names")
    if not isinstance(calls, dict) or not calls:
        problems.append(f"recording {where}: calls: expected an object of calls and their answers")
    else:
        problems += [
            f"recording {where}: calls: {key}: {p}" for key, runs in calls.items() if (p := _runs_problem(runs))
        ]
    if problems:
        raise RecordingError(problems)
    assert isinstance(attributes, dict) and isinstance(calls, dict)  # checked above
    header = {k: raw[k] for k in HEADER_KEYS if k in raw}
    return Recording(header=header, attributes=dict(attributes), calls=dict(calls))


def _runs_problem(runs: Any) -> str | None:
    if not isinstance(runs, list) or not runs:
        return "expected a list of [count, answer]"
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and type(run[0]) is int and run[0] > 0):
            return f"{json.dumps(run)[:60]} is not [count, answer]"
    return None


# ---- values ----------------------------------------------------------------------------------------
def encode(value: Any, handle_index: Any) -> Any:
    """A binding's answer as JSON. ``handle_index(value)`` gives the GPU index of an NVML device handle
    (None for anything else): handles are written ``{"gpu": N}``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, bytes):
        return {"bytes": value.decode("latin-1")}
    index = handle_index(value)
    if index is not None:
        return {"gpu": index}
    if isinstance(value, list | tuple | ctypes.Array):
        return [encode(v, handle_index) for v in value]
    if isinstance(value, ctypes.Structure | ctypes.Union):
        return {"struct": _fields(value, handle_index)}
    if isinstance(value, SimpleNamespace) or _plain_object(value):
        # nvidia-ml-py hands some answers (running processes) over as an nvmlFriendlyObject: its attributes
        return {"struct": {k: encode(v, handle_index) for k, v in vars(value).items() if not k.startswith("_")}}
    return {"opaque": type(value).__name__}  # a pointer, an event set: a token the caller passes back


def _plain_object(value: Any) -> bool:
    """An object that is only its attributes (nvidia-ml-py's nvmlFriendlyObject), not a class or function."""
    return hasattr(value, "__dict__") and not callable(value) and not isinstance(value, type)


def _fields(value: Any, handle_index: Any) -> dict[str, Any]:
    """A structure's fields, encoded. A field value (c_nvmlFieldValue_t) keeps only the member of its
    ``value`` union that its ``valueType`` names, and not its ``timestamp`` and ``latencyUsec`` (gpumon
    reads neither; they would make every answer differ, and the file large)."""
    names = [f[0] for f in value._fields_]
    field_value = "valueType" in names and "value" in names and "fieldId" in names
    out: dict[str, Any] = {}
    for name in names:
        if field_value and name in ("timestamp", "latencyUsec"):
            continue
        member = getattr(value, name)
        if isinstance(member, ctypes._Pointer) and not member:
            member = None
        elif field_value and name == "value" and isinstance(member, ctypes.Union):
            kept = VALUE_MEMBERS.get(int(value.valueType), "ullVal")
            out[name] = {"struct": {kept: encode(getattr(member, kept), handle_index)}}
            continue
        out[name] = encode(member, handle_index)
    return out


def decode(value: Any, handle: Any) -> Any:
    """An encoded answer as the binding's would look to the readers (structures as attribute objects);
    ``handle(index)`` makes the replay's handle of GPU ``index``."""
    if isinstance(value, list):
        return [decode(v, handle) for v in value]
    if not isinstance(value, dict):
        return value
    if "struct" in value:
        return SimpleNamespace(**{k: decode(v, handle) for k, v in value["struct"].items()})
    if "gpu" in value:
        return handle(int(value["gpu"]))
    if "bytes" in value:
        return str(value["bytes"]).encode("latin-1")
    if "float" in value:
        return float(value["float"])
    if "opaque" in value:
        return SimpleNamespace(opaque=value["opaque"])
    return value


# ---- calls -----------------------------------------------------------------------------------------
UNKEYED_ARGUMENTS = {
    "nvmlDeviceGetProcessUtilization": 1,  # (handle, lastSeenTimeStamp): the timestamp moves on
    "nvmlEventSetWait_v2": 0,  # (set, timeout ms)
    "nvmlEventSetFree": 0,
    "nvmlGpmSampleFree": 0,
    "nvmlGpmSampleGet": 1,  # (handle, sample)
    "nvmlDeviceRegisterEvents": 2,  # (handle, types, set)
}
"""Functions whose later arguments change between calls of the same question: only the first N are the key."""


def call_key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any], gpu_of: Any) -> str:
    """The name of one question to NVML in a recording: ``nvmlDeviceGetClockInfo(gpu0, 1)``.

    ``gpu_of(arg)`` gives the GPU index of a handle or GPM sample (None for other values). A value
    that is neither a number, a string, a list nor a handle (an event set, a structure passed by
    reference) is written ``*``.
    """
    if name == "nvmlGpmMetricsGet":
        request = args[0]
        ids = [int(request.metrics[i].metricId) for i in range(int(request.numMetrics))]
        return f"{name}(gpu{gpu_of(request.sample1)}, {ids})"
    keep = UNKEYED_ARGUMENTS.get(name, len(args))
    parts = [_key_part(a, gpu_of) for a in args[:keep]]
    parts += [f"{k}={_key_part(v, gpu_of)}" for k, v in sorted(kwargs.items())]
    return f"{name}({', '.join(parts)})"


def _key_part(value: Any, gpu_of: Any) -> str:
    if isinstance(value, bool | int | float | str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_key_part(v, gpu_of) for v in value) + "]"
    index = gpu_of(value)
    return "*" if index is None else f"gpu{index}"
