"""Every named scenario, played through the daemon, shows what docs/scenarios.md says it shows.

The doc's tables are the specification: for each scenario, row by row, every series written
there (``name{label="value"} value``) must appear on /metrics with that value, and every alert
named there must be active in /api/alerts in the state written there ("none": no alert).
"""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumon.backends import scenarios
from tests.helpers import REPO, DaemonProcess, wait_for

DOC = REPO / "docs" / "scenarios.md"
pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Row:
    when: str
    series: tuple[Series, ...]
    alerts: tuple[tuple[str, str], ...]
    """(alertname, state); empty means no alert at all."""


_SERIES_RE = re.compile(r"`(gpumon_[a-z_]+)(\{[^}]*\})? ([-+.eE0-9]+)`")
_ALERT_RE = re.compile(r"`(Gpu[A-Za-z]+)` (pending|firing)")


def documented() -> dict[str, list[Row]]:
    """Scenario name -> its table rows, from the "Named scenarios" section of the doc."""
    text = DOC.read_text().split("## Named scenarios", 1)[1]
    out: dict[str, list[Row]] = {}
    for block in re.split(r"^### ", text, flags=re.M)[1:]:
        name = block.split("`")[1]
        rows = []
        for line in block.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) != 3 or cells[0] in ("after", "---"):
                continue
            series = tuple(
                Series(m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), float(m.group(3)))
                for m in _SERIES_RE.finditer(cells[1])
            )
            alerts = tuple(_ALERT_RE.findall(cells[2]))
            assert alerts or cells[2] == "none", f"{name}: alerts cell {cells[2]!r}"
            rows.append(Row(cells[0], series, alerts))
        out[name] = rows
    return out


def test_every_named_scenario_is_documented_and_every_documented_one_exists() -> None:
    assert sorted(documented()) == scenarios.names()
    assert all(documented()[n] and all(r.series for r in documented()[n]) for n in scenarios.names())


def missing(metrics_text: str, alerts: list[dict[str, object]], row: Row) -> list[str]:
    """What of ``row`` is not (yet) true; empty when all of it holds."""
    samples = [s for f in text_string_to_metric_families(metrics_text) for s in f.samples]
    out = []
    for want in row.series:
        found = [
            s.value
            for s in samples
            if s.name == want.name and all(s.labels.get(k) == v for k, v in want.labels.items())
        ]
        if not any(math.isclose(v, want.value, rel_tol=1e-9) for v in found):
            out.append(f"{want.name}{want.labels} {want.value} (got {found})")
    active = {(str(a["alertname"]), str(a["state"])) for a in alerts}
    if not row.alerts and active:
        out.append(f"no alerts (got {sorted(active)})")
    out += [f"alert {name} {state} (got {sorted(active)})" for name, state in row.alerts if (name, state) not in active]
    return out


def play(name: str, tmp_path: Path) -> str | None:
    """Start the daemon on scenario ``name`` and wait for each documented row in turn; what failed, or None."""
    daemon = DaemonProcess(["--backend", f"fake:{name}"], tmp_path)  # the default interval: the doc's times hold
    try:
        daemon.wait_ready()
        for row in documented()[name]:
            last: list[str] = []

            def holds(row: Row = row) -> bool:
                nonlocal last
                last = missing(daemon.metrics(), daemon.get("/api/alerts").json()["alerts"], row)
                return not last

            try:
                wait_for(holds, timeout=20, interval=0.1, what=f"{name} after {row.when}")
            except AssertionError:
                return f"{name}, row 'after {row.when}': still missing {last}\n{daemon.log()[-2000:]}"
        return None
    except AssertionError as exc:
        return f"{name}: {exc}"
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def played(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    """Every named scenario played through its own daemon, two at a time (each plays for up to ~10 s
    of its own timeline, mostly waiting; two keep the checks' polling quick on a loaded 2-core box),
    longest first: what failed in each, or None."""
    longest_first = sorted(
        documented(), key=lambda n: -max(float(r.when.split()[0]) for r in documented()[n] if r.when[0].isdigit())
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(play, name, tmp_path_factory.mktemp(name)) for name in longest_first}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", sorted(documented()))
def test_named_scenario_shows_what_the_doc_says(name: str, played: dict[str, str | None]) -> None:
    if played[name] is not None:
        pytest.fail(played[name])
