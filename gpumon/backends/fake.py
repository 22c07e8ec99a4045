"""Simulated GPUs, used only when asked for (``--backend fake`` / ``fake:NAME`` / ``fake:PATH``).

Two sources of data:

* ``FakeBackend.plausible(n)``: n H200-like GPUs whose load, temperature, power and
  clocks move smoothly over time, for trying gpumon on a machine without GPUs.
* ``FakeBackend.from_file(path)``: a YAML scenario (see ``docs/scenarios.md``) that
  gives values per GPU and field over ticks and injects faults: fields not supported,
  a GPU lost at tick k, NVML missing for the first n initialisations, a read that
  hangs, a read that raises.

A GPU's tick is the number of FAST reads of that GPU so far, starting at 0; a value
list is indexed by tick and its last element repeats.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumon.backends.base import GpuLostError, NvmlUnavailableError, ScenarioError
from gpumon.backends.fake_physics import energy_over_time, scenario_values
from gpumon.backends.scenario import read_scenario, scenario_problems
from gpumon.model.fields.spec import NO_FAKE
from gpumon.model.nvml_vocabulary import CLOCK_EVENT_BITS
from gpumon.model.snapshot import HostSnapshot, P2pStatus, ProcessSnapshot, Tier, field_specs, field_tier
from gpumon.model.xid import XidEvent

MIB = 1024 * 1024

CLOCK_EVENT_REASONS = tuple(CLOCK_EVENT_BITS)

__all__ = ["FakeBackend", "FakeGpuScript", "ScenarioError"]


@dataclass(frozen=True)
class FakeGpuScript:
    """How one simulated GPU behaves."""

    uuid: str
    values: Mapping[str, Any]
    """Field name -> constant value, or list of values by tick (last repeats), or a callable(tick)."""
    unsupported: frozenset[str] = frozenset()
    lost_at_tick: int | None = None
    lost_reason: str = "GPU is lost"
    hang_at_tick: int | None = None
    hang_seconds: float = 3600.0
    raise_at_ticks: frozenset[int] = frozenset()
    xid_events: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """Tick -> XID codes emitted once this GPU has been read at that tick."""


@dataclass
class FakeBackend:
    """A GpuBackend that plays scripted or generated GPU readings."""

    scripts: Sequence[FakeGpuScript]
    nvml_missing_inits: int = 0
    driver_version: str = "580.159.04"
    cuda_driver_version: str = "13.0"
    name: str = "fake"
    _init_calls: int = 0
    _ticks: dict[int, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _events_sent: set[tuple[int, int]] = field(default_factory=set)
    _events_ready: threading.Condition = field(default_factory=threading.Condition)
    _plans: dict[tuple[int, Tier], tuple[tuple[str, Any, bool], ...]] = field(default_factory=dict)
    """(GPU, tier) -> what a read of it gives, made on its first read (see ``_read_plan``)."""

    # ---- construction -------------------------------------------------
    @classmethod
    def plausible(cls, count: int, clock: Callable[[], float] | None = None) -> FakeBackend:
        """``count`` H200-like GPUs with values that move with ``clock()`` seconds."""
        return cls(scripts=[_plausible_script(i, count, clock) for i in range(count)])

    @classmethod
    def from_file(cls, path: str | Path) -> FakeBackend:
        """Play the scenario file ``path``; raises ScenarioError listing every problem in it."""
        return cls.from_mapping(read_scenario(path), source=str(path))

    @classmethod
    def from_mapping(cls, raw: Any, source: str = "scenario") -> FakeBackend:
        """Play a scenario mapping; raises ScenarioError listing every problem in it."""
        problems = scenario_problems(raw, source)
        if problems:
            raise ScenarioError(problems)
        base_values = dict(raw.get("base") or {})
        gpus_raw = raw.get("gpus")
        if gpus_raw is None:
            gpus_raw = [{} for _ in range(int(raw.get("count") or 0))]
        scripts = []
        for i, g in enumerate(gpus_raw):
            g = g or {}
            values = scenario_values(_static_defaults(i, len(gpus_raw)), base_values, g.get("values") or {})
            scripts.append(
                FakeGpuScript(
                    uuid=str(g.get("uuid") or _uuid(i)),
                    values=values,
                    unsupported=frozenset(g.get("unsupported") or ()),
                    lost_at_tick=_tick(g.get("lost_at_tick")),
                    lost_reason=str(g.get("lost_reason") or "GPU is lost"),
                    hang_at_tick=_tick(g.get("hang_at_tick")),
                    hang_seconds=3600.0 if g.get("hang_seconds") is None else float(g["hang_seconds"]),
                    raise_at_ticks=frozenset(int(t) for t in g.get("raise_at_ticks") or ()),
                    xid_events=_parse_xid_events(g.get("xid_events")),
                )
            )
        return cls(
            scripts=scripts,
            nvml_missing_inits=int(raw.get("nvml_missing_inits") or 0),
            driver_version=str(raw.get("driver_version") or "580.159.04"),
            cuda_driver_version=str(raw.get("cuda_driver_version") or "13.0"),
        )

    # ---- GpuBackend ---------------------------------------------------
    def init(self) -> None:
        self._init_calls += 1
        if self._init_calls <= self.nvml_missing_inits:
            raise NvmlUnavailableError("NVML Shared Library Not Found (simulated)")
        self._stop.clear()

    def shutdown(self) -> None:
        self._stop.set()
        with self._events_ready:  # an event wait in progress ends now, not at its timeout
            self._events_ready.notify_all()

    def device_count(self) -> int:
        return len(self.scripts)

    def uuid(self, index: int) -> str:
        return self.scripts[index].uuid

    def host(self) -> HostSnapshot:
        return HostSnapshot(
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version,
            nvml_version="13." + self.driver_version,
            simulated=True,
        )

    def last_scripted_tick(self) -> int:
        """The tick of the scenario's last scripted change (a value list's last entry, a GPU lost, a
        read that raises, an XID), where its faults have all happened; 0 when nothing changes. A
        scripted hang is left out, and so is everything from the first hang on: a one-shot poll
        (``gpumon once``, ``gpumon health``) would wait for it (``gpumon run`` plays it)."""
        last = 0
        for script in self.scripts:
            ticks = [t for t in (script.lost_at_tick,) if t is not None]
            ticks += list(script.raise_at_ticks) + list(script.xid_events)
            ticks += [
                len(v) - 1
                for name, v in script.values.items()
                if isinstance(v, list) and name not in ("processes", "p2p_status")
            ]
            last = max([last, *ticks])
        hangs = [s.hang_at_tick for s in self.scripts if s.hang_at_tick is not None]
        return min([last, *(t - 1 for t in hangs)]) if hangs else last

    def tick(self, index: int) -> int:
        """The tick the next FAST read of GPU ``index`` will play."""
        return self._ticks.get(index, 0)

    def read(self, index: int, tier: Tier) -> Mapping[str, Any]:
        script = self.scripts[index]
        tick = self._ticks.get(index, 0)
        if tier is Tier.FAST:
            self._ticks[index] = tick + 1
            if script.xid_events:
                with self._events_ready:
                    self._events_ready.notify_all()
            if script.hang_at_tick is not None and tick == script.hang_at_tick:
                self._stop.wait(script.hang_seconds)
            if tick in script.raise_at_ticks:
                raise RuntimeError(f"simulated NVML failure on GPU {index} at tick {tick}")
        if script.lost_at_tick is not None and tick >= script.lost_at_tick:
            raise GpuLostError(index, script.lost_reason)
        plan = self._plans.get((index, tier))
        if plan is None:
            plan = self._plans[(index, tier)] = _read_plan(script, tier)
        return {name: _value_at(name, spec, tick) if moving else spec for name, spec, moving in plan}

    simulated = True
    """Made-up GPUs: nothing of this host's (kernel log, /sys, CUDA's UUIDs) is theirs."""
    per_reader_errors = False

    def take_errors(self) -> dict[str, int]:
        """None: a scripted read fails whole (``raise_at_ticks``), which the poller counts itself."""
        return {}

    def read_errors(self) -> dict[tuple[int, str, str], int]:
        """None: no simulated reader fails alone."""
        return {}

    def wait_events(self, timeout_seconds: float) -> list[XidEvent]:
        """Scripted XIDs whose tick a FAST read has reached, each delivered once."""
        with self._events_ready:
            events = self._due_events(time.time())
            if not events:
                self._events_ready.wait(timeout_seconds)
                events = self._due_events(time.time())
        return events

    def _due_events(self, now: float) -> list[XidEvent]:
        out: list[XidEvent] = []
        for index, script in enumerate(self.scripts):
            reached = self._ticks.get(index, 0)
            for tick, codes in sorted(script.xid_events.items()):
                if tick < reached and (index, tick) not in self._events_sent:
                    self._events_sent.add((index, tick))
                    out.extend(
                        XidEvent(
                            xid=code,
                            timestamp_seconds=now,
                            source="nvml",
                            gpu_index=index,
                            uuid=script.uuid,
                            pci_bus_id=str(script.values.get("pci_bus_id", "")) or None,
                            message=f"simulated Xid {code}",
                        )
                        for code in codes
                    )
        return out


# ---- helpers ------------------------------------------------------------
def _parse_xid_events(raw: Any) -> dict[int, tuple[int, ...]]:
    """``[{tick: 3, xid: 79}, {tick: 5, xid: [13, 13]}]`` -> {3: (79,), 5: (13, 13)} (checked by scenario_problems)."""
    out: dict[int, tuple[int, ...]] = {}
    for item in raw or ():
        codes = item["xid"] if isinstance(item["xid"], list) else [item["xid"]]
        tick = int(item["tick"])
        out[tick] = out.get(tick, ()) + tuple(int(c) for c in codes)
    return out


def _tick(value: Any) -> int | None:
    return None if value is None else int(value)


def _uuid(i: int) -> str:
    return f"GPU-fa4e{i:04x}-0000-4000-8000-{i:012x}"


def _read_plan(script: FakeGpuScript, tier: Tier) -> tuple[tuple[str, Any, bool], ...]:
    """The fields a read of ``tier`` gives, in the script's order, each ``(name, spec, moving)``.

    A value that moves (a callable of the tick, a list by tick) is worked out at each read; a constant
    is coerced once, here, and every read gives that same object (the poller and the exporter never
    change a read's values). Unsupported fields are left out.
    """
    plan = []
    for name, spec in script.values.items():
        if name in script.unsupported or field_tier(name) is not tier:
            continue
        moving = callable(spec) or (isinstance(spec, list) and name not in ("processes", "p2p_status"))
        plan.append((name, spec if moving else _coerce(name, spec), moving))
    return tuple(plan)


def _value_at(name: str, spec: Any, tick: int) -> Any:
    if callable(spec):
        value = spec(tick)
    elif isinstance(spec, list) and name not in ("processes", "p2p_status"):
        value = spec[min(tick, len(spec) - 1)] if spec else None
    else:
        value = spec
    return _coerce(name, value)


def _coerce(name: str, value: Any) -> Any:
    if name == "processes" and value is not None:
        return tuple(p if isinstance(p, ProcessSnapshot) else ProcessSnapshot(**p) for p in value)
    if name == "p2p_status" and value is not None:
        return tuple(p if isinstance(p, P2pStatus) else P2pStatus(**p) for p in value)
    if isinstance(value, dict):
        return {str(k): (_coerce("", v) if isinstance(v, dict) else v) for k, v in value.items()}
    return value


NVLINK_DOMAIN_GPUS = 8
"""Simulated hosts are HGX boards: GPUs are NVLink peers within groups of 8, as on a real 8-GPU host."""


def _static_defaults(i: int, count: int) -> dict[str, Any]:
    """An H200 SXM at rest, the same for every tick: each field's declared ``fake=`` value
    (gpumon/model/fields/), plus the identity and topology that depend on the GPU's index."""
    first = i - i % NVLINK_DOMAIN_GPUS
    peers = [p for p in range(first, min(count, first + NVLINK_DOMAIN_GPUS)) if p != i]
    values = {name: copy.deepcopy(spec.fake) for name, spec in field_specs() if spec.fake is not NO_FAKE}
    values.update(
        {
            "pci_bus_id": f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            "serial": f"165002401{i:04d}",
            "minor_number": i,
            "p2p_status": tuple(
                P2pStatus(peer_index=p, capability=c, ok=True)
                for p in peers
                for c in ("read", "write", "nvlink", "atomics")
            ),
            "topology_level": {str(p): "nvlink" for p in peers},
            "clock_events_active": {r: r == "gpu_idle" for r in CLOCK_EVENT_REASONS},
        }
    )
    return values


def _whole_mhz(hertz: float) -> float:
    """Clocks come from NVML in whole MHz: round a computed clock to that, in Hz."""
    return float(round(hertz / 1e6) * 1_000_000)


def _plausible_script(i: int, count: int, clock: Callable[[], float] | None) -> FakeGpuScript:
    """Values that follow a slow sine per GPU: a job ramps up and down every few minutes."""
    now = clock or time.time
    load = _load_curve(i, now)
    values: dict[str, Any] = dict(_static_defaults(i, count))
    values.update(_device_values(i, load, now))
    values.update(_profiling_values(load))
    return FakeGpuScript(uuid=_uuid(i), values=values)


def _load_curve(i: int, now: Callable[[], float]) -> Callable[[int], float]:
    """GPU ``i``'s load 0-1 at a tick: a sine of the clock (seconds), phase-shifted per GPU."""
    latest: dict[int, float] = {}

    def load(tick: int) -> float:
        """The GPU's load at ``tick``, worked out at the first value of the tick that needs it (so the
        values of one read agree, and a read works out one sine, not one per field)."""
        value = latest.get(tick)
        if value is None:
            value = max(0.0, min(1.0, 0.5 + 0.5 * math.sin(now() / 40.0 + i * 1.3)))
            latest.clear()
            latest[tick] = value
        return value

    return load


def _device_values(i: int, load: Callable[[int], float], now: Callable[[], float]) -> dict[str, Any]:
    """Utilization, memory, temperatures, power, energy (integrated), clocks and the process, following ``load``."""
    total, reserved = 143771 * MIB, 550 * MIB  # an H200's framebuffer, and what its driver reserves

    def used(tick: int) -> int:
        return int(2 * 1024 * MIB + load(tick) * 100 * 1024 * MIB)

    def power(tick: int) -> float:
        return round(75 + 600 * load(tick), 1)

    return {
        "utilization_ratio": lambda t: round(load(t), 2),
        "memory_bandwidth_utilization_ratio": lambda t: round(load(t) * 0.6, 2),
        "memory_used_bytes": used,
        "memory_free_bytes": lambda t: total - reserved - used(t),
        "temperature_celsius": lambda t: round(32 + 38 * load(t)),
        "memory_temperature_celsius": lambda t: round(38 + 30 * load(t)),
        "power_watts": power,
        "energy_joules_total": energy_over_time(power, now),  # the power, integrated (fake_physics)
        "clocks_hertz": lambda t: {
            "sm": _whole_mhz(345e6 + load(t) * (1980e6 - 345e6)),
            "memory": 3201e6,
            "graphics": _whole_mhz(345e6 + load(t) * (1980e6 - 345e6)),
        },
        "clock_events_active": lambda t: {
            r: (r == "gpu_idle" and load(t) < 0.05) or (r == "sw_power_cap" and load(t) > 0.95)
            for r in CLOCK_EVENT_REASONS
        },
        "processes": lambda t: (
            (ProcessSnapshot(pid=4242 + i, used_memory_bytes=used(t), name="python3", user="train"),)
            if load(t) > 0.05
            else ()
        ),
    }


def _profiling_values(load: Callable[[int], float]) -> dict[str, Any]:
    """GPM profiling as a Hopper GPU reports it, following ``load`` (so the profiling and DCGM tensor panels show data)."""
    return {
        "sm_active_ratio": lambda t: round(0.95 * load(t), 3),
        "sm_occupancy_ratio": lambda t: round(0.45 * load(t), 3),
        "tensor_active_ratio": lambda t: round(0.7 * load(t), 3),
        "dram_active_ratio": lambda t: round(0.55 * load(t), 3),
        "fp16_active_ratio": lambda t: round(0.6 * load(t), 3),
        "fp32_active_ratio": lambda t: round(0.08 * load(t), 3),
        "fp64_active_ratio": lambda _t: 0.0,
        "graphics_active_ratio": lambda t: round(0.97 * load(t), 3),
        "gpm_throughput_bytes_per_second": lambda t: {
            "nvlink_tx": round(120e9 * load(t)),
            "nvlink_rx": round(118e9 * load(t)),
            "pcie_tx": round(2e9 * load(t)),
            "pcie_rx": round(6e9 * load(t)),
        },
    }
