"""The alert tick asks for the findings of the kinds its finding rules name, and alerts as on the whole report.

The tick's finding rules read only findings of the kinds they name (``kinds``, ``*`` matching any text), so
the tick asks the health service for those (``HealthService.findings_of``), which works out only the parts of
the report that give them. A SIGHUP with other rules asks for other kinds. A finding rule of each kind fires
and resolves at the same ticks as one fed the whole report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpumon.alerts.service import AlertService
from gpumon.health.clears import Clear, add_clear
from gpumon.health.config import HealthConfig
from gpumon.health.service import HealthService
from gpumon.model.findings import WARNING, Finding
from gpumon.model.xid import XidEvent
from gpumon.model.xid_catalog import XidCatalog
from tests.alerts.helpers import UUID0, UUID1, FakeClock, alerting, gpu, snap
from tests.health.test_burn_findings import write_burn

T0 = 1_800_000_000.0


def rule(name: str, *kinds: str) -> dict[str, Any]:
    return {"name": name, "kind": "finding", "kinds": list(kinds), "severity": "warning"}


def test_the_tick_asks_for_the_kinds_its_finding_rules_name_and_after_a_reload_for_the_new_ones(
    tmp_path: Path,
) -> None:
    clock = FakeClock(T0)
    asked: list[frozenset[str]] = []

    def findings(kinds: frozenset[str]) -> Sequence[Finding]:
        asked.append(kinds)
        return [Finding("straggler", WARNING, "inspect_hardware", "slow", gpu=1, uuid=UUID1)]

    config = alerting({"builtin_rules": False, "rules": [rule("Slow", "straggler"), rule("Rising", "*_trend")]})
    service = AlertService(config, tmp_path, host="node1", clock=clock, findings=findings)
    service.tick()
    assert asked == [frozenset({"straggler", "*_trend"})]
    assert [a["alertname"] for a in service.active_alerts()] == ["Slow"]
    service.reload(alerting({"builtin_rules": False, "rules": [rule("Lost", "gpu_lost", "xid")]}))
    clock.advance(5)
    service.tick()
    assert asked[1:] == [frozenset({"gpu_lost", "xid"})]
    assert service.active_alerts() == []  # the straggler alert went with its rule
    service.reload(alerting())  # the built-in rules
    clock.advance(5)
    service.tick()
    assert "straggler" in asked[2] and "xid" in asked[2] and "gpu_lost" not in asked[2]


class Host:
    """A health service and two alert services on its findings: one fed the kinds it asks for, one the whole
    report (as before), ticked together."""

    def __init__(self, root: Path, rules: list[dict[str, Any]]) -> None:
        self.root = root
        self.clock = FakeClock(T0)
        config = HealthConfig(boot_id_path=root / "boot_id", sysfs_root=root / "no-sys")
        self.health = HealthService(root, XidCatalog.load(), config, clock=self.clock)
        alerts = alerting({"builtin_rules": False, "rules": rules})
        self.by_kind = AlertService(alerts, root / "a", "node1", self.clock, findings=self.health.findings_of)
        whole: Callable[[frozenset[str]], Sequence[Finding]] = lambda _kinds: self.health.report().findings  # noqa: E731
        self.by_report = AlertService(alerts, root / "b", "node1", self.clock, findings=whole)

    def poll(self, **fields: Any) -> None:
        self.clock.advance(5)
        lost = fields.pop("lost", False)
        first = dataclasses.replace(gpu(0, UUID0, **fields), up=not lost)
        self.health.on_snapshot(snap(self.clock(), first, gpu(1, UUID1)))

    def firing(self) -> list[tuple[str, str, str]]:
        self.by_kind.tick()
        self.by_report.tick()
        mine = sorted((a["alertname"], a["state"], a["labels"].get("gpu", "")) for a in self.by_kind.active_alerts())
        before = sorted(
            (a["alertname"], a["state"], a["labels"].get("gpu", "")) for a in self.by_report.active_alerts()
        )
        assert mine == before
        return mine


def then_poll(happen: Callable[[Host], object]) -> Callable[[Host], None]:
    def run(host: Host) -> None:
        happen(host)
        host.poll()

    return run


SCENARIOS: dict[str, tuple[Callable[[Host], None], Callable[[Host], None]]] = {
    "gpu_lost": (lambda h: h.poll(lost=True), lambda h: h.poll()),
    "overheating": (
        lambda h: h.poll(temperature_celsius=95.0, temperature_slowdown_threshold_celsius=90.0),
        lambda h: h.poll(),
    ),
    "burn_failed": (
        then_poll(lambda h: write_burn(h.root, T0, passed=False)),
        then_poll(lambda h: write_burn(h.root, T0 + 1, passed=True)),
    ),
    "xid": (
        then_poll(
            lambda h: h.health.on_xid(
                XidEvent(xid=13, timestamp_seconds=h.clock(), source="nvml", gpu_index=0, uuid=UUID0)
            )
        ),
        then_poll(lambda h: add_clear(h.root, Clear(gpu=0, reason="fixed", at_seconds=h.clock(), user="ops"))),
    ),
}


@pytest.mark.parametrize("kind", sorted(SCENARIOS))
def test_a_finding_rule_of_each_kind_fires_and_resolves_as_on_the_whole_report(tmp_path: Path, kind: str) -> None:
    host = Host(tmp_path, [rule("Named", kind), rule("Other", "straggler", "no_such_kind")])
    host.poll()
    assert host.firing() == []
    start, end = SCENARIOS[kind]
    start(host)
    assert host.firing() == [("Named", "firing", "1" if kind == "burn_failed" else "0")]
    end(host)
    assert host.firing() == []
