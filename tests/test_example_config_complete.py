"""deploy/gpumon.example.yaml says it lists every option: every key the configuration accepts, in
every section, is in it (set, or commented out with its default), where the file would take it
(issue 46, item 3). The accepted keys come from the config code itself (its key sets and the
dataclasses it fills), so an option added there fails here until the example shows it."""

from __future__ import annotations

import dataclasses
import re
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from gpumon.alerts import config as alerts_config
from gpumon.alerts import rule_config
from gpumon.config import exporter as exporter_config
from gpumon.config import file as config_file
from gpumon.health import config as health_config
from gpumon.health.trends import DEFAULT_RULES, TrendRule
from gpumon.model.xid_catalog import Escalation

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "deploy" / "gpumon.example.yaml"
_COMMENTED_KEY = re.compile(r"^(\s*)# ?([A-Za-z_][\w-]*):(?:\s|$)")
_KEY = re.compile(r"^(\s*)([A-Za-z_][\w-]*):(?:\s|$)")


def accepted_sections() -> dict[str, set[str]]:
    """Section path -> the keys the config code accepts there ("" is the top level)."""
    return {
        "": set(config_file._SCALARS) | set(config_file._SECTIONS),
        "exporter": set(exporter_config.EXPORTER_KEYS),
        "alerting": set(alerts_config._TOP_KEYS),
        "alerting.retry": {f.name.removesuffix("_seconds") for f in dataclasses.fields(alerts_config.RetryConfig)},
        "health": set(health_config._HEALTH_KEYS),
        "health.slurm": set(health_config._SLURM_KEYS),
        "health.stragglers": set(health_config._STRAGGLER_KEYS),
        "health.trends": {"enabled", *DEFAULT_RULES},
    }


def accepted_entry_keys() -> dict[str, set[str]]:
    """Keys of the entries of a list or a mapping (a receiver, a rule, an XID escalation, a trend rule):
    the example shows them once, in a comment, as an example entry."""
    return {
        "alerting receivers": set(alerts_config._RECEIVER_KEYS),
        "alerting.rules": set(rule_config._RULE_KEYS),
        "health.xid_escalation": {f.name for f in dataclasses.fields(Escalation)},
        "health.trends.<counter>": {f.name for f in dataclasses.fields(TrendRule)},
    }


KEY_SETS_USED = {
    (config_file, "_SCALARS"), (config_file, "_SECTIONS"), (exporter_config, "EXPORTER_KEYS"),
    (alerts_config, "_TOP_KEYS"), (alerts_config, "_RECEIVER_KEYS"), (rule_config, "_RULE_KEYS"),
    (health_config, "_HEALTH_KEYS"), (health_config, "_SLURM_KEYS"), (health_config, "_STRAGGLER_KEYS"),
}  # fmt: skip
"""The key sets accepted_sections and accepted_entry_keys read; a new one in these modules must be added."""
_NOT_KEYS_OF_A_SECTION = {(rule_config, "KIND_KEYS"), (rule_config, "_COMMON_KEYS"), (rule_config, "_OVERRIDE_KEYS")}
"""Key sets that are subsets of one listed above (a rule's keys by kind, those of an override)."""


def example_keys(text: str) -> set[str]:
    """Every key path the example sets or shows commented out ("health.slurm.node_name"); the keys
    of a flow mapping on the line (``retry: {initial_backoff: 500ms}``) too."""
    paths: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = _KEY.match(line) or _COMMENTED_KEY.match(line)
        if match is None:
            continue
        indent, key = len(match.group(1)), match.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        paths.add(path)
        stack.append((indent, key))
        value = line[match.end() :].split(" #", 1)[0].strip()
        if value.startswith("{"):
            try:
                flow = yaml.safe_load(value)
            except yaml.YAMLError:
                flow = None
            if isinstance(flow, dict):
                paths.update(f"{path}.{k}" for k in flow)
    return paths


def missing_from(text: str) -> list[str]:
    paths = example_keys(text)
    missing = [
        f"{section}.{key}" if section else key
        for section, keys in accepted_sections().items()
        for key in sorted(keys)
        if (f"{section}.{key}" if section else key) not in paths
    ]
    for entry, keys in accepted_entry_keys().items():
        missing += [f"{entry}: {key}" for key in sorted(keys) if not re.search(rf"[\s{{,-]{key}:", text)]
    return missing


def test_the_example_config_shows_every_key_the_config_accepts() -> None:
    missing = missing_from(EXAMPLE.read_text())
    assert not missing, f"options the config accepts and deploy/gpumon.example.yaml lacks: {missing}"


def test_the_check_above_fails_when_an_option_is_taken_out_of_the_example() -> None:
    text = EXAMPLE.read_text()
    for line in ("    node_name:", "  retry: {", "    enabled: false", "kernel_log:"):
        cut = "\n".join(ln for ln in text.splitlines() if not ln.lstrip("# ").startswith(line.strip()))
        assert missing_from(cut), f"taking out {line.strip()!r} goes unnoticed"


def _key_sets(module: types.ModuleType) -> Iterable[tuple[types.ModuleType, str]]:
    for name, value in vars(module).items():
        if name.endswith(("_KEYS", "_SCALARS", "_SECTIONS")) and isinstance(value, (set, frozenset, tuple, dict)):
            yield module, name


def test_every_key_set_of_the_config_code_is_read_by_this_test() -> None:
    modules: list[Any] = [config_file, exporter_config, alerts_config, rule_config, health_config]
    known = {id(getattr(module, name)) for module, name in KEY_SETS_USED | _NOT_KEYS_OF_A_SECTION}
    found = {pair for module in modules for pair in _key_sets(module)}
    unread = sorted(name for module, name in found if id(getattr(module, name)) not in known)
    assert not unread, f"key sets this test does not know where they belong: {unread}; add them to accepted_sections"
