"""`--long`: the soak's settle times and throttle onset, and the power steps (pulse) that name a GPU whose
clocks or results misbehave on a step."""

from __future__ import annotations

from typing import Any

from gpumon.burn.orchestration.soak import settle_report
from gpumon.burn.orchestration.watcher import Sample
from gpumon.burn.verdict.judge_soak import judge_pulse, report_settle
from gpumon.burn.verdict.judgement import Judgement
from gpumon.burn.verdict.thresholds import Thresholds
from tests.burn.conftest import CPU


def _soak(seconds: int, throttle_at: int) -> list[Sample]:
    """Clocks 1980 MHz until ``throttle_at``, then 1755 under the power cap; power ramps to 700 W in 5 s."""
    return [
        Sample(
            t=100.0 + t,
            test="matmul",
            temperature_celsius=min(40.0 + 2 * t, 70.0),
            memory_temperature_celsius=None,
            power_watts=min(140.0 * (t + 1), 700.0),
            sm_clock_hertz=1980e6 if t < throttle_at else 1755e6,
            clock_events=frozenset({"sw_power_cap"}) if t >= throttle_at else frozenset(),
        )
        for t in range(seconds)
    ]


def test_the_soak_reports_when_clocks_power_and_temperature_settle_and_when_throttling_began():
    settle = settle_report(_soak(60, throttle_at=20))
    assert settle["throttle_onset"] == {"reason": ["sw_power_cap"], "at_seconds": 20.0}
    assert settle["sm_clock_hertz"] == {"settled_after_seconds": 20.0, "level": 1755e6}
    assert settle["power_watts"]["settled_after_seconds"] == 4.0
    assert settle["temperature_celsius"]["settled_after_seconds"] == 14.0  # 68 °C: within 2 of 70
    j = Judgement()
    j.gpus[(0, 0)] = {"node": 0, "gpu": 0, "tests": {}}
    report_settle(j, (0, 0), {"settle": settle})
    (line,) = [c["detail"] for c in j.checks]
    assert "SM clock settled after 20 s at 1755 MHz" in line and "throttling from 20 s (sw_power_cap)" in line


def _pulse(rates: list[float], changed: list[int] | None = None) -> dict[str, Any]:
    return {
        "model": "NVIDIA H200",
        "cycles": len(rates),
        "on_seconds": 2.0,
        "off_seconds": 1.5,
        "tflops_phases": rates,
        "tflops_median": sorted(rates)[len(rates) // 2],
        "changed_phases": changed or [],
    }


def test_a_gpu_whose_clocks_do_not_keep_up_with_a_step_or_whose_result_changes_is_named():
    j = Judgement()
    for g in range(3):
        j.gpus[(0, g)] = {"node": 0, "gpu": g, "uuid": f"GPU-{g}", "tests": {}}
    steady = [660.0] * 10
    judge_pulse(
        j,
        {(0, 0): _pulse(steady), (0, 1): _pulse([660.0] * 9 + [420.0]), (0, 2): _pulse(steady, changed=[4])},
        Thresholds(),
    )
    assert j.faults[0].startswith("GPU 1 (GPU-1): pulse:") and "step 10 ran 36% below" in j.faults[0]
    assert j.faults[1].startswith("GPU 2 (GPU-2): pulse: output changed on steps 5")
    assert len(j.faults) == 2


def test_long_runs_the_power_steps_and_quick_long_is_a_usage_error(burn):
    r = burn([*CPU, "--gpus", "0,1", "--long", "--tests", "pulse"], env={"GPUMON_BURN_INJECT": "corrupt:1"})
    assert r.code == 1, r.out + r.err
    assert [g["tests"]["pulse"] for g in r.report["gpus"]] == [True, False]
    assert "silent data corruption under power steps" in r.report["faults"][0]
    assert r.report["options"]["long"] is True
    both = burn(["--device", "cpu", "--quick", "--long"])
    assert both.code == 2 and "--quick and --long" in both.err
