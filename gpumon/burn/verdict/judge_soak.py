"""Rules for ``--long``: the power steps (``pulse``) and what the soak's telemetry says about settling.

pulse: each GPU's on-phases against each other (one more than ``straggler_fraction`` below the
median of its on-phases: its clocks or supply did not keep up with a step), its output the same
in every on-phase (an error on a step), and its median against its same-model peers. The soak's
settle times and throttle onset are reported (``telemetry/settle``): a throttle for a reason that
fails a GPU is already a ``telemetry/slowdown`` fault; here it gets its time.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from gpumon.burn.verdict.judgement import GpuKey, Judgement, peer_check
from gpumon.burn.verdict.thresholds import Thresholds


def judge_pulse(j: Judgement, res: Mapping[GpuKey, Any], th: Thresholds) -> None:
    for key, d in res.items():
        rates = d["tflops_phases"]
        med = statistics.median(rates)
        worst = min(range(len(rates)), key=lambda i: rates[i])
        steady = rates[worst] >= (1 - th.straggler_fraction) * med
        j.add(
            "pulse",
            key,
            "steps",
            steady,
            f"{d['cycles']} steps of {d['on_seconds']:g} s on, {d['off_seconds']:g} s off: on-phases "
            f"{_rate(min(rates))} to {_rate(max(rates))} (median {_rate(med)})"
            + (
                ""
                if steady
                else f"; step {worst + 1} ran {1 - rates[worst] / med:.0%} below the median: clocks or power "
                "did not keep up with the step"
            ),
            rates[worst] * 1e12,
            "flop_per_second",
            (1 - th.straggler_fraction) * med * 1e12,
        )
        changed = d["changed_phases"]
        j.add(
            "pulse",
            key,
            "bit_exact",
            not changed,
            f"output changed on steps {', '.join(str(i + 1) for i in changed)} given the same inputs: "
            "silent data corruption under power steps"
            if changed
            else "the same output on every step",
        )
    rates = {k: d["tflops_median"] * 1e12 for k, d in res.items()}
    group_of = {k: str(d["model"]) for k, d in res.items()}
    tera = bool(rates) and min(rates.values()) >= 1e12
    scale, label = (1e12, "TFLOP/s") if tera else (1e9, "GFLOP/s")
    peer_check(j, "pulse", "peers", rates, group_of, th.straggler_fraction, "flop_per_second", scale, label)


def _rate(tflops: float) -> str:
    return f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GFLOP/s"


def report_settle(j: Judgement, key: GpuKey, tel: Mapping[str, Any]) -> None:
    """One ``telemetry/settle`` line (not judged) when the soak gave enough samples."""
    settle = tel.get("settle") or {}
    if not settle:
        return
    parts = []
    for name, label, scale, unit in (
        ("sm_clock_hertz", "SM clock", 1e6, "MHz"),
        ("power_watts", "power", 1.0, "W"),
        ("temperature_celsius", "temperature", 1.0, "°C"),
    ):
        s = settle.get(name)
        if s:
            parts.append(f"{label} settled after {s['settled_after_seconds']:.0f} s at {s['level'] / scale:.0f} {unit}")
    onset = settle.get("throttle_onset")
    parts.append(
        f"throttling from {onset['at_seconds']:.0f} s ({', '.join(onset['reason'])})" if onset else "no throttling"
    )
    pulse = tel.get("pulse") or {}
    if pulse.get("power_max_watts") is not None:
        parts.append(f"power steps {pulse['power_min_watts']:.0f}-{pulse['power_max_watts']:.0f} W")
    j.add("telemetry", key, "settle", None, f"soak of {settle['soak_seconds']:.0f} s: " + "; ".join(parts))
