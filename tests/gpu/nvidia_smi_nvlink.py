"""A parser for ``nvidia-smi nvlink -e`` (tests only: gpumon itself never runs nvidia-smi).

The output, per GPU (driver 580, H200)::

    GPU 0: NVIDIA H200 (UUID: GPU-...)
    \t Link 0: Replay Errors: 0
    \t Link 0: Recovery Errors: 0
    \t Link 0: CRC Errors: 0

with a blank line between links. The three labels become gpumon's ``type`` values
``replay``, ``recovery`` and ``crc``; any other ``Link N: Label: value`` line is kept under
the label in snake case, and a value that is not a number (``N/A``) is left out.
"""

from __future__ import annotations

import re

SMI_TYPES = {"Replay Errors": "replay", "Recovery Errors": "recovery", "CRC Errors": "crc"}

_GPU_RE = re.compile(r"^GPU (?P<gpu>\d+):")
_LINK_RE = re.compile(r"^\s*Link (?P<link>\d+): (?P<label>[^:]+?)\s*:\s*(?P<value>\S.*?)\s*$")

NvlinkErrors = dict[int, dict[str, dict[str, int]]]
"""GPU index -> link ("0".."17") -> type -> count."""


def _type_of(label: str) -> str:
    return SMI_TYPES.get(label) or re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


def parse_nvlink_errors(text: str) -> NvlinkErrors:
    """``nvidia-smi nvlink -e`` output -> {gpu: {link: {type: count}}}; lines it does not know are skipped."""
    out: NvlinkErrors = {}
    gpu: int | None = None
    for line in text.splitlines():
        if m := _GPU_RE.match(line):
            gpu = int(m["gpu"])
            out.setdefault(gpu, {})
            continue
        m = _LINK_RE.match(line)
        if m is None or gpu is None:
            continue
        value = m["value"].replace(",", "")
        if not (value.isascii() and value.isdigit()):
            continue
        out[gpu].setdefault(m["link"], {})[_type_of(m["label"])] = int(value)
    return out


def render_nvlink_errors(errors: NvlinkErrors, names: dict[int, str] | None = None) -> str:
    """The inverse of the parser, in nvidia-smi's layout (used by the property test)."""
    label_of = {v: k for k, v in SMI_TYPES.items()}
    lines = []
    for gpu, links in errors.items():
        name = (names or {}).get(gpu, "NVIDIA H200")
        lines.append(f"GPU {gpu}: {name} (UUID: GPU-{gpu:08d}-1111-2222-3333-444444444444)")
        for link, counters in links.items():
            for kind, count in counters.items():
                lines.append(f"\t Link {link}: {label_of.get(kind, kind)}: {count}")
            lines.append("")
    return "\n".join(lines) + "\n"
