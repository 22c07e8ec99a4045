"""The straggler window kept as it slides gives what a pass over every kept poll gives, exactly.

The detector used to work its findings and deviation series out of every kept poll of every GPU each
time it was asked (the alert tick every 5 s, each scrape): 1 ms and more at 8 busy GPUs. Now each GPU's
track is kept as polls come and go; these properties hold it to that pass, figure for figure: how many
polls, the first and last poll's time, each signal's count, how many below the margin and its mean
(``math.fsum``), the clock-event counts and peer shares, the order of the signals, and the latest poll.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.health.straggler_window import Compared, ComparedWindow

SIGNALS = ("sm_clock", "compute_share", "power")
REASONS = ("hw_slowdown", "sw_power_cap")
MARGIN = 0.1

deviation = st.floats(min_value=-0.9, max_value=0.9, allow_nan=False)
gpu_poll = st.fixed_dictionaries(
    {
        "group": st.sampled_from(["a", "b"]),
        "deviations": st.dictionaries(st.sampled_from(SIGNALS), deviation),
        "reasons": st.frozensets(st.sampled_from(REASONS)),
        "shares": st.tuples(*[st.sampled_from([0.0, 1 / 3, 0.5, 1.0])] * len(REASONS)),
        "processes": st.integers(0, 3),
    }
)
poll = st.dictionaries(st.integers(0, 3), gpu_poll, min_size=1)


def compared(index: int, g: dict[str, Any]) -> Compared:
    return Compared(
        index=index,
        uuid=f"GPU-{index}-{g['group']}",
        group=g["group"],
        deviations=g["deviations"],
        reasons=g["reasons"],
        peer_reason_shares=dict(zip(REASONS, g["shares"], strict=True)),
        processes=g["processes"],
        peer_processes=1.0,
        peers=2,
    )


def a_pass_over(samples: deque[tuple[float, tuple[Compared, ...]]]) -> dict[int, dict[str, Any]]:
    """What the detector worked out of every kept poll before (its _compute_per_gpu)."""
    out: dict[int, dict[str, Any]] = {}
    for t, gpus in samples:
        for gpu in gpus:
            entry = out.get(gpu.index)
            if entry is None or entry["group"] != gpu.group:
                entry = out[gpu.index] = {"group": gpu.group, "samples": [], "signals": {}, "reasons": {}}
            entry["latest"] = gpu
            entry["samples"].append(t)
            for reason in REASONS:
                mine = entry["reasons"].setdefault(reason, [0, 0.0])
                mine[0] += reason in gpu.reasons
                mine[1] += gpu.peer_reason_shares[reason]
            for signal, d in gpu.deviations.items():
                entry["signals"].setdefault(signal, []).append((d, d < -MARGIN))
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(poll, max_size=40), st.integers(1, 12))
def test_each_gpu_track_holds_what_a_pass_over_the_kept_polls_gives(polls: list[dict[int, Any]], window: int) -> None:
    kept: deque[tuple[float, tuple[Compared, ...]]] = deque()
    sliding = ComparedWindow(MARGIN)
    for t, gpus in enumerate(polls):
        while kept and kept[0][0] < t - window:
            sliding.drop(kept.popleft()[1])
        sample = tuple(compared(i, g) for i, g in sorted(gpus.items()))
        kept.append((float(t), sample))
        sliding.add(float(t), sample)
        expected = a_pass_over(kept)
        assert sorted(sliding.tracks) == sorted(expected)
        for index, entry in expected.items():
            track = sliding.tracks[index]
            assert [p[0] for p in track.polls] == entry["samples"]
            assert track.latest is entry["latest"]
            assert track.signals_in_order() == list(entry["signals"])
            for signal in SIGNALS:
                points = entry["signals"].get(signal, [])
                assert track.points(signal) == len(points)
                assert track.below(signal) == sum(b for _, b in points)
                if points:
                    assert track.mean(signal) == math.fsum(d for d, _ in points) / len(points)
            assert track.reason_counts(REASONS) == {r: tuple(v) for r, v in entry["reasons"].items()}
