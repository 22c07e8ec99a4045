"""Passive straggler detection: which GPU is named, in what words, and when it stays quiet."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.health.stragglers import StragglerConfig, StragglerDetector
from gpumon.model.snapshot import GpuSnapshot
from tests.signals.helpers import GHZ, gpu, proc, snap

WINDOW = 60.0


def run(
    make: Callable[[int], list[GpuSnapshot]], seconds: int = 61, burning: bool = False, **cfg: float
) -> StragglerDetector:
    """One snapshot a second for ``seconds``; ``make(t)`` gives the GPUs at second t."""
    detector = StragglerDetector(StragglerConfig(window_seconds=WINDOW, **cfg))  # type: ignore[arg-type]
    for t in range(seconds):
        detector.observe(snap(1000.0 + t, *make(t)), burning=burning)
    return detector


NOW = 1000.0 + 60


def thermal_gpu_3(t: int) -> list[GpuSnapshot]:
    """Eight busy H200s; GPU 3 runs 12 % lower SM clocks, in thermal slowdown 2 seconds in 5."""
    gpus = [gpu(i) for i in range(8)]
    gpus[3] = gpu(
        3,
        clocks_hertz={"sm": 1.98 * GHZ * 0.88},
        clock_events_active={"hw_thermal_slowdown": t % 5 < 2},
        power_watts=600.0,
    )
    return gpus


def test_a_gpu_with_lower_clocks_under_the_same_load_is_named_with_its_cause() -> None:
    findings = run(thermal_gpu_3).findings(NOW)
    assert [f.gpu for f in findings] == [3]
    f = findings[0]
    assert f.kind == "straggler" and f.severity == "WARNING" and f.action == "inspect_hardware"
    assert f.reason() == (
        "GPU 3 runs 12 % lower SM clocks than its 7 peers under the same load: "
        "thermal slowdown 41 % of the time: inspect hardware"
    )
    assert f.evidence["signal"] == "sm_clock"
    assert f.evidence["deviations"]["sm_clock"] == -0.12


def test_deviation_series_give_every_compared_gpu_its_distance_from_the_peers() -> None:
    deviations = {(d.index, d.signal): d.ratio for d in run(thermal_gpu_3).deviations(NOW)}
    assert round(deviations[(3, "sm_clock")], 3) == -0.12
    assert deviations[(0, "sm_clock")] == 0.0
    assert round(deviations[(3, "power")], 3) == round(600 / 640 - 1, 3)


def test_the_finding_needs_most_of_the_window_and_clears_when_the_gpu_catches_up() -> None:
    assert run(thermal_gpu_3, seconds=40).findings(1000.0 + 39) == []  # 40 s of a 60 s window: not yet
    assert [f.gpu for f in run(thermal_gpu_3, seconds=49).findings(1000.0 + 48)] == [3]

    def recovered_at_60(t: int) -> list[GpuSnapshot]:
        return thermal_gpu_3(t) if t < 60 else [gpu(i) for i in range(8)]

    assert [f.gpu for f in run(recovered_at_60, seconds=65).findings(1000.0 + 64)] == [3]
    assert run(recovered_at_60, seconds=75).findings(1000.0 + 74) == []  # more than 20 % of the window healthy


def test_a_short_dip_is_not_a_straggler() -> None:
    def dip(t: int) -> list[GpuSnapshot]:
        return thermal_gpu_3(t) if 20 <= t < 40 else [gpu(i) for i in range(8)]

    assert run(dip).findings(NOW) == []


def test_idle_host_is_quiet() -> None:
    def idle(t: int) -> list[GpuSnapshot]:
        return [gpu(0, utilization_ratio=0.0, clocks_hertz={"sm": 0.345 * GHZ}), gpu(1, utilization_ratio=0.0)]

    detector = run(idle)
    assert detector.findings(NOW) == [] and detector.deviations(NOW) == []


def test_unequal_load_one_gpu_training_one_idle_is_quiet() -> None:
    def unequal(t: int) -> list[GpuSnapshot]:
        return [gpu(0), gpu(1, utilization_ratio=0.02, clocks_hertz={"sm": 0.345 * GHZ}, power_watts=80.0)]

    assert run(unequal).findings(NOW) == []


def test_quiet_while_a_burn_runs() -> None:
    assert run(thermal_gpu_3, burning=True).findings(NOW) == []


def test_a_single_gpu_has_no_peers() -> None:
    assert run(lambda t: [thermal_gpu_3(t)[3]]).findings(NOW) == []


def test_mixed_models_are_not_compared() -> None:
    def mixed(t: int) -> list[GpuSnapshot]:
        return [gpu(0), gpu(1, name="NVIDIA H100 80GB HBM3", clocks_hertz={"sm": 1.4 * GHZ})]

    assert run(mixed).findings(NOW) == []


def test_gpus_of_different_jobs_are_not_compared() -> None:
    def two_jobs(t: int) -> list[GpuSnapshot]:
        return [
            gpu(0, processes=(proc(10, None, job="101"),)),
            gpu(1, processes=(proc(11, None, job="101"),)),
            gpu(2, processes=(proc(12, None, job="202"),), clocks_hertz={"sm": 1.2 * GHZ}),
            gpu(3, processes=(proc(13, None, job="202"),)),
        ]

    assert [f.gpu for f in run(two_jobs).findings(NOW)] == [2]  # GPU 2 against GPU 3, its job's peer
    assert [d.index for d in run(two_jobs).deviations(NOW) if d.signal == "sm_clock"] == [0, 1, 2, 3]


def test_a_second_process_taking_the_gpus_time_makes_it_a_straggler() -> None:
    """Both GPUs busy (the job's GPU 0 waits in the all-reduce), equal clocks; GPU 1 shares its time."""

    def competitor_on_1(t: int) -> list[GpuSnapshot]:
        return [
            gpu(0, processes=(proc(100, 0.98),), sm_active_ratio=0.55),
            gpu(1, processes=(proc(101, 0.5), proc(200, 0.48, memory=1 << 20)), sm_active_ratio=0.95),
        ]

    findings = run(competitor_on_1).findings(NOW)
    assert [f.reason() for f in findings] == [
        "GPU 1 runs 49 % lower SM time for its busiest process than its 1 peer under the same load: "
        "2 processes on it, 1 on each peer"
    ]
    assert findings[0].action == "none"


def test_peers_waiting_for_a_slow_gpu_are_not_named_for_their_lower_activity_or_power() -> None:
    """In a synchronous job the healthy GPUs wait: less SM activity, less power; the slow one is not them."""

    def waiting_peers(t: int) -> list[GpuSnapshot]:
        return [
            gpu(0, sm_active_ratio=0.5, tensor_active_ratio=0.3, power_watts=420.0),
            gpu(1, sm_active_ratio=0.5, tensor_active_ratio=0.3, power_watts=420.0),
            gpu(2, sm_active_ratio=0.97, tensor_active_ratio=0.9, power_watts=690.0),
        ]

    assert run(waiting_peers).findings(NOW) == []


def test_margin_is_configurable() -> None:
    assert run(thermal_gpu_3, margin_ratio=0.15).findings(NOW) == []


def _brute_force_peers(gpus: list[GpuSnapshot]) -> dict[int, tuple[dict[str, float], dict[str, float], float]]:
    """Per GPU: deviations, peer reason shares and peer process median, as the definition reads."""
    import statistics

    from gpumon.health.stragglers import REASONS, _values

    values = {g.index: _values(g) for g in gpus}
    reasons = {g.index: {r for r, on in (g.clock_events_active or {}).items() if on} for g in gpus}
    out = {}
    for g in gpus:
        peers = [p.index for p in gpus if p.index != g.index]
        deviations = {}
        for signal, value in values[g.index].items():
            peer_values = [values[p][signal] for p in peers if signal in values[p]]
            if len(peer_values) == len(peers) and statistics.median(peer_values) > 0:
                deviations[signal] = value / statistics.median(peer_values) - 1.0
        shares = {r: sum(r in reasons[p] for p in peers) / len(peers) for r in REASONS}
        procs = statistics.median(len(gpus[p].processes or ()) for p in peers)
        out[g.index] = (deviations, shares, procs)
    return out


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1.5, 1.8, 1.98, 2.0]),
            st.one_of(st.none(), st.floats(0.1, 1.0)),
            st.integers(0, 3),
            st.booleans(),
        ),
        min_size=2,
        max_size=12,
    )
)
def test_each_gpu_is_set_against_the_median_of_its_peers_exactly(
    rows: list[tuple[float, float | None, int, bool]],
) -> None:
    """Sorted once per group, the comparison gives exactly the per-GPU median of the others."""
    from gpumon.health.stragglers import _compare

    gpus = [
        gpu(
            i,
            clocks_hertz={"sm": clock * GHZ},
            sm_active_ratio=active,
            processes=[proc(100 + n, 0.5) for n in range(procs)],
            clock_events_active={"hw_thermal_slowdown": hot},
        )
        for i, (clock, active, procs, hot) in enumerate(rows)
    ]
    expected = _brute_force_peers(gpus)
    for c in _compare("g", gpus):
        deviations, shares, procs = expected[c.index]
        assert dict(c.deviations) == deviations
        assert dict(c.peer_reason_shares) == shares
        assert c.peer_processes == procs and type(c.peer_processes) is type(procs)
