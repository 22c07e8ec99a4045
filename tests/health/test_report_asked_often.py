"""The health report and series the daemon serves are those of a health service fed the same and asked once.

The daemon's health service keeps what it worked out (each engine's window as it slides, the findings of
unchanged increases, the report itself with the stamps of the files it read) and is asked all the time: the
alert tick every 5 s, each scrape, ``/api/health``. Over random sequences of polls (GPUs busy or idle, one
slower, GPM counters stuck or moving, corrected ECC errors rising, a process stuck in D state, a GPU lost),
XIDs and operator clears, what it answers after each one (verdict, findings, straggler deviations, error
trend increases) is what a new service fed the same inputs and asked once answers: nothing it kept between
questions shows. (An operator clear is a file, applied when a report reads it: the new service reads each
one as soon as it lands, as the daemon here does.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumon.health.clears import Clear, add_clear
from gpumon.health.config import HealthConfig
from gpumon.health.service import HealthService
from gpumon.health.stragglers import StragglerConfig
from gpumon.health.trends import TrendRule, TrendsConfig
from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, ProcessSnapshot, Snapshot
from gpumon.model.xid import XidEvent
from gpumon.model.xid_catalog import XidCatalog

T0 = 1_800_000_000.0
CATALOG = XidCatalog.load()

gpu_state = st.fixed_dictionaries(
    {
        "busy": st.booleans(),
        "slow": st.booleans(),
        "gpm": st.sampled_from(["moving", "zero", "none"]),
        "ecc_rise": st.sampled_from([0, 0, 3, 40]),
        "stuck_process": st.sampled_from([False, False, True]),
        "lost": st.sampled_from([False, False, False, True]),
    }
)
event = st.one_of(
    st.none(),
    st.none(),
    st.tuples(st.just("xid"), st.integers(0, 2), st.sampled_from([13, 31, 79, 94])),
    st.tuples(st.just("clear"), st.integers(0, 2), st.just(0)),
)
step = st.tuples(
    st.sampled_from([1.0, 30.0, 30.0, 30.0]),  # seconds since the step before
    st.one_of(st.just({}), st.just({}), st.dictionaries(st.integers(0, 2), gpu_state, max_size=2)),  # GPUs that change
    event,
)


def config(root: Path) -> HealthConfig:
    return HealthConfig(
        boot_id_path=root / "boot_id",
        sysfs_root=root / "no-sys",
        stuck_process_seconds=20.0,
        stragglers=StragglerConfig(window_seconds=40.0),
        trends=TrendsConfig(rules={"ecc_corrected": TrendRule(window_seconds=60.0, max_increase=30)}),
    )


def gpu_of(index: int, state: dict[str, Any], ecc: int, at: float) -> GpuSnapshot:
    if state["lost"]:
        return GpuSnapshot(index=index, uuid=f"GPU-{index}", up=False, lost_reason="fallen off the bus")
    moving = 0.3 + 0.1 * ((at // 1) % 5)
    gpm = {"moving": moving, "zero": 0.0, "none": None}[state["gpm"]]
    process = ProcessSnapshot(pid=100 + index, name="train", user="ada", state="D" if state["stuck_process"] else "R")
    return GpuSnapshot(
        index=index,
        uuid=f"GPU-{index}",
        up=True,
        name="NVIDIA H200",
        utilization_ratio=0.97 if state["busy"] else 0.05,
        clocks_hertz={"sm": (1.5e9 if state["slow"] else 1.98e9)},
        power_watts=600.0,
        power_limit_watts=700.0,
        sm_active_ratio=gpm,
        tensor_active_ratio=None if gpm is None else 0.0,
        ecc_errors_total={"corrected_volatile": ecc},
        energy_joules_total=1e6 + at,
        processes=(process,),
    )


class Inputs:
    """What the two services are fed, replayed step by step."""

    def __init__(self) -> None:
        self.at = T0
        calm = {"busy": True, "slow": False, "gpm": "moving", "ecc_rise": 0, "stuck_process": False, "lost": False}
        self.states: dict[int, dict[str, Any]] = {0: calm, 1: calm, 2: {**calm, "gpm": "zero"}}
        self.ecc = dict.fromkeys(range(3), 0)

    def advance(self, seconds: float, changes: dict[int, dict[str, Any]]) -> Snapshot:
        self.at += seconds
        self.states.update(changes)
        for index, state in self.states.items():
            self.ecc[index] += state["ecc_rise"]
        gpus = tuple(gpu_of(i, s, self.ecc[i], self.at) for i, s in sorted(self.states.items()))
        return Snapshot(
            timestamp_seconds=self.at,
            monotonic_seconds=self.at - T0,
            nvml_up=True,
            host=HostSnapshot(driver_version="580.1"),
            gpus=gpus,
        )


def feed(service: HealthService, root: Path, snapshot: Snapshot, happening: tuple[str, int, int] | None) -> None:
    service.on_snapshot(snapshot)
    happen(service, root, snapshot, happening)


def happen(service: HealthService, root: Path, snapshot: Snapshot, happening: tuple[str, int, int] | None) -> None:
    """An XID or an operator clear, stamped with the snapshot's time (or nothing)."""
    if happening is None:
        return
    what, gpu, code = happening
    if what == "xid":
        service.on_xid(
            XidEvent(
                xid=code, timestamp_seconds=snapshot.timestamp_seconds, source="nvml", gpu_index=gpu, uuid=f"GPU-{gpu}"
            )
        )
    else:
        add_clear(root, Clear(gpu=gpu, reason="fixed", at_seconds=snapshot.timestamp_seconds, user="ops"))


def answers(service: HealthService) -> tuple[object, ...]:
    report = service.current_report()
    deviations, increases = service.signals()
    return report.to_json(), deviations, increases


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=10, max_size=20))
def test_what_the_daemon_answers_after_each_input_is_what_a_service_asked_once_answers(
    tmp_path_factory: Any, steps: list[tuple[float, dict[int, dict[str, Any]], Any]]
) -> None:
    root = tmp_path_factory.mktemp("asked-often")
    clock = [T0]
    asked_often = HealthService(root, CATALOG, config(root), clock=lambda: clock[0], monotonic=lambda: clock[0] - T0)
    inputs = Inputs()
    fed: list[tuple[Snapshot, Any]] = []
    for seconds, changes, happening in steps:
        snapshot = inputs.advance(seconds, changes)
        clock[0] = snapshot.timestamp_seconds
        fed.append((snapshot, happening))
        asked_often.on_snapshot(snapshot)
        answers(asked_often)  # a scrape between the poll and the XID or clear: the same snapshot after them
        happen(asked_often, root, snapshot, happening)
        often = answers(asked_often)
        assert answers(asked_often) == often  # asked again at once: the same
        fresh_root = tmp_path_factory.mktemp("asked-once")
        asked_once = HealthService(
            fresh_root, CATALOG, config(fresh_root), clock=lambda: clock[0], monotonic=lambda: clock[0] - T0
        )
        for earlier, earlier_happening in fed:
            feed(asked_once, fresh_root, earlier, earlier_happening)
            if earlier_happening is not None and earlier_happening[0] == "clear":
                asked_once.report()  # a clear is applied when a report reads it: here as soon as it lands, as above
        assert often == answers(asked_once)
