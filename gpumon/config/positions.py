"""Line and column for a problem in a config file: ``check-config`` says where each one is.

The config's checks speak of settings by their path (``interval_seconds must be ...``,
``exporter.compat: unknown mode ...``, ``alerting.rules[0](HotGpu): unknown key 'expr'``);
``with_positions`` finds that path in the file's YAML nodes and puts ``line L, column C:`` in
front of the message (the value's position; an unknown key's own position). A problem whose path
the file does not hold (a default, a relation of two settings) is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_PATH = r"[A-Za-z_][\w-]*(?:\.[A-Za-z_][\w-]*|\[\d+\])*"
_UNKNOWN_KEY = re.compile(rf"^(?:({_PATH})(?:\([^)]*\))?: )?unknown key '?([^'\s(]+)'?")
_SETTING = re.compile(rf"^({_PATH})")
_ITEM_SETTING = re.compile(rf"^({_PATH})(?:\([^)]*\))?: ([A-Za-z_][\w-]*)\b")
"""``alerting.rules[1](GpuCold): threshold must be ...``: a setting inside a list item or section."""


def node_positions(text: str) -> dict[str, tuple[Node, Node]]:
    """Dotted path (``alerting.rules[0].for``) -> (key node, value node) of every mapping entry; a list
    item's path ends in ``[i]`` (its node twice)."""
    found: dict[str, tuple[Node, Node]] = {}

    seen: set[int] = set()

    def walk(node: Node, path: str) -> None:
        if id(node) in seen:  # an alias: its node was walked where it is anchored
            return
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for key, value in node.value:
                if isinstance(key, ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    child = f"{path}.{key.value}" if path else str(key.value)
                    found[child] = (key, value)
                    walk(value, child)
        elif isinstance(node, SequenceNode):
            for i, item in enumerate(node.value):
                found[f"{path}[{i}]"] = (item, item)
                walk(item, f"{path}[{i}]")

    root = yaml.compose(text, Loader=_Loader)
    if root is not None:
        walk(root, "")
    return found


def _position(found: dict[str, tuple[Node, Node]], path: str, key: bool) -> str | None:
    while path:
        if path in found:
            mark = found[path][0 if key else 1].start_mark
            return f"line {mark.line + 1}, column {mark.column + 1}: "
        shorter = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path)
        path = shorter if shorter != path else ""  # the parent setting, until there is none
        key = False
    return None


def with_positions(problems: list[str], where: str, text: str) -> list[str]:
    """``problems`` with ``line L, column C:`` after ``where: `` for those about a setting of the file
    ``where`` whose text is ``text`` (unchanged when the text cannot be composed)."""
    try:
        found = node_positions(text)
    except (yaml.YAMLError, RecursionError, ValueError):
        return problems
    prefix = f"{where}: "
    out = []
    for problem in problems:
        rest = problem[len(prefix) :] if problem.startswith(prefix) else None
        if rest is None or rest.startswith("line "):
            out.append(problem)
            continue
        unknown = _UNKNOWN_KEY.match(rest)
        setting = _SETTING.match(rest)
        at = None
        if unknown is not None:
            parent = unknown.group(1) or ""
            at = _position(found, f"{parent}.{unknown.group(2)}" if parent else unknown.group(2), key=True)
        elif (inner := _ITEM_SETTING.match(rest)) is not None and f"{inner.group(1)}.{inner.group(2)}" in found:
            at = _position(found, f"{inner.group(1)}.{inner.group(2)}", key=False)  # the bad value, not the item
        elif setting is not None:
            at = _position(found, setting.group(1), key=False)
        out.append(prefix + at + rest if at else problem)
    return out
