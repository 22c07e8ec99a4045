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
_PATH = r"[A-Za-z_][\w-]*(?:\.[\w-]+|\[\d+\])*"
_UNKNOWN_KEY = re.compile(rf"^(?:({_PATH})(?:\([^)]*\))?: )?(?:unknown key|no built-in rule named) '?([^'\s(]+)'?")
_SETTING = re.compile(rf"^({_PATH})")
_ITEM_SETTING = re.compile(rf"^({_PATH})(?:\(([^)]*)\))?: ([A-Za-z_][\w-]*)\b")
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


def _inner_setting(rest: str, found: dict[str, tuple[Node, Node]]) -> str | None:
    """The path of the setting a problem inside a list item or a named entry is about, where the file
    has it: ``alerting.rules[1](GpuCold): threshold ...`` -> ``alerting.rules[1].threshold``,
    ``alerting.builtin(GpuMemoryHigh): threshold ...`` -> ``alerting.builtin.GpuMemoryHigh.threshold``."""
    inner = _ITEM_SETTING.match(rest)
    if inner is None:
        return None
    path, name, key = inner.groups()
    for candidate in (f"{path}.{key}", f"{path}.{name}.{key}" if name else None):
        if candidate is not None and candidate in found:
            return candidate
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
        elif (inner := _inner_setting(rest, found)) is not None:
            at = _position(found, inner, key=False)  # the bad value, not the rule or section it is in
        elif setting is not None:
            at = _position(found, setting.group(1), key=False)
        out.append(prefix + at + rest if at else problem)
    return out
