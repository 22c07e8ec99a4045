"""The stuck-profiling window kept as it slides gives the findings of a pass over every kept poll, exactly.

The detector used to look at every kept poll of every GPU each time it was asked (the alert tick every
5 s, each scrape's health report): 300 polls a GPU at the default window. It now keeps, per GPU, how
many polls were idle, had a reading other than 0, or differed from the poll before, as polls come and
go; this property holds it to the pass it replaced, finding for finding, over random snapshot
sequences (GPUs busy or idle, with and without GPM, lost, gone from the snapshot and back).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.health.profiling_stuck import FIELDS, StuckProfiling
from gpumon.model.findings import WARNING, Finding
from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, Snapshot

WINDOW = 30.0
BUSY = 0.9


class APassOverThePolls:
    """The detector as it was: every kept poll looked at again for each question."""

    def __init__(self) -> None:
        self.polls: dict[tuple[int, str | None], deque[tuple[float, bool, tuple[Any, ...]]]] = {}

    def observe(self, snapshot: Snapshot) -> None:
        for gpu in snapshot.gpus:
            polls = self.polls.setdefault((gpu.index, gpu.uuid), deque())
            if not gpu.up or gpu.sm_active_ratio is None:
                polls.clear()
                continue
            busy = gpu.utilization_ratio is not None and gpu.utilization_ratio >= BUSY
            polls.append((snapshot.timestamp_seconds, busy, tuple(getattr(gpu, f) for f in FIELDS)))
            while len(polls) > 1 and polls[1][0] <= snapshot.timestamp_seconds - WINDOW:
                polls.popleft()
        for gone in set(self.polls) - {(g.index, g.uuid) for g in snapshot.gpus}:
            del self.polls[gone]

    def findings(self, now: float) -> list[Finding]:
        out = []
        for (index, uuid), polls in sorted(self.polls.items(), key=lambda kv: kv[0][0]):
            stuck = self.stuck(polls, now)
            if stuck is not None:
                out.append(
                    Finding(
                        kind="profiling_stuck",
                        severity=WARNING,
                        action="none",
                        summary=f"profiling counters {stuck} while busy for {WINDOW / 60:g} min",
                        gpu=index,
                        uuid=uuid,
                        evidence={
                            "readings": dict(zip(FIELDS, polls[-1][2], strict=True)),
                            "window_seconds": WINDOW,
                            "busy_ratio": BUSY,
                            "polls": len(polls),
                        },
                    )
                )
        return out

    @staticmethod
    def stuck(polls: deque[tuple[float, bool, tuple[Any, ...]]], now: float) -> str | None:
        if not polls or polls[0][0] > now - WINDOW:
            return None
        if now - polls[-1][0] > WINDOW / 10 or not all(busy for _t, busy, _r in polls):
            return None
        seen = [tuple(v for v in readings if v is not None) for _t, _b, readings in polls]
        if all(v == 0 for values in seen for v in values):
            return "stuck at 0"
        if len(set(seen)) == 1:
            return "not changing"
        return None


reading = st.sampled_from([None, 0.0, 0.0, 0.25, 0.5])
gpu_poll = st.fixed_dictionaries(
    {
        "up": st.sampled_from([True, True, True, False]),
        "uuid": st.sampled_from(["GPU-a", "GPU-a", "GPU-b"]),
        "utilization": st.sampled_from([None, 0.3, 0.95, 0.95, 1.0]),
        "gpm": st.tuples(st.sampled_from([None, 0.0, 0.0, 0.5]), reading, reading, reading),
    }
)
change = st.one_of(st.just("gone"), gpu_poll, gpu_poll, gpu_poll)
poll = st.tuples(st.sampled_from([1.0, 2.0, 3.0, 5.0, 12.0]), st.dictionaries(st.integers(0, 2), change, max_size=1))
"""The time since the poll before, and what changed (mostly nothing): a GPU's new state, or gone from the snapshot."""


def snapshot_of(at: float, gpus: dict[int, dict[str, Any]]) -> Snapshot:
    return Snapshot(
        timestamp_seconds=at,
        monotonic_seconds=at,
        nvml_up=True,
        host=HostSnapshot(),
        gpus=tuple(
            GpuSnapshot(
                index=i,
                uuid=g["uuid"],
                up=g["up"],
                utilization_ratio=g["utilization"],
                **dict(zip(FIELDS, g["gpm"], strict=True)),
            )
            for i, g in sorted(gpus.items())
        ),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(poll, min_size=10, max_size=80), st.sampled_from([0.0, 2.0, 3.5, 40.0]))
def test_the_findings_are_those_of_a_pass_over_the_kept_polls(polls: list[Any], asked_after: float) -> None:
    sliding, reference = StuckProfiling(WINDOW, BUSY), APassOverThePolls()
    at = 1_800_000_000.0
    state: dict[int, dict[str, Any]] = {}
    for step, changes in polls:
        at += step
        for index, change in changes.items():
            if change == "gone":
                state.pop(index, None)
            else:
                state[index] = change
        snapshot = snapshot_of(at, state)
        sliding.observe(snapshot)
        reference.observe(snapshot)
        assert sliding.findings(at + asked_after) == reference.findings(at + asked_after)
