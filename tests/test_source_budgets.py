"""A switch and a time budget for each extra source (``exporter.sources``, issue 48): energy per owner,
the health series, the burn results and the host's figures.

What a user sees: a source turned off serves no series and has no ``gpumon_collector_success`` row; a
source that hangs costs a scrape (or a poll) its budget and no more: the scrape answers without its
series and says ``gpumon_collector_success{collector="NAME"} 0``, polls go on, the hung call is not
started again while it hangs, and the source is back once it answers. Bad settings are problem lines.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumon.backends.fake import FakeBackend
from gpumon.collect import energy, host_figures
from gpumon.collect.store import SnapshotStore
from gpumon.config.exporter import ExporterConfig, parse_exporter
from gpumon.config.exporter_sources import SourcesConfig, SourceSettings
from gpumon.config.file import Config
from gpumon.daemon import Daemon
from gpumon.daemon_reload import prepare_reload
from gpumon.exposition import burn_results
from gpumon.exposition.collector import GpumonCollector
from gpumon.model.families import Family
from gpumon.model.poll_intervals import PollIntervals
from gpumon.state.burn_record import StateFiles
from tests.helpers import value, wait_for

OFF = SourceSettings(enabled=False)
SHORT = SourceSettings(budget_seconds=0.05)


def parsed(sources: Any) -> tuple[SourcesConfig, list[str]]:
    problems: list[str] = []
    return parse_exporter({"sources": sources}, problems, "gpumon.yaml").sources, problems


# ---------------------------------------------------------------- the settings


def test_every_source_is_on_with_a_budget_by_default() -> None:
    sources, problems = parsed(None)
    assert problems == []
    for field in dataclasses.fields(SourcesConfig):
        setting = getattr(sources, field.name)
        assert setting.enabled and 0 < setting.budget_seconds <= 60


def test_a_source_is_turned_off_by_false_or_enabled_false_and_given_its_own_budget() -> None:
    sources, problems = parsed({"burn": False, "health": {"enabled": False}, "owner_energy": {"budget_seconds": 2.5}})
    assert problems == []
    assert not sources.burn.enabled and not sources.health.enabled
    assert sources.owner_energy == SourceSettings(enabled=True, budget_seconds=2.5)
    assert sources.host_figures == SourceSettings()


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"gpu": False}, "exporter.sources.gpu"),
        ({"burn": {"budget": 1}}, "exporter.sources.burn.budget"),
        ({"burn": {"budget_seconds": 0}}, "exporter.sources.burn.budget_seconds"),
        ({"health": {"budget_seconds": -1}}, "exporter.sources.health.budget_seconds"),
        ({"health": {"budget_seconds": 61}}, "exporter.sources.health.budget_seconds"),
        ({"health": {"budget_seconds": float("nan")}}, "exporter.sources.health.budget_seconds"),
        ({"host_figures": {"budget_seconds": "soon"}}, "exporter.sources.host_figures.budget_seconds"),
        ({"owner_energy": "perhaps"}, "exporter.sources.owner_energy"),
        ([1, 2], "exporter.sources"),
    ],
)
def test_a_bad_setting_is_a_problem_line_that_names_its_key(raw: Any, named: str) -> None:
    _sources, problems = parsed(raw)
    assert len(problems) == 1 and named in problems[0], problems


@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=14), inner, max_size=4),
        max_leaves=12,
    )
)
def test_any_yaml_value_gives_settings_or_problem_lines_never_an_exception(raw: Any) -> None:
    sources, _problems = parsed(raw)
    for field in dataclasses.fields(SourcesConfig):
        assert 0 < getattr(sources, field.name).budget_seconds <= 60


def test_a_reload_that_changes_the_sources_takes_effect_after_a_restart(tmp_path: Path) -> None:
    old = Config(listen="127.0.0.1:0", backend="fake", state_dir=tmp_path, kernel_log=False)
    new = dataclasses.replace(old, exporter=ExporterConfig(sources=SourcesConfig(burn=OFF)))
    plan = prepare_reload(old, new)
    assert "exporter.sources" in plan.restart_only
    assert plan.config.exporter.sources == old.exporter.sources


# ---------------------------------------------------------------- a source that hangs, in a scrape


class Hanging:
    """A source whose families wait until ``release`` is set; counts how often it was asked."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked = 0

    def families(self) -> Iterable[Family]:
        self.asked += 1
        self.release.wait(60)
        return [Family("site_late_value", "gauge", "A late value.", (), [((), 1.0)])]


def scrape_in_time(render: Callable[[], bytes]) -> str:
    """A scrape, failed (not hung) when it does not answer in 30 s: the old code waited for ever."""
    out: list[str] = []
    thread = threading.Thread(target=lambda: out.append(render().decode()), daemon=True)
    thread.start()
    thread.join(30)
    assert out, "the scrape waited for the source"
    return out[0]


def test_a_hanging_source_costs_a_scrape_its_budget_and_is_not_asked_again_while_it_hangs() -> None:
    store = SnapshotStore()
    collector = GpumonCollector(store, PollIntervals())
    hanging = Hanging()
    collector.add("site", hanging, budget_seconds=0.05)
    try:
        for render in (collector.render, lambda: b"".join(collector.body()), collector.render, collector.render):
            text = scrape_in_time(render)
            assert value(text, "gpumon_collector_success", collector="site") == 0.0
            assert value(text, "gpumon_collector_success", collector="gpumon") == 1.0
            assert "site_late_value" not in text
        assert hanging.asked == 1  # the hung call was never started twice
    finally:
        hanging.release.set()
    wait_for(lambda: value(collector.render().decode(), "gpumon_collector_success", collector="site") == 1.0)
    assert value(collector.render().decode(), "site_late_value") == 1.0


# ---------------------------------------------------------------- the daemon's sources


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # the hung calls end with the test


def daemon_with(tmp_path: Path, sources: SourcesConfig) -> Daemon:
    config = Config(
        listen="127.0.0.1:0",
        backend="fake",
        state_dir=tmp_path,
        kernel_log=False,
        interval_seconds=0.1,
        slow_interval_seconds=0.1,
        exporter=ExporterConfig(sources=sources),
    )
    return Daemon(config, FakeBackend.from_mapping({"gpus": [{"values": {"processes": [{"pid": 10}]}}]}))


def polls(daemon: Daemon) -> float:
    latest = daemon.store.latest()
    return 0.0 if latest is None else latest.monotonic_seconds


def test_a_hanging_energy_listener_holds_no_poll_and_fails_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    monkeypatch.setattr(energy.OwnerEnergy, "on_snapshot", lambda self, snapshot: release.wait(60))
    daemon = daemon_with(tmp_path, SourcesConfig(owner_energy=SHORT))
    daemon.start()
    try:
        wait_for(lambda: polls(daemon) > 0, 30, 0.05, "a first poll")
        first = polls(daemon)
        wait_for(lambda: polls(daemon) > first, 30, 0.05, "a later poll while the listener hangs")
        text = scrape_in_time(daemon.collector.render)
        assert value(text, "gpumon_collector_success", collector="owner_energy") == 0.0
        assert value(text, "gpumon_collector_success", collector="alerts") == 1.0
    finally:
        release.set()
        daemon.stop()


def test_hanging_host_figures_hold_no_poll_and_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    monkeypatch.setattr(host_figures.HostFigureReader, "__call__", lambda self: release.wait(60) and {})
    daemon = daemon_with(tmp_path, SourcesConfig(host_figures=SHORT))
    daemon.start()
    try:
        wait_for(lambda: polls(daemon) > 0, 30, 0.05, "a first poll")
        first = polls(daemon)
        wait_for(lambda: polls(daemon) > first, 30, 0.05, "a later poll while the host figures hang")
        text = scrape_in_time(daemon.collector.render)
        assert value(text, "gpumon_collector_success", collector="host_figures") == 0.0
        assert value(text, "gpumon_host_memory_used_bytes") is None
    finally:
        release.set()
        daemon.stop()


def test_a_hanging_burn_record_fails_its_source_and_the_scrape_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    monkeypatch.setattr(burn_results.BurnResultsCollector, "families", lambda self: release.wait(60) and [])
    daemon = daemon_with(tmp_path, SourcesConfig(burn=SHORT))
    daemon.start()
    try:
        wait_for(lambda: polls(daemon) > 0, 30, 0.05, "a first poll")
        text = scrape_in_time(lambda: b"".join(daemon.collector.body()))
        assert value(text, "gpumon_collector_success", collector="burn") == 0.0
        assert value(text, "gpumon_gpu_up", gpu="0") == 1.0
    finally:
        release.set()
        daemon.stop()


def after_two_polls(daemon: Daemon) -> str:
    """What a scrape of ``daemon`` serves once it polled twice (every source had a snapshot)."""
    daemon.start()
    try:
        wait_for(lambda: polls(daemon) > 0, 30, 0.05, "a first poll")
        first = polls(daemon)
        wait_for(lambda: polls(daemon) > first, 30, 0.05, "a second poll")
        return daemon.collector.render().decode()
    finally:
        daemon.stop()


SWITCHED = {
    "burn": "gpumon_burn_",
    "owner_energy": "gpumon_owner_",
    "health": "gpumon_health_status",  # (gpumon_health_unjudged_total is the unjudged source's)
    "host_figures": "gpumon_host_",
}


def test_a_source_turned_off_serves_no_series_and_has_no_row(tmp_path: Path) -> None:
    StateFiles(str(tmp_path), warn=print).write_last({"node": 0, "finished_at": 1.0, "exit_code": 0, "gpus": []})
    on = daemon_with(tmp_path / "on", SourcesConfig())
    off = daemon_with(tmp_path / "off", SourcesConfig(owner_energy=OFF, health=OFF, burn=OFF, host_figures=OFF))
    texts = {name: after_two_polls(daemon) for name, daemon in (("on", on), ("off", off))}
    for source, prefix in SWITCHED.items():
        assert value(texts["on"], "gpumon_collector_success", collector=source) == 1.0, source
        assert value(texts["off"], "gpumon_collector_success", collector=source) is None, source
        assert f"\n{prefix}" not in texts["off"], source
    assert "\ngpumon_health_" in texts["on"] and "\ngpumon_host_" in texts["on"] and "\ngpumon_owner_" in texts["on"]
