"""The Prometheus rules in prometheus/: valid for promtool, every alert unit-tested, and written
over metric names gpumon actually serves."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = sorted((REPO / "prometheus").glob("*.rules.yml"))
RULE_TESTS = sorted((REPO / "prometheus" / "tests").glob("*.yml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package: prometheus)")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=REPO)


def rules_of(path: Path) -> list[dict[str, str]]:
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def test_both_rule_files_exist() -> None:
    assert [p.name for p in RULES] == ["gpumon-alerts.rules.yml", "gpumon-recording.rules.yml"]


@needs_promtool
def test_promtool_check_rules_is_clean() -> None:
    result = promtool("check", "rules", *map(str, RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS
    result = promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_expects_it_to_fire() -> None:
    alerts = {rule["alert"] for rule in rules_of(REPO / "prometheus" / "gpumon-alerts.rules.yml")}
    firing: set[str] = set()
    for test_file in RULE_TESTS:
        for test in yaml.safe_load(test_file.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                if case.get("exp_alerts"):
                    firing.add(case["alertname"])
    assert alerts - firing == set(), f"alerts without a firing test: {sorted(alerts - firing)}"


def test_every_recording_rule_is_unit_tested() -> None:
    records = {rule["record"] for rule in rules_of(REPO / "prometheus" / "gpumon-recording.rules.yml")}
    tested: set[str] = set()
    for test_file in RULE_TESTS:
        for test in yaml.safe_load(test_file.read_text())["tests"]:
            for case in test.get("promql_expr_test", []):
                for sample in case.get("exp_samples", []):
                    tested.add(sample["labels"].split("{", 1)[0])
    assert records - tested == set(), f"recording rules without a test: {sorted(records - tested)}"


def gpumon_metric_names() -> set[str]:
    """Every gpumon_* name gpumon's code can expose (counters declared without _total get it added)."""
    names: set[str] = set()
    for source in (REPO / "gpumon").rglob("*.py"):
        names.update(re.findall(r"\bgpumon_[a-z0-9_]+\b", source.read_text()))
    return names | {n + "_total" for n in names}


# Series the rules use that gpumon's burn results provide once `gpumon burn` has run;
# listed so a rename elsewhere is still caught for every other name.
BURN_METRICS = {"gpumon_burn_passed"}


@pytest.mark.parametrize("rules", RULES, ids=lambda p: p.name)
def test_rules_only_use_metric_names_gpumon_serves(rules: Path) -> None:
    used: set[str] = set()
    for rule in rules_of(rules):
        used.update(re.findall(r"\bgpumon_[a-z0-9_]+\b(?!:)", rule["expr"]))
    unknown = used - gpumon_metric_names() - BURN_METRICS
    assert unknown == set(), f"{rules.name} uses names gpumon does not serve: {sorted(unknown)}"
