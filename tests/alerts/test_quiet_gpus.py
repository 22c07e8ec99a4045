"""Rules pass over the GPUs where nothing changed, and the alerts are the same as observing everything.

The engine skips a per-GPU rule on a GPU where it observed nothing at the last snapshot and reads the
same values now (``gpumon/alerts/quiet_gpus.py``). What a user sees must not move: an alert whose
inputs never change still goes pending, fires after its ``for:``, keeps firing and resolves on time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.alerts.alert import AlertChange
from gpumon.alerts.engine import AlertEngine
from gpumon.alerts.quiet_gpus import KIND_INPUTS, input_fields
from gpumon.alerts.rules import DERIVED_FIELD_INPUTS, DERIVED_FIELDS, Rule
from gpumon.model.snapshot import GpuSnapshot, ProcessSnapshot
from tests.alerts.helpers import UUID0, UUID1, alerting, gpu, snap
from tests.helpers import examples

T0 = 1_800_000_000.0
HOT = {"name": "Hot", "field": "temperature_celsius", "op": ">", "threshold": 85, "for": "1m"}


def engine(*rules: dict[str, Any], pass_over_quiet: bool = True) -> AlertEngine:
    config = alerting({"builtin_rules": False, "rules": list(rules)})
    return AlertEngine(config.all_rules(), host="node1", started_at=T0, pass_over_quiet=pass_over_quiet)


def moves(changes: list[AlertChange]) -> list[tuple[str, str, str, str]]:
    return [(c.alert.alertname, c.alert.gpu, c.previous, c.alert.state) for c in changes]


def test_an_alert_whose_gpu_reads_the_same_every_poll_fires_after_for_and_resolves_when_it_changes() -> None:
    e = engine(HOT)
    hot = snap(T0, gpu(0, temperature_celsius=90.0), gpu(1, temperature_celsius=50.0))
    assert moves(e.evaluate(hot, T0)) == [("Hot", "0", "inactive", "pending")]
    for second in range(1, 60):  # the very same snapshot, a poll a second
        assert e.evaluate(hot, T0 + second) == []
    assert moves(e.evaluate(hot, T0 + 60)) == [("Hot", "0", "pending", "firing")]
    assert e.evaluate(hot, T0 + 61) == [] and [a.state for a in e.alerts()] == ["firing"]
    cooled = snap(T0 + 62, gpu(0, temperature_celsius=80.0), gpu(1, temperature_celsius=50.0))
    assert moves(e.evaluate(cooled, T0 + 62)) == [("Hot", "0", "firing", "resolved")]
    assert e.evaluate(cooled, T0 + 63) == [] and e.alerts() == []
    hot_again = snap(T0 + 64, gpu(0, temperature_celsius=50.0), gpu(1, temperature_celsius=90.0))
    assert moves(e.evaluate(hot_again, T0 + 64)) == [("Hot", "1", "inactive", "pending")]


def test_keep_firing_for_counts_down_while_a_lost_gpu_reads_the_same() -> None:
    e = engine({**HOT, "for": "0s", "keep_firing_for": "10s"})
    assert moves(e.evaluate(snap(T0, gpu(0, temperature_celsius=90.0)), T0)) == [("Hot", "0", "inactive", "firing")]
    lost = snap(T0 + 1, gpu(0, up=False, lost_reason="GPU is lost", temperature_celsius=None))
    for second in range(1, 10):
        assert e.evaluate(lost, T0 + second) == [], f"still firing {second} s after the last reading"
    assert moves(e.evaluate(lost, T0 + 10)) == [("Hot", "0", "firing", "resolved")]


def test_a_gpu_replaced_at_the_same_index_with_the_same_values_is_judged_afresh() -> None:
    e = engine({"name": "Ecc", "kind": "ecc_uncorrectable"})
    counts = {"uncorrected_volatile": 0, "uncorrected_aggregate": 5}
    assert e.evaluate(snap(T0, gpu(0, uuid=UUID0, ecc_errors_total=counts)), T0) == []
    grown = {"uncorrected_volatile": 0, "uncorrected_aggregate": 6}
    assert moves(e.evaluate(snap(T0 + 1, gpu(0, uuid=UUID0, ecc_errors_total=grown)), T0 + 1)) == [
        ("Ecc", "0", "inactive", "firing")
    ]
    # another board in that slot, reading what the first read: its own baseline, so nothing grew
    changes = e.evaluate(snap(T0 + 2, gpu(0, uuid=UUID1, ecc_errors_total=grown)), T0 + 2)
    assert [(c.alert.uuid, c.alert.state) for c in changes] == [(UUID0, "resolved")]
    assert e.evaluate(snap(T0 + 3, gpu(0, uuid=UUID1, ecc_errors_total=grown)), T0 + 3) == []


def test_new_rules_judge_values_that_did_not_change() -> None:
    """After a reload (SIGHUP) a lowered threshold fires at the next poll on a temperature that stayed put."""
    e = engine({**HOT, "for": "0s"})
    warm = snap(T0, gpu(0, temperature_celsius=80.0))
    assert e.evaluate(warm, T0) == [] and e.evaluate(warm, T0 + 1) == []
    e.set_rules(alerting({"builtin_rules": False, "rules": [{**HOT, "threshold": 75, "for": "0s"}]}).all_rules())
    assert moves(e.evaluate(warm, T0 + 2)) == [("Hot", "0", "inactive", "firing")]


def test_an_alert_restored_from_the_spool_resolves_on_values_that_did_not_change() -> None:
    first = engine({**HOT, "for": "0s"})
    warm = snap(T0, gpu(0, temperature_celsius=80.0))
    assert first.evaluate(warm, T0) == []
    first.evaluate(snap(T0 + 1, gpu(0, temperature_celsius=90.0)), T0 + 1)
    saved = first.export_state()
    restarted = engine({**HOT, "for": "0s"})
    assert restarted.evaluate(warm, T0 + 2) == []  # quiet on these values before the restore
    restarted.restore_state(saved)
    assert moves(restarted.evaluate(warm, T0 + 3)) == [("Hot", "0", "firing", "resolved")]


def test_a_nan_temperature_leaves_the_slowdown_margin_unknown_as_the_temperature_itself() -> None:
    """A NaN reading is no value: the margin computed from it neither fires nor breaks the evaluation
    of an alert open on that GPU (it resolved, as when the temperature reads nothing)."""
    e = engine({"name": "Margin", "field": "temperature_slowdown_margin_celsius", "op": "<=", "threshold": 5})
    assert moves(e.evaluate(snap(T0, gpu(0, temperature_celsius=88.0)), T0)) == [("Margin", "0", "inactive", "firing")]
    changes = e.evaluate(snap(T0 + 1, gpu(0, temperature_celsius=float("nan"))), T0 + 1)
    assert moves(changes) == [("Margin", "0", "firing", "resolved")]
    assert e.evaluate(snap(T0 + 2, gpu(0, temperature_celsius=float("inf"))), T0 + 2) == []


def test_each_rule_kind_names_the_fields_it_reads() -> None:
    """A field a kind reads but does not name would let a change there go unseen: the kinds' observers read
    only these (checked by the property below), and the derived fields only their inputs."""
    assert set(KIND_INPUTS) | {"threshold"} >= {"ecc_uncorrectable", "nvlink_down", "pcie_degraded", "idle_with_memory"}
    assert set(DERIVED_FIELD_INPUTS) == set(DERIVED_FIELDS)
    base = gpu(0, processes=(ProcessSnapshot(pid=1, used_memory_bytes=2**30),))
    for name, inputs in DERIVED_FIELD_INPUTS.items():
        others = {f.name: None for f in dataclasses.fields(GpuSnapshot) if f.name not in {*inputs, "index", "uuid"}}
        assert DERIVED_FIELDS[name](dataclasses.replace(base, **others)) == DERIVED_FIELDS[name](base), name
        assert input_fields(Rule(name="R", field=name))[1:] == inputs


def test_a_firing_alerts_text_follows_its_value_and_it_is_announced_once() -> None:
    from gpumon.alerts.delivery import deliver
    from gpumon.alerts.notification import Notification

    e = engine({**HOT, "for": "0s", "annotations": {"summary": "GPU {{ gpu }} at {{ value }} °C"}})
    delivered: dict[str, Notification] = {}
    seen = []
    for second, celsius in enumerate([90.0, 91.0, 91.0, 92.0, 92.0]):
        e.evaluate(snap(T0 + second, gpu(0, temperature_celsius=celsius)), T0 + second)
        assert deliver(e.notifiable(), delivered, [], T0 + second, "", float) == (second == 0), "queued once"
        [(fp, notification)] = delivered.items()
        [alert] = e.alerts()
        assert fp == alert.fingerprint and notification.annotations == alert.annotations
        seen.append(notification.annotations["summary"])
    assert seen == [f"GPU 0 at {c} °C" for c in (90, 91, 91, 92, 92)]


# ---- the property: passing over quiet GPUs gives exactly the alerts of observing every GPU ----------------

PROCESSES = st.sampled_from(
    [None, (), (ProcessSnapshot(pid=1, used_memory_bytes=2**30),), (ProcessSnapshot(pid=2, used_memory_bytes=0),)]
)
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "up": st.sampled_from([True, True, True, False]),
    "temperature_celsius": st.sampled_from([None, 50.0, 84.0, 86.0, 90.0, float("nan")]),
    "temperature_slowdown_threshold_celsius": st.sampled_from([None, 90.0]),
    "memory_used_bytes": st.sampled_from([None, 0, 50, 95]),
    "memory_total_bytes": st.sampled_from([None, 0, 100]),
    "utilization_ratio": st.sampled_from([None, 0.0, 0.2, 0.6, 1.0]),
    "processes": PROCESSES,
    "clock_events_active": st.sampled_from([None, {"hw_slowdown": False}, {"hw_slowdown": True}, {}]),
    "ecc_errors_total": st.sampled_from(
        [
            None,
            {"uncorrected_volatile": 0, "uncorrected_aggregate": 3},
            {"uncorrected_volatile": 1},
            {"uncorrected_aggregate": 4},
            {"uncorrected_aggregate": 2},
        ]
    ),
    "nvlink_up": st.sampled_from([None, {"0": True, "1": True}, {"0": True, "1": False}, {"0": False}]),
    "pcie_link_generation": st.sampled_from([None, 3, 5]),
    "pcie_link_width": st.sampled_from([8, 16]),
    "row_remap_pending": st.sampled_from([None, False, True]),
}
RULES = [
    {"name": "Hot", "field": "temperature_celsius", "op": ">", "threshold": 85, "clear_threshold": 80, "for": "2s"},
    {"name": "HotNow", "field": "temperature_celsius", "op": ">=", "threshold": 86, "keep_firing_for": "3s"},
    {"name": "Margin", "field": "temperature_slowdown_margin_celsius", "op": "<=", "threshold": 5, "for": "1s"},
    {"name": "Mem", "field": "memory_used_ratio", "op": ">", "threshold": 0.9},
    {"name": "Procs", "field": "process_count", "op": "!=", "threshold": 0, "for": "2s"},
    {"name": "Slow", "field": "clock_events_active.hw_slowdown", "op": "==", "threshold": True},
    {"name": "Lost", "field": "up", "op": "==", "threshold": False, "keep_firing_for": "2s"},
    {"name": "Remap", "field": "row_remap_pending", "op": "==", "threshold": True, "for": "1s"},
    {"name": "Ecc", "kind": "ecc_uncorrectable"},
    {"name": "Link", "kind": "nvlink_down", "keep_firing_for": "1s"},
    {"name": "Pcie", "kind": "pcie_degraded", "min_utilization": 0.5, "for": "2s"},
    {"name": "Idle", "kind": "idle_with_memory", "threshold": 0.3, "for": "1s"},
    {"name": "Nvml", "kind": "nvml_down", "for": "2s"},
    {"name": "Stale", "kind": "stale_snapshot", "threshold": 3},
]
UUIDS = ("GPU-a", "GPU-b", "GPU-c", "GPU-d")


@st.composite
def polls(draw: st.DrawFn) -> list[tuple[float, float, Any]]:
    """(seconds since the last poll, snapshot age, snapshot) for some polls; between two polls a few
    fields of some GPU change, now and then a board is swapped or a GPU goes missing."""
    count = draw(st.integers(1, 3))
    values = [{name: draw(strategy) for name, strategy in FIELDS.items()} for _ in range(count)]
    uuids = list(UUIDS[:count])
    out = []
    for _ in range(draw(st.integers(1, 40))):
        for index, name in draw(
            st.lists(st.tuples(st.integers(0, count - 1), st.sampled_from(sorted(FIELDS))), max_size=3)
        ):
            values[index][name] = draw(FIELDS[name])
        if draw(st.integers(0, 19)) == 0:  # a board swapped, or the GPUs reordered
            uuids = draw(st.permutations(UUIDS))[: len(uuids)]
        fixed = {"pcie_link_generation_max": 5, "pcie_link_width_max": 16}
        gpus = [gpu(i, uuid=uuids[i], **one, **fixed) for i, one in enumerate(values)]
        shown = gpus[:-1] if draw(st.integers(0, 19)) == 0 else gpus  # now and then a GPU missing
        nvml_up = draw(st.integers(0, 19)) > 0
        taken = snap(0.0, *shown, nvml_up=nvml_up, nvml_error=None if nvml_up else "gone")
        out.append((draw(st.sampled_from([0.5, 1.0, 1.0, 2.5])), draw(st.sampled_from([0.0, 0.0, 5.0])), taken))
    return out


@settings(max_examples=examples(3000), deadline=None)
@given(polls(), st.integers(-1, 40))
def test_passing_over_quiet_gpus_gives_the_alerts_of_observing_every_gpu(
    sequence: list[tuple[float, float, Any]], reload_at: int
) -> None:
    """Every kind of per-GPU rule and the host rules at once, against the same rules observing every GPU."""
    fast, plain = engine(*RULES), engine(*RULES, pass_over_quiet=False)
    rules = fast.rules
    now = T0
    for n, (step, age, snapshot) in enumerate(sequence):
        now += step
        if n == reload_at:  # a SIGHUP with the thresholds moved
            moved = [{**r, "threshold": r["threshold"] + 1} if type(r.get("threshold")) is int else r for r in RULES]
            new = alerting({"builtin_rules": False, "rules": moved}).all_rules()
            assert fast.set_rules(new, now) == plain.set_rules(new, now)
            rules = fast.rules
        taken = dataclasses.replace(snapshot, timestamp_seconds=now - age, monotonic_seconds=now - age)
        assert fast.evaluate(taken, now) == plain.evaluate(taken, now), f"poll {n}"
        assert fast.alerts() == plain.alerts()
        assert fast.export_state() == plain.export_state()
        assert fast.revision == plain.revision
        fresh = AlertEngine(rules, host="node1", started_at=T0)  # its alerts made anew from the saved states
        fresh.restore_state(fast.export_state())
        assert fast.alerts() == fresh.alerts()
        if n % 3 == 2:
            assert fast.tick(now + 0.5) == plain.tick(now + 0.5)
