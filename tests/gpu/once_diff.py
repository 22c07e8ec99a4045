"""Print where two ``gpumon once --json`` files differ, one line per value: ``path: first -> second``.

Used by tests/gpu/record_host.sh to compare a real poll with the replay of its recording.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def differences(first: Any, second: Any, path: str = "") -> list[str]:
    """Every path where ``first`` and ``second`` differ (lists by position, dicts by key)."""
    if isinstance(first, dict) and isinstance(second, dict):
        out: list[str] = []
        for key in sorted(set(first) | set(second)):
            out += differences(first.get(key), second.get(key), f"{path}.{key}")
        return out
    if isinstance(first, list) and isinstance(second, list) and len(first) == len(second):
        return [
            d for i, (a, b) in enumerate(zip(first, second, strict=True)) for d in differences(a, b, f"{path}[{i}]")
        ]
    return [] if first == second else [f"{path}: {first!r} -> {second!r}"]


if __name__ == "__main__":
    with open(sys.argv[1]) as a, open(sys.argv[2]) as b:
        print("\n".join(differences(json.load(a), json.load(b))) or "identical")
