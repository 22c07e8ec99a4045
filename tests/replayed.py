"""Recordings of real hosts (tests/data/recordings, made with ``gpumon record``) replayed for the tests.

Each recording is replayed through gpumon's own NVML backend (``--backend replay:``), polled twice
with frozen clocks (the second poll has GPM's figures, which need two samples), and turned into
what users see: the snapshot of ``gpumon once --json`` and the /metrics bodies (plain, OpenMetrics,
each DCGM compat set). Their golden files are in tests/data/recordings/golden; ``make golden``
writes them again (``python -c "from tests.replayed import write_goldens; write_goldens()"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpumon.backends.replay import ReplayBackend, replay_backend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.dcgm import DcgmCompatCollector
from gpumon.exposition.openmetrics import render as render_openmetrics
from gpumon.exposition.text import render as render_text
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import to_jsonable
from gpumon.model.xid_catalog import XidCatalog
from tests.helpers import DATA

RECORDINGS = DATA / "recordings"
GOLDEN = RECORDINGS / "golden"
HOST_FIGURES = {"cpu_utilization_ratio": 0.25, "memory_used_bytes": 8 << 30, "memory_total_bytes": 64 << 30}
WALL_AT_START = 1_700_000_000.0
COMPAT_SETS = ("dcgm", "dcgm-4.9")
"""The --compat name sets: dcgm-exporter <= 4.8's names and 4.9's (``--compat dcgm,dcgm-4.9`` serves both)."""


def recordings() -> list[Path]:
    """Every recording in the repository (not the nvidia-smi facts beside them)."""
    return sorted(p for p in RECORDINGS.glob("*.json") if not p.name.endswith(".nvidia-smi.json"))


def nvidia_smi_facts(recording: Path) -> dict[str, Any]:
    """What nvidia-smi -q -x said just before and after the recording (tests/gpu/nvidia_smi_facts.py)."""
    data: dict[str, Any] = json.loads(recording.with_suffix(".nvidia-smi.json").read_text())
    return data


def replayed_store(recording: Path, polls: int = 2) -> tuple[SnapshotStore, ReplayBackend]:
    """The store after ``polls`` polls (every tier each, one second apart, frozen clocks) of the replay."""
    store = SnapshotStore()
    now = [100.0]
    backend = replay_backend(recording, clock=lambda: now[0])
    poller = Poller(
        backend,
        store,
        PollIntervals(1.0, 1.0, 1.0),
        wall_clock=lambda: WALL_AT_START + now[0],
        monotonic=lambda: now[0],
        host_figures=lambda: HOST_FIGURES,
    )
    for _ in range(polls):
        poller.poll()
        now[0] += 1.0
    backend.shutdown()
    return store, backend


def snapshot_json(recording: Path, polls: int = 2) -> dict[str, Any]:
    """``gpumon once --json`` of the replay (frozen clocks; no process names: those are the host's /proc)."""
    store, _ = replayed_store(recording, polls)
    snapshot = store.latest()
    assert snapshot is not None
    data: dict[str, Any] = to_jsonable(snapshot)
    return data


def expositions(recording: Path) -> dict[str, str]:
    """Every /metrics body of the replay by golden file suffix: metrics.txt (plain text), openmetrics.txt,
    and one per compat set (dcgm.txt, ...)."""
    store, _ = replayed_store(recording)
    collector = GpumonCollector(
        store, PollIntervals(), monotonic=lambda: 102.0, processes=True, version="0.0.0", python_version="3"
    )
    out = {
        "metrics.txt": collector.render().decode(),
        "openmetrics.txt": collector.render_openmetrics().decode(),
    }
    for name in COMPAT_SETS:
        out[f"{name}.txt"] = compat_exposition(store, (name,))
    return out


def compat_exposition(store: SnapshotStore, sets: tuple[str, ...], openmetrics: bool = False) -> str:
    """The DCGM compat families of ``store``'s snapshot for ``--compat`` ``sets``, as text or OpenMetrics."""
    families = list(DcgmCompatCollector(store, "node-1", XidCatalog.load(), sets=sets).families())
    return render_openmetrics(families).decode() if openmetrics else render_text(families)


def golden_path(recording: Path, suffix: str) -> Path:
    return GOLDEN / f"{recording.stem}.{suffix}"


def write_goldens() -> None:
    """Write every recording's golden files (after a deliberate change of what users see)."""
    GOLDEN.mkdir(exist_ok=True)
    for recording in recordings():
        golden_path(recording, "once.json").write_text(
            json.dumps(snapshot_json(recording), indent=1, sort_keys=True) + "\n"
        )
        for suffix, text in expositions(recording).items():
            golden_path(recording, suffix).write_text(text)
