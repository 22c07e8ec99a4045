"""Work the daemon skips to stay cheap (issue 15), and the signals it must keep while skipping it.

These tests check what is served while work is reused or passed over: the text equals a fresh
render, alerts fire and resolve, health findings follow the snapshots and files. How much work is
saved is measured, not asserted: benchmarks/bench_reuse.py times a poll whose values did not change
against one where every GPU changed (and the same for scrapes and health reports)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpumon.alerts.engine import AlertEngine
from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.text import render
from gpumon.health.service import HealthService
from gpumon.model.families import Family
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.xid_catalog import XidCatalog
from tests.alerts.helpers import alerting, gpu, snap
from tests.helpers import wait_for
from tests.test_exporter import samples

T0 = 1_800_000_000.0


def _family(collector: GpumonCollector, name: str) -> Family:
    [family] = [f for f in collector.own_families() if f.name == name]
    return family


def test_a_gpus_fast_samples_whose_values_did_not_change_and_changed_ones_are_served_as_a_fresh_render() -> None:
    clock = [1000.0]
    store = SnapshotStore()
    backend = FakeBackend.from_mapping(
        {"gpus": [{"values": {"temperature_celsius": [40.0, 40.0, 41.0]}}, {"values": {"temperature_celsius": 50.0}}]}
    )
    poller = Poller(backend, store, monotonic=lambda: clock[0], wall_clock=lambda: clock[0], host_figures=dict)
    collector = GpumonCollector(store, PollIntervals(), monotonic=lambda: clock[0])
    seen = []
    for _ in range(3):
        poller.poll()
        text = collector.render().decode()
        seen.append([v for labels, v in samples(text, "gpumon_temperature_celsius") if labels["sensor"] == "gpu"])
        fresh = GpumonCollector(store, PollIntervals(), monotonic=lambda: clock[0])
        assert text == fresh.render().decode(), "the text kept from earlier polls = a fresh render"
        clock[0] += 1
    assert seen == [[40.0, 50.0], [40.0, 50.0], [41.0, 50.0]]
    collector.set_options(PollIntervals(fast_seconds=2.0), processes=False)
    poller.poll()  # same value (41, the script's last), new HELP text
    text = collector.render().decode()
    assert "Refreshed every 2s." in text.split("# HELP gpumon_temperature_celsius ", 1)[1].split("\n", 1)[0]


def test_health_drift_findings_follow_the_snapshots_whatever_is_reused_between_them(tmp_path: Path) -> None:
    service = HealthService(tmp_path, XidCatalog.load(), clock=lambda: T0)
    first = snap(T0, gpu(pcie_link_width=8, pcie_link_width_max=16))
    service.on_snapshot(first)
    reports = [service.report() for _ in range(3)]
    assert all(any(f.kind == "pcie_degraded" for f in r.findings) for r in reports)
    second = snap(T0 + 1, gpu(pcie_link_width=16, pcie_link_width_max=16))
    service.on_snapshot(second)
    assert not any(f.kind == "pcie_degraded" for f in service.report().findings)
    hotter = snap(T0 + 2, gpu(pcie_link_width=16, pcie_link_width_max=16, temperature_celsius=80.0))
    service.on_snapshot(hotter)
    assert not any(f.kind == "pcie_degraded" for f in service.report().findings)
    narrow_again = snap(T0 + 3, gpu(pcie_link_width=4, pcie_link_width_max=16, temperature_celsius=80.0))
    service.on_snapshot(narrow_again)
    assert any(f.kind == "pcie_degraded" for f in service.report().findings), "a new change shows at once"


def _engine(rule: dict[str, Any]) -> AlertEngine:
    config = alerting({"builtin_rules": False, "rules": [rule]})
    return AlertEngine(config.all_rules(), host="node1", started_at=T0)


HEALTHY = {
    "ecc_errors_total": {"uncorrected_volatile": 0, "uncorrected_aggregate": 3},
    "pcie_link_generation": 5,
    "pcie_link_generation_max": 5,
    "pcie_link_width": 16,
    "pcie_link_width_max": 16,
    "utilization_ratio": 0.9,
    "processes": (),
    "nvlink_up": {"0": True, "1": True},
}


@pytest.mark.parametrize(
    ("rule", "broken"),
    [
        ({"name": "Ecc", "kind": "ecc_uncorrectable"}, {"ecc_errors_total": {"uncorrected_volatile": 1}}),
        ({"name": "Pcie", "kind": "pcie_degraded", "min_utilization": 0.5}, {"pcie_link_width": 8}),
        ({"name": "Link", "kind": "nvlink_down"}, {"nvlink_up": {"0": True, "1": False}}),
    ],
)
def test_healthy_gpus_raise_nothing_and_rules_still_fire_and_resolve(
    rule: dict[str, Any], broken: dict[str, Any]
) -> None:
    e = _engine(rule)
    healthy = snap(T0, gpu(**HEALTHY))
    assert e.evaluate(healthy, T0) == []
    assert e.evaluate(snap(T0 + 1, gpu(**HEALTHY)), T0 + 1) == [] and e.alerts() == []
    [change] = e.evaluate(snap(T0 + 2, gpu(**{**HEALTHY, **broken})), T0 + 2)
    assert (change.previous, change.alert.state) == ("inactive", "firing")
    [change] = e.evaluate(snap(T0 + 3, gpu(**HEALTHY)), T0 + 3)
    assert (change.previous, change.alert.state) == ("firing", "resolved")


def test_idle_with_memory_fires_and_resolves_and_a_busy_gpu_raises_nothing() -> None:
    from gpumon.model.snapshot import ProcessSnapshot

    e = _engine({"name": "Idle", "kind": "idle_with_memory", "threshold": 0.3})
    held = (ProcessSnapshot(pid=7, used_memory_bytes=1 << 30),)
    busy = gpu(utilization_ratio=0.9, processes=held)
    assert e.evaluate(snap(T0 - 1, busy), T0 - 1) == [] and e.alerts() == []
    [change] = e.evaluate(snap(T0, gpu(utilization_ratio=0.0, processes=held)), T0)
    assert (change.previous, change.alert.state) == ("inactive", "firing")
    [change] = e.evaluate(snap(T0 + 1, busy), T0 + 1)
    assert (change.previous, change.alert.state) == ("firing", "resolved")


def test_polls_reuse_one_idle_thread_that_blocks_between_polls() -> None:
    import threading

    from gpumon.collect.scheduling import PollJob

    idents: list[int] = []
    job = PollJob(lambda: idents.append(threading.get_ident()), 0.05)
    job.start()
    try:
        wait_for(lambda: len(idents) >= 6, timeout=10, interval=0.01, what="six polls")
        assert len(set(idents[1:])) == 1, "one worker thread runs every poll"
        assert sum(t.name == "gpumon-poll" for t in threading.enumerate()) <= 1, "no thread left behind per poll"
    finally:
        job.shutdown()
    wait_for(
        lambda: not any(t.name == "gpumon-poll" for t in threading.enumerate()),
        timeout=5,
        interval=0.01,
        what="the idle worker to end at shutdown",
    )


def test_slow_reads_spread_over_the_gpus_serve_every_scrape_as_a_fresh_render() -> None:
    clock = [1000.0]
    store = SnapshotStore()
    energy = [float(i) for i in range(1, 40)]
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"energy_joules_total": energy}} for _ in range(4)]})
    intervals = PollIntervals(fast_seconds=1.0, slow_seconds=4.0)  # slow reads spread: one GPU a poll
    poller = Poller(
        backend, store, intervals, monotonic=lambda: clock[0], wall_clock=lambda: clock[0], host_figures=dict
    )
    collector = GpumonCollector(store, intervals, monotonic=lambda: clock[0])
    store.subscribe(collector.prepare)
    for poll in range(12):
        poller.poll()
        text = collector.render().decode()
        ours = samples(text, "gpumon_energy_joules_total")
        fresh = GpumonCollector(store, intervals, monotonic=lambda: clock[0])
        assert text == fresh.render().decode(), f"poll {poll}: the text kept = a fresh render"
        clock[0] += 1
    assert sorted(v for _, v in ours) != [1.0] * 4, "the slow reads went on"


def test_receivers_are_told_of_the_firing_alerts_not_held_back() -> None:
    """``notifiable()`` (what is delivered, every poll) is ``alerts()`` less the pending and held-back alerts,
    in the same order."""
    from gpumon.state.burn_marker import BurnHoldBack

    e = _engine(
        {"name": "Hot", "kind": "threshold", "field": "temperature_celsius", "op": ">", "threshold": 80, "for": "5s"}
    )
    hot = [gpu(0, temperature_celsius=90.0), gpu(1, temperature_celsius=95.0)]
    e.evaluate(snap(T0, *hot), T0)
    assert [a.state for a in e.alerts()] == ["pending", "pending"]
    assert e.notifiable() == []
    e.evaluate(snap(T0 + 6, *hot), T0 + 6)
    assert [a.gpu for a in e.notifiable()] == ["0", "1"] and e.notifiable() == e.alerts()
    burn = BurnHoldBack(pid=9, gpu_indices=frozenset({1}), uuids=frozenset(), started_at=T0)
    e.evaluate(snap(T0 + 7, *hot), T0 + 7, burn)
    assert [(a.gpu, a.held_back is None) for a in e.alerts()] == [("0", True), ("1", False)]
    assert [a.gpu for a in e.notifiable()] == ["0"]


def test_a_threshold_rule_judges_every_gpu_while_an_alert_of_it_is_active() -> None:
    """Below the threshold nothing is raised; once one GPU's alert fires, the other GPUs are still
    judged, and the alert resolves."""
    e = _engine({"name": "Hot", "kind": "threshold", "field": "temperature_celsius", "op": ">", "threshold": 80})
    cool = [gpu(0, temperature_celsius=50.0), gpu(1, temperature_celsius=60.0)]
    assert e.evaluate(snap(T0 - 1, *cool), T0 - 1) == [] and e.alerts() == []
    [change] = e.evaluate(snap(T0, gpu(0, temperature_celsius=90.0), cool[1]), T0)
    assert (change.alert.gpu, change.alert.state) == ("0", "firing")
    changes = e.evaluate(snap(T0 + 1, cool[0], gpu(1, temperature_celsius=85.0)), T0 + 1)
    assert sorted((c.alert.gpu, c.previous, c.alert.state) for c in changes) == [
        ("0", "firing", "resolved"),
        ("1", "inactive", "firing"),
    ]
    assert [a.gpu for a in e.alerts()] == ["1"]
    assert e.evaluate(snap(T0 + 2, *cool), T0 + 2)[0].alert.state == "resolved"
    assert e.alerts() == []


def test_health_signal_families_show_the_engines_new_results_at_once() -> None:
    """The straggler and trend engines keep their results while nothing changed; the exported
    deviation family keeps its text with them, and new results show at once."""
    from gpumon.health.health_series import HealthCollector
    from gpumon.health.stragglers import Deviation
    from gpumon.health.trends import Increase
    from gpumon.model.findings import verdict

    slow = Deviation(index=1, uuid="GPU-b", signal="sm_clock", ratio=-0.12)
    rise = Increase(0, "GPU-a", "ecc_corrected", "", 3.0, 3600.0)

    class Service:
        report = verdict([], [(0, "GPU-a"), (1, "GPU-b")], T0, "daemon")
        results: tuple[list[Deviation], list[Increase]] = ([slow], [rise])

        def current_report(self) -> Any:
            return self.report

        def signals(self) -> tuple[list[Deviation], list[Increase]]:
            return list(self.results[0]), list(self.results[1])  # copies, as the engines hand them out

    service = Service()
    collector = HealthCollector(service)  # type: ignore[arg-type]

    def deviation_family() -> Family:
        [family] = [f for f in collector.families() if f.name == "gpumon_straggler_deviation_ratio"]
        return family

    first = deviation_family()
    assert first.samples == [(("1", "GPU-b", "sm_clock"), -0.12)]
    assert render([deviation_family()]) == render([first]), "same results, same text"
    service.results = ([Deviation(index=1, uuid="GPU-b", signal="sm_clock", ratio=-0.2)], [rise])
    assert deviation_family().samples == [(("1", "GPU-b", "sm_clock"), -0.2)]


@pytest.mark.parametrize(
    ("field", "threshold", "cool", "hot"),
    [
        ("temperature_celsius", 90.0, {"temperature_celsius": 60.0}, {"temperature_celsius": 95.0}),
        ("row_remap_pending", 0.5, {"row_remap_pending": False}, {"row_remap_pending": True}),
        ("memory_used_ratio", 0.5, {"memory_used_bytes": 10}, {"memory_used_bytes": 99}),
        ("clocks_hertz.sm", 1.5e9, {"clocks_hertz": {"sm": 1e9}}, {"clocks_hertz": {"sm": 2e9}}),
        (
            "nvlink_errors_total.3.replay",
            0.5,
            {"nvlink_errors_total": {"3": {"replay": 0}}},
            {"nvlink_errors_total": {"3": {"replay": 7}}},
        ),
    ],
)
def test_a_threshold_rule_with_nothing_to_keep_fires_on_the_gpu_that_crosses_for_every_kind_of_field(
    field: str, threshold: float, cool: dict[str, Any], hot: dict[str, Any]
) -> None:
    """Plain fields, booleans (1/0), derived fields and one- and two-key mappings are read alike
    on the fast path that passes over the GPUs below the threshold; a value that is not a finite
    number is unknown."""
    e = _engine({"name": "Crossed", "kind": "threshold", "field": field, "op": ">", "threshold": threshold})
    sizes = {"memory_total_bytes": 100}
    changes = e.evaluate(snap(T0, gpu(0, **sizes, **cool), gpu(1, **sizes, **cool)), T0)
    assert changes == [] and e.alerts() == []
    e.evaluate(snap(T0 + 1, gpu(0, **sizes, **cool), gpu(1, **sizes, **hot)), T0 + 1)
    assert [(a.state, a.labels["gpu"]) for a in e.alerts()] == [("firing", "1")]
    e2 = _engine({"name": "Crossed", "kind": "threshold", "field": field, "op": ">", "threshold": threshold})
    unknown = {k: float("nan") for k, v in hot.items() if isinstance(v, float)}
    if unknown:
        e2.evaluate(snap(T0, gpu(0, **sizes, **cool), gpu(1, **sizes, **unknown)), T0)
        assert e2.alerts() == []


def test_the_health_report_of_every_poll_follows_the_clears_and_the_last_burn_as_their_files_change(
    tmp_path: Path,
) -> None:
    from gpumon.health.clears import Clear, add_clear
    from tests.health.test_burn_findings import write_burn

    service = HealthService(tmp_path, XidCatalog.load(), clock=lambda: T0)

    def failed_burn_gpus(at: float) -> list[int | None]:
        service.on_snapshot(snap(at, gpu(0), gpu(1)))
        return [f.gpu for f in service.report().findings if f.kind == "burn_failed"]

    assert [failed_burn_gpus(T0 + i) for i in range(3)] == [[], [], []]
    write_burn(tmp_path, T0 - 10, passed=False)
    assert failed_burn_gpus(T0 + 3) == [1]
    add_clear(tmp_path, Clear(gpu=1, reason="reseated", at_seconds=T0))
    assert [failed_burn_gpus(T0 + 4), failed_burn_gpus(T0 + 5)] == [[], []]


def test_a_scrape_during_the_polling_threads_slow_rows_serves_the_new_slow_values() -> None:
    """The polling thread makes a slow read's rows while a scrape asks for the same snapshot: the
    scrape waits for them and shows the values just read, never the rows of the read before."""
    import threading

    clock = [1000.0]
    store = SnapshotStore()
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"energy_joules_total": [1.0, 2.0, 3.0]}}]})
    intervals = PollIntervals(fast_seconds=1.0, slow_seconds=1.0)
    poller = Poller(
        backend, store, intervals, monotonic=lambda: clock[0], wall_clock=lambda: clock[0], host_figures=dict
    )
    collector = GpumonCollector(store, intervals, monotonic=lambda: clock[0])
    families = collector._gpu
    poller.poll()
    families.prepare_slower(store.latest())  # type: ignore[arg-type]
    clock[0] += 1
    snapshot = poller.poll()  # energy 2.0, its rows not made yet
    inside, go_on = threading.Event(), threading.Event()
    [row] = [row for row in families._rows if row.name == "gpumon_energy_joules_total"]
    original = row.samples
    object.__setattr__(row, "samples", lambda gpu: (inside.set(), go_on.wait(5), original(gpu))[2])
    polling = threading.Thread(target=families.prepare_slower, args=(snapshot,))
    polling.start()
    assert inside.wait(5)
    served: list[float] = []
    scrape = threading.Thread(
        target=lambda: served.extend(
            v for f in families.of(snapshot) if f.name == "gpumon_energy_joules_total" for _, v in f.samples
        )
    )
    scrape.start()
    scrape.join(0.2)
    go_on.set()
    polling.join(5)
    scrape.join(5)
    assert served == [2.0]
