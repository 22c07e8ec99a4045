"""On a real GPU host (``-m gpu``): the built-in pack on real snapshots.

A healthy GPU, idle or busy, must not page: no lost GPU, NVML down or PCIe alert from an idle
GPU lowering its link speed. Prints what is active so a real fault on the host is visible."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpumon.alerts.config import parse
from gpumon.alerts.service import AlertService
from gpumon.backends.factory import make_backend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.registry import MetricsOf

pytestmark = pytest.mark.gpu


def test_builtin_pack_on_real_snapshots(tmp_path: Path) -> None:
    config, problems = parse(None)
    assert config is not None, problems
    backend = make_backend("nvml")
    service = AlertService(config, tmp_path, host="gpu-test")
    store = SnapshotStore()
    store.subscribe(service.on_snapshot)
    poller = Poller(backend, store)
    costs = []
    try:
        for _ in range(5):
            snapshot = poller.poll()
            assert snapshot.nvml_up, snapshot.nvml_error
            start = time.perf_counter()
            service.on_snapshot(snapshot)
            costs.append(time.perf_counter() - start)
            time.sleep(0.2)
    finally:
        backend.shutdown()
    active = service.active_alerts()
    for a in active:
        print(f"active: {a['alertname']} gpu {a['gpu']} {a['state']}: {a['annotations'].get('summary')}")
    print(f"on_snapshot cost: median {sorted(costs)[len(costs) // 2] * 1e6:.0f} µs for {len(snapshot.gpus)} GPU(s)")
    names = {a["alertname"] for a in active}
    assert not names & {"GpuLost", "GpuNvmlDown", "GpuSnapshotStale", "GpuPcieLinkDegraded"}, active
    registry = CollectorRegistry()
    registry.register(MetricsOf(service.collector()))
    assert "gpumon_alert_evaluation_errors_total 0.0" in generate_latest(registry).decode()
