"""The poller on the fake backend: tiers, and every fault of DESIGN.md §4 that a poll meets."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import Snapshot, Tier


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(scenario: dict[str, Any], intervals: PollIntervals | None = None) -> tuple[Poller, FakeBackend, Clock]:
    intervals = intervals or PollIntervals()
    backend = FakeBackend.from_mapping(scenario)
    clock = Clock()
    poller = Poller(backend, SnapshotStore(), intervals, monotonic=clock, wall_clock=clock, host_figures=dict)
    return poller, backend, clock


def poll(poller: Poller, clock: Clock, seconds: float = 1.0) -> Snapshot:
    snapshot = poller.poll()
    clock.now += seconds
    return snapshot


def test_values_follow_the_scenario_tick_by_tick() -> None:
    poller, _, clock = make({"gpus": [{"values": {"temperature_celsius": [40, 50, 60]}}]})
    temps = [poll(poller, clock).gpus[0].temperature_celsius for _ in range(4)]
    assert temps == [40, 50, 60, 60]


def test_slow_tier_is_read_only_every_slow_interval() -> None:
    poller, _, clock = make(
        {"gpus": [{"values": {"energy_joules_total": [1.0, 2.0, 3.0, 4.0]}}]},
        PollIntervals(fast_seconds=1, slow_seconds=3, static_seconds=100),
    )
    energies = []
    for _ in range(7):
        snapshot = poll(poller, clock)
        energies.append(snapshot.gpus[0].energy_joules_total)
    # The slow tier is read at t=0, 3, 6; each read plays the tick reached so far; between reads the cached value stays.
    assert energies == [1.0, 1.0, 1.0, 4.0, 4.0, 4.0, 4.0]
    assert set(snapshot.tiers) == {"fast", "slow", "static"}


def test_nvml_missing_at_start_then_appearing(caplog: pytest.LogCaptureFixture) -> None:
    poller, _, clock = make({"nvml_missing_inits": 2, "gpus": [{}]})
    caplog.set_level(logging.INFO)
    first = poll(poller, clock)
    assert first.nvml_up is False and first.gpus == ()
    assert "NVML Shared Library Not Found" in (first.nvml_error or "")
    states = [first.nvml_up] + [poll(poller, clock).nvml_up for _ in range(5)]
    assert states[-1] is True
    # retried with backoff: not every poll
    assert states.count(False) >= 2
    errors = [r for r in caplog.records if "NVML unavailable" in r.getMessage()]
    assert len(errors) == 1, "one clear log line, not one per retry"
    assert any("NVML is back" in r.getMessage() for r in caplog.records)


def test_one_gpu_lost_the_others_keep_reporting() -> None:
    poller, _, clock = make(
        {
            "gpus": [
                {"lost_at_tick": 2, "values": {"temperature_celsius": 50}},
                {"values": {"temperature_celsius": [40, 41, 42, 43]}},
            ]
        }
    )
    snaps = [poll(poller, clock) for _ in range(4)]
    assert [s.gpus[0].up for s in snaps] == [True, True, False, False]
    assert snaps[2].gpus[0].lost_reason == "GPU is lost"
    assert snaps[2].gpus[0].temperature_celsius is None
    assert snaps[2].gpus[0].name == "NVIDIA H200", "identity is kept for a lost GPU"
    assert [s.gpus[1].temperature_celsius for s in snaps] == [40, 41, 42, 43]


def test_lost_gpu_is_reprobed_with_backoff_and_recovers() -> None:
    scenario = {"gpus": [{"lost_at_tick": 1}]}
    poller, backend, clock = make(scenario)
    poll(poller, clock)
    assert poll(poller, clock).gpus[0].up is False
    # the GPU comes back (a reset): the backend answers again
    object.__setattr__(backend.scripts[0], "lost_at_tick", None)
    ups = [poll(poller, clock).gpus[0].up for _ in range(8)]
    assert ups[0] is False, "not re-probed on every poll"
    assert ups[-1] is True


def test_unsupported_field_is_absent() -> None:
    poller, _, clock = make(
        {
            "gpus": [
                {
                    "unsupported": ["fan_speed_ratios", "memory_temperature_celsius"],
                    "values": {"fan_speed_ratios": {"0": 0.3}},
                }
            ]
        }
    )
    gpu = poll(poller, clock).gpus[0]
    assert gpu.fan_speed_ratios is None and gpu.memory_temperature_celsius is None
    assert gpu.temperature_celsius is not None


def test_exception_in_a_poll_is_logged_counted_and_the_next_poll_runs(caplog: pytest.LogCaptureFixture) -> None:
    poller, _, clock = make({"gpus": [{"raise_at_ticks": [1], "values": {"temperature_celsius": [30, 31, 32]}}]})
    first = poll(poller, clock)
    second = poll(poller, clock)
    third = poll(poller, clock)
    assert second.tiers["fast"].errors_total == 1
    assert second.gpus[0].up is True and second.gpus[0].temperature_celsius == 30, "last good value kept"
    assert third.gpus[0].temperature_celsius == 32
    assert first.tiers["fast"].errors_total == 0
    assert any("simulated NVML failure" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_static_tier_is_read_once_then_cached() -> None:
    calls: list[Tier] = []
    backend = FakeBackend.plausible(1)
    original = backend.read

    def spy(index: int, tier: Tier) -> Any:
        calls.append(tier)
        return original(index, tier)

    backend.read = spy  # type: ignore[method-assign]
    clock = Clock()
    poller = Poller(backend, SnapshotStore(), monotonic=clock, wall_clock=clock, host_figures=dict)
    for _ in range(5):
        snapshot = poll(poller, clock)
    assert calls.count(Tier.STATIC) == 1
    assert calls.count(Tier.FAST) == 5
    assert snapshot.gpus[0].name == "NVIDIA H200"


def test_store_listeners_see_every_snapshot() -> None:
    poller, _, clock = make({"gpus": [{}]})
    seen: list[Snapshot] = []
    poller._store.subscribe(seen.append)
    poll(poller, clock)
    poll(poller, clock)
    assert len(seen) == 2


def test_driver_going_away_mid_run_reinitialises() -> None:
    from gpumon.backends.base import NvmlUnavailableError

    poller, backend, clock = make({"gpus": [{}]})
    assert poll(poller, clock).nvml_up
    original = backend.read
    calls = {"n": 0}

    def flaky(index: int, tier: Tier) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise NvmlUnavailableError("Driver Not Loaded")
        return original(index, tier)

    backend.read = flaky  # type: ignore[method-assign]
    down = poll(poller, clock)
    assert down.nvml_up is False and "Driver Not Loaded" in (down.nvml_error or "")
    assert any(poll(poller, clock).nvml_up for _ in range(4))


def test_slow_reads_are_spread_over_polls_not_all_gpus_at_once() -> None:
    """With 4 GPUs, a 1 s poll and a 2 s slow interval, at most 2 GPUs read their slow tier per poll;
    each GPU's slow tier is read every 2 s once the reads are spread (one gap of 3 s while spreading)."""
    calls: list[tuple[int, Tier]] = []
    backend = FakeBackend.from_mapping({"count": 4})
    original = backend.read

    def spy(index: int, tier: Tier) -> Any:
        calls.append((index, tier))
        return original(index, tier)

    backend.read = spy  # type: ignore[method-assign]
    clock = Clock()
    poller = Poller(
        backend, SnapshotStore(), PollIntervals(1, 2, 100), monotonic=clock, wall_clock=clock, host_figures=dict
    )
    per_poll = []
    for _ in range(9):
        calls.clear()
        poll(poller, clock)
        per_poll.append(sorted(i for i, t in calls if t is Tier.SLOW))
    assert per_poll[0] == [0, 1, 2, 3], "the first poll reads everything"
    assert all(len(p) <= 2 for p in per_poll[1:])
    reads = {g: [n for n, p in enumerate(per_poll) if g in p] for g in range(4)}
    for gpu, polls in reads.items():
        gaps = [b - a for a, b in itertools.pairwise(polls)]
        assert gaps and all(g in (2, 3) for g in gaps) and gaps[-1] == 2 and gaps.count(3) <= 1, (gpu, polls)


def test_assembled_snapshots_equal_constructed_ones() -> None:
    from gpumon.model.snapshot import GpuSnapshot, field_tier

    backend = FakeBackend.plausible(1)
    backend.init()
    values: dict[str, Any] = {}
    for tier in (Tier.STATIC, Tier.SLOW, Tier.FAST):
        values.update(backend.read(0, tier))
    built = GpuSnapshot(index=0, uuid="GPU-x", **values)
    assembled = GpuSnapshot.assemble(0, "GPU-x", values)
    assert assembled == built
    assert repr(assembled) == repr(built)
    slower = {k: v for k, v in values.items() if field_tier(k) is not Tier.FAST}
    fast = {k: v for k, v in values.items() if field_tier(k) is Tier.FAST}
    on_base = GpuSnapshot.assemble(0, "GPU-x", fast, GpuSnapshot.base_fields(slower))
    assert on_base == built and repr(on_base) == repr(built)
    with pytest.raises(AttributeError):
        assembled.temperature_celsius = 1.0  # type: ignore[misc]


def test_a_process_given_a_reads_figures_equals_one_replaced() -> None:
    """The merge lays each read's memory and SM share over the /proc facts of the same processes
    without the frozen ``__init__``: the same process as ``dataclasses.replace`` makes."""
    import dataclasses

    from gpumon.collect.merge import _with_figures
    from gpumon.model.snapshot import ProcessSnapshot

    attributed = ProcessSnapshot(pid=7, name="python", used_memory_bytes=1, slurm_job_id="42", launcher_pid=3)
    read = ProcessSnapshot(pid=7, used_memory_bytes=2**30, sm_utilization_ratio=0.5)
    made = _with_figures(attributed, read)
    replaced = dataclasses.replace(attributed, used_memory_bytes=2**30, sm_utilization_ratio=0.5)
    assert made == replaced and repr(made) == repr(replaced) and hash(made) == hash(replaced)
    assert attributed.used_memory_bytes == 1  # the attributed one is left as it was
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.pid = 8  # type: ignore[misc]


def test_a_gpus_unchanged_process_list_is_the_same_object_from_poll_to_poll() -> None:
    """Listeners (energy per owner) tell an unchanged list by identity; a figure that moves makes a new one.
    Each read gives new process objects, as NVML's do."""
    from gpumon.model.snapshot import ProcessSnapshot

    memory = iter([2**30, 2**30, 2**30, 2**31])
    backend = FakeBackend.from_mapping({"gpus": [{}]})
    read = backend.read

    def reading(index: int, tier: Tier) -> dict[str, Any]:
        values = dict(read(index, tier))
        if tier is Tier.FAST:
            values["processes"] = (ProcessSnapshot(pid=10, used_memory_bytes=next(memory)),)
        return values

    backend.read = reading  # type: ignore[method-assign]
    clock = Clock()
    poller = Poller(backend, SnapshotStore(), monotonic=clock, wall_clock=clock, enrich_processes=lambda ps: ps)
    lists = [poll(poller, clock).gpus[0].processes for _ in range(4)]
    assert lists[1] is lists[0] and lists[2] is lists[0]
    assert lists[3] is not lists[0] and lists[3] is not None and lists[3][0].used_memory_bytes == 2**31


def test_poll_never_raises_even_when_a_snapshot_listener_does(caplog: pytest.LogCaptureFixture) -> None:
    """A listener (the alert engine, the XID tracker) that raises costs only itself: the poll
    returns, the snapshot is served, the other listeners still hear of it, and the log says it
    once, not once per poll."""
    backend = FakeBackend.from_mapping({"gpus": [{}]})
    store = SnapshotStore()
    clock = Clock()
    heard: list[Snapshot] = []

    def broken(snapshot: Snapshot) -> None:
        raise RuntimeError("listener bug")

    store.subscribe(broken)
    store.subscribe(heard.append)
    poller = Poller(backend, store, monotonic=clock, wall_clock=clock, host_figures=dict)
    with caplog.at_level(logging.ERROR):
        snapshots = [poll(poller, clock) for _ in range(5)]
    assert store.latest() is snapshots[-1]
    assert heard == snapshots
    assert not poller.poll_running
    errors = [r for r in caplog.records if "listener" in r.getMessage()]
    assert len(errors) == 1 and "listener bug" in errors[0].getMessage()


def test_process_attribution_is_read_again_when_the_processes_change_and_every_30_polls() -> None:
    """/proc is read for a GPU's processes when NVML's list changes (another pid), and at least every 30
    polls; in between the snapshot carries the same names, users and places, with the memory and SM share
    of each read (those change every second on a busy GPU and say nothing about who the process is)."""
    from gpumon.backends.fake import FakeGpuScript
    from gpumon.model.snapshot import ProcessSnapshot

    def processes(tick: int) -> tuple[ProcessSnapshot, ...]:
        pid = 7 if tick < 3 else 8
        return (ProcessSnapshot(pid=pid, used_memory_bytes=(tick + 1) << 30, sm_utilization_ratio=tick / 100),)

    backend = FakeBackend(scripts=[FakeGpuScript(uuid="GPU-0", values={"processes": processes})])
    clock = Clock()
    calls = []

    def enrich(processes: Any) -> tuple[ProcessSnapshot, ...]:
        calls.append(len(calls))
        return tuple(p.__class__(**{**p.__dict__, "name": f"trainer{p.pid}"}) for p in processes)

    poller = Poller(
        backend, SnapshotStore(), monotonic=clock, wall_clock=clock, host_figures=dict, enrich_processes=enrich
    )
    seen = []
    for _ in range(35):
        seen += [
            (p.pid, p.name, p.used_memory_bytes, p.sm_utilization_ratio)
            for p in poll(poller, clock).gpus[0].processes or ()
        ]
    assert seen == [(7 if t < 3 else 8, "trainer7" if t < 3 else "trainer8", (t + 1) << 30, t / 100) for t in range(35)]
    assert len(calls) == 3  # first poll, the new pid at poll 4, and 30 polls later


def test_the_poll_constructors_make_what_the_dataclass_constructors_make() -> None:
    """The per-poll shortcuts (no frozen ``__init__``) give equal, equally frozen objects; what gpumon adds
    to a read (XID counts, attributed processes) is laid over the read's own values."""
    from dataclasses import FrozenInstanceError

    from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, TierStats

    stats = TierStats.of_read(0.25, 3, 1000.0)
    assert stats == TierStats(duration_seconds=0.25, errors_total=3, last_timestamp_seconds=1000.0)
    assert repr(stats) == repr(TierStats(0.25, 3, 1000.0))
    gpu = GpuSnapshot.assemble(0, "GPU-x", {"temperature_celsius": 40.0, "xid_errors_total": {"13": 1}}, None, {})
    host = HostSnapshot(driver_version="580")
    made = Snapshot.of_poll(1000.0, 5.0, host, (gpu,), {"fast": stats})
    built = Snapshot(
        timestamp_seconds=1000.0, monotonic_seconds=5.0, nvml_up=True, host=host, gpus=(gpu,), tiers={"fast": stats}
    )
    assert made == built and repr(made) == repr(built)
    with pytest.raises(FrozenInstanceError):
        made.nvml_up = False  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        stats.errors_total = 0  # type: ignore[misc]
    read = {"temperature_celsius": 40.0, "xid_errors_total": {"13": 1}}
    extra = {"xid_errors_total": {"13": 2}, "xid_last_timestamp_seconds": {"13": 999.0}}
    over = GpuSnapshot.assemble(0, "GPU-x", read, None, extra)
    assert over == GpuSnapshot(index=0, uuid="GPU-x", **{**read, **extra})
    assert read == {"temperature_celsius": 40.0, "xid_errors_total": {"13": 1}}, "the read itself is left as it was"


def test_a_snapshot_keeps_its_tier_stats_when_later_polls_read_other_tiers() -> None:
    """Snapshots share the poller's tier-stats mapping until a poll replaces it; none is changed afterwards."""
    poller, _backend, clock = make({"gpus": [{}]}, PollIntervals(fast_seconds=1, slow_seconds=3, static_seconds=100))
    snapshots = [poll(poller, clock) for _ in range(5)]
    seen = [{tier: stats.last_timestamp_seconds for tier, stats in s.tiers.items()} for s in snapshots]
    assert seen == [
        {"static": 1000.0, "slow": 1000.0, "fast": 1000.0},
        {"static": 1000.0, "slow": 1000.0, "fast": 1001.0},
        {"static": 1000.0, "slow": 1000.0, "fast": 1002.0},
        {"static": 1000.0, "slow": 1003.0, "fast": 1003.0},
        {"static": 1000.0, "slow": 1003.0, "fast": 1004.0},
    ]
    assert [s.tiers["fast"].errors_total for s in snapshots] == [0] * 5


def test_a_failed_fast_read_keeps_the_gpus_last_values_and_is_counted() -> None:
    """A fast read that raises (not a lost GPU): the snapshot carries the GPU's last values, the fast tier's
    errors count it, and the next poll reads as usual."""
    poller, _backend, clock = make(
        {"gpus": [{"values": {"temperature_celsius": [40, 41, 42, 43]}, "raise_at_ticks": [2]}]}
    )
    temps = []
    errors = []
    for _ in range(4):
        snapshot = poll(poller, clock)
        temps.append(snapshot.gpus[0].temperature_celsius)
        errors.append(snapshot.tiers["fast"].errors_total)
    assert temps == [40, 41, 41, 43]
    assert errors == [0, 0, 1, 1]
    assert all(g.up for g in snapshot.gpus)


def test_a_planned_poll_reads_each_gpus_tiers_in_order_and_times_every_fast_read() -> None:
    """A poll that reads the slow tier of some GPUs: each GPU's tiers are read slowest first, GPU by GPU,
    and the fast tier's duration is every GPU's fast read (the slow ones' are the slow tier's)."""
    calls: list[tuple[int, Tier]] = []
    backend = FakeBackend.from_mapping({"count": 4})
    original = backend.read
    clock = Clock()
    cost = {Tier.FAST: 0.01, Tier.SLOW: 0.25, Tier.STATIC: 0.5}

    def spy(index: int, tier: Tier) -> Any:
        calls.append((index, tier))
        clock.now += cost[tier]  # the read takes this long on the poller's clock
        return original(index, tier)

    backend.read = spy  # type: ignore[method-assign]
    poller = Poller(
        backend, SnapshotStore(), PollIntervals(1, 4, 100), monotonic=clock, wall_clock=clock, host_figures=dict
    )
    poller.poll()  # every tier of every GPU
    clock.now = 1004.0  # every GPU's slow tier due: one GPU a poll (ceil(4 × 1 / 4))
    calls.clear()
    snapshot = poller.poll()
    assert calls == [(0, Tier.SLOW), (0, Tier.FAST), (1, Tier.FAST), (2, Tier.FAST), (3, Tier.FAST)]
    assert snapshot.tiers["fast"].duration_seconds == pytest.approx(0.04)
    assert snapshot.tiers["slow"].duration_seconds == pytest.approx(0.25)
    assert [g.up for g in snapshot.gpus] == [True] * 4


def test_a_listener_that_fails_then_works_is_said_to_work_again_once(caplog: pytest.LogCaptureFixture) -> None:
    """The store logs a failing listener once, and once that it works again; not on the polls after."""
    backend = FakeBackend.from_mapping({"gpus": [{}]})
    store = SnapshotStore()
    clock = Clock()
    failing = [True, True, False, False, False]

    def flaky(snapshot: Snapshot) -> None:
        if failing.pop(0):
            raise RuntimeError("listener bug")

    store.subscribe(flaky)
    poller = Poller(backend, store, monotonic=clock, wall_clock=clock, host_figures=dict)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            poll(poller, clock)
    again = [r for r in caplog.records if "works again" in r.getMessage()]
    assert len(again) == 1 and "flaky" in again[0].getMessage()
