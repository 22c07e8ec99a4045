"""The built-in rule pack, shipped as data (``builtin_rules.yaml``), and a minimal XID action table.

The pack uses the same schema as user rules, so ``gpumon.alerts.config.parse`` validates it
and applies the user's per-rule overrides to the raw mappings before parsing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

import yaml

MINIMAL_XID_ACTIONS: Mapping[int, str] = {
    13: "restart_app",
    31: "restart_app",
    43: "ignore",
    45: "ignore",
    46: "reset_gpu",
    48: "reset_gpu",
    62: "reset_gpu",
    63: "ignore",
    64: "reset_gpu",
    74: "reset_gpu",
    79: "reboot",
    92: "restart_app",
    94: "restart_app",
    95: "reset_gpu",
    109: "reset_gpu",
    119: "reset_gpu",
    120: "reset_gpu",
    140: "reset_gpu",
    154: "reset_gpu",
}
"""Fallback when gpumon.model.xid_catalog cannot be loaded: XID code -> recommended action (DESIGN.md §4)."""


def builtin_rules_raw() -> list[dict[str, Any]]:
    """The built-in rules as raw mappings (a fresh copy each call)."""
    text = resources.files("gpumon.alerts").joinpath("builtin_rules.yaml").read_text(encoding="utf-8")
    rules = yaml.safe_load(text)
    if not isinstance(rules, list):
        raise RuntimeError("gpumon/alerts/builtin_rules.yaml must be a list of rules")
    return [dict(r) for r in rules]


def minimal_xid_action(code: int) -> str:
    """The recommended action of an XID from MINIMAL_XID_ACTIONS; ``unknown`` for others."""
    return MINIMAL_XID_ACTIONS.get(code, "unknown")


def xid_action_from_catalog(overrides: Mapping[int, Mapping[str, str]] | None = None) -> Callable[[int], str]:
    """``xid_action`` backed by gpumon.model.xid_catalog (with the config's overrides); the minimal table
    when the catalog cannot be loaded."""
    try:
        from gpumon.model.xid_catalog import XidCatalog

        catalog = XidCatalog.load(overrides)
    except Exception:
        return minimal_xid_action

    def action(code: int) -> str:
        return catalog.lookup(code).action

    return action
