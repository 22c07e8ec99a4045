"""``gpumon health`` without a daemon: poll the GPUs here once (bounded in time), add what the state
directory remembers, and judge."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path

from gpumon.backends.base import GpuBackend
from gpumon.backends.factory import simulated_spec
from gpumon.config.file import Config
from gpumon.health.config import HealthConfig
from gpumon.health.service import HealthService
from gpumon.model.findings import CRITICAL, Finding, HealthReport
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid import XidEvent

log = logging.getLogger("gpumon")


class CannotJudge(Exception):
    """gpumon cannot say whether the node may take work; the message is the reason, one line."""


class BackendProblem(Exception):
    """The backend cannot be built (a bad scenario file)."""


def local_report(
    config: Config,
    state_dir: Path,
    *,
    kernel_log: bool = True,
    budget_seconds: float | None = None,
    tick: int | None = None,
) -> HealthReport:
    """Poll the GPUs once here, add what the state directory remembers, and judge. With ``budget_seconds``
    below ``poll_timeout_seconds`` (the prolog), a poll cut short by the budget is CannotJudge, not CRITICAL.
    A scenario (``--backend fake:NAME``) is played to ``tick`` (None: its last scripted event;
    gpumon.backends.play)."""
    from gpumon.backends.base import ScenarioError
    from gpumon.backends.factory import make_backend
    from gpumon.events.tracker import XidTracker
    from gpumon.model.xid_catalog import XidCatalog

    try:
        backend = make_backend(config.backend, config.fake_gpus)
    except ScenarioError as exc:
        raise BackendProblem(str(exc)) from exc
    service = HealthService(
        state_dir,
        XidCatalog.load(config.xid_catalog),
        (config.health or HealthConfig()),
        simulated=simulated_spec(config.backend) or False,  # the scenario's own state, as the daemon's
    )
    poll_timeout = (config.health or HealthConfig()).poll_timeout_seconds
    timeout = poll_timeout if budget_seconds is None else max(0.0, min(poll_timeout, budget_seconds))
    from gpumon.backends.play import tick_to_show

    snapshot = poll_within(backend, timeout, tick_to_show(backend, tick))
    if snapshot is None and timeout < poll_timeout:
        raise CannotJudge(
            f"the GPUs did not answer within the prolog's {timeout:.1f} s (health.slurm.prolog_timeout_seconds)"
        )
    if snapshot is None:  # a call into the driver hangs: a GPU fallen off the bus, typically
        return service.report(source="local", extra=[poll_hung(poll_timeout)])
    service.on_snapshot(snapshot)
    tracker = XidTracker(live_since_seconds=time.time(), logger=logging.getLogger("gpumon.xid"))
    tracker.set_gpus_from_snapshot(snapshot)
    tracker.subscribe(service.on_xid)
    if snapshot.nvml_up and backend.simulated:  # scripted XIDs; real ones come from the kernel log
        try:
            for event in scripted_records(backend.wait_events(0.0)):
                tracker.record(event)
        except Exception:
            log.debug("no simulated XID events", exc_info=True)
    if kernel_log and config.kernel_log and not backend.simulated:
        from gpumon.events.kernel_log import read_boot_xids

        tracker.record_all(read_boot_xids(logger=logging.getLogger("gpumon.kmsg")).events)
    try:
        backend.shutdown()
    except Exception:
        log.debug("backend shutdown failed", exc_info=True)
    return service.report(source="local")


def scripted_records(events: list[XidEvent]) -> list[XidEvent]:
    """A scenario's scripted XIDs as one-shot runs replay them: the n-th of each GPU named like a kernel-log
    record (``kernel_usec`` n, this boot), so the same scenario played again over the same state directory
    counts each of them once, as a restarted daemon counts the kernel log's (not again each run)."""
    nth: dict[int | None, int] = {}
    out = []
    for event in events:
        nth[event.gpu_index] = nth.get(event.gpu_index, 0) + 1
        out.append(dataclasses.replace(event, kernel_usec=nth[event.gpu_index]))
    return out


def poll_within(backend: GpuBackend, timeout_seconds: float, tick: int | None = None) -> Snapshot | None:
    """One poll (a scenario: played to ``tick``), or None when it does not finish in time (the stuck
    thread is left behind, a daemon thread)."""
    from gpumon.backends.play import PlayClock, play
    from gpumon.collect.poller import Poller
    from gpumon.collect.store import SnapshotStore

    result: list[Snapshot] = []
    clock = PlayClock()  # a scenario without NVML at first is played until its GPUs appear
    thread = threading.Thread(
        target=lambda: result.append(play(Poller(backend, SnapshotStore(), monotonic=clock).poll, tick, clock)),
        name="gpumon-health-poll",
        daemon=True,
    )
    thread.start()
    thread.join(timeout_seconds)
    return result[0] if result else None


def poll_hung(timeout_seconds: float) -> Finding:
    return Finding(
        kind="nvml_hang",
        severity=CRITICAL,
        action="reboot_node",
        summary=f"the NVIDIA driver did not answer within {timeout_seconds:g} s (a GPU may have fallen off the bus)",
        evidence={"timeout_seconds": timeout_seconds},
    )
