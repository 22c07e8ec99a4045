"""Energy per owner (gpumon/collect/energy.py): a Slurm job's (pod's, unit's) joules are the energy its
GPUs' counters report while its processes hold them; a GPU shared by two jobs splits by SM time
share (equally without one); a finished job's series goes after the keep window and leaves a record
of its joules in the state directory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpumon.backends.fake import FakeBackend
from gpumon.collect import energy
from gpumon.collect.energy import OwnerEnergy, shares
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.config.file import Config
from gpumon.daemon import Daemon
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import ProcessSnapshot, Snapshot
from tests.alerts.helpers import gpu, snap
from tests.helpers import value, wait_for


def _job(job: str, pid: int = 10, sm: float | None = None) -> ProcessSnapshot:
    return ProcessSnapshot(pid=pid, slurm_job_id=job, sm_utilization_ratio=sm)


def test_a_jobs_counter_is_the_energy_its_simulated_gpus_report_over_the_job(tmp_path: Path) -> None:
    """Two simulated GPUs, energy by tick; job 42 alone on GPU 0, job 42 (75 % of SM time) and job 43
    (25 %) on GPU 1. The poller reads energy every other poll (slow tier), processes every poll."""
    energy0 = [1000.0 + 350.0 * t + (t % 3) * 7 for t in range(40)]
    energy1 = [5000.0 + 610.0 * t for t in range(40)]
    scenario = {
        "gpus": [
            {"values": {"energy_joules_total": energy0, "processes": [{"pid": 10, "slurm_job_id": "42"}]}},
            {
                "values": {
                    "energy_joules_total": energy1,
                    "processes": [
                        {"pid": 11, "slurm_job_id": "42", "sm_utilization_ratio": 0.6},
                        {"pid": 12, "slurm_job_id": "43", "sm_utilization_ratio": 0.2},
                    ],
                }
            },
        ]
    }
    backend = FakeBackend.from_mapping(scenario)
    backend.init()
    now = [1000.0]
    store = SnapshotStore()
    energy = OwnerEnergy(tmp_path)
    store.subscribe(energy.on_snapshot)
    seen: list[Snapshot] = []
    store.subscribe(seen.append)
    poller = Poller(backend, store, PollIntervals(1, 2, 100), monotonic=lambda: now[0], wall_clock=lambda: now[0])
    for _ in range(15):
        poller.poll()
        now[0] += 1.0
    reported = [[g.energy_joules_total for g in s.gpus] for s in seen]
    gpu0 = reported[-1][0] - reported[0][0]  # what the simulated GPUs report over the job
    gpu1 = reported[-1][1] - reported[0][1]
    assert gpu0 > 0 and gpu1 > 0
    assert abs((energy.joules("slurm_job", "42") or 0) - (gpu0 + 0.75 * gpu1)) < 1e-6
    assert abs((energy.joules("slurm_job", "43") or 0) - 0.25 * gpu1) < 1e-6
    text = "".join(f"{s}\n" for f in energy.families() for s in f.samples)
    assert "('slurm_job', '42')" in text


def test_a_shared_gpu_without_sm_shares_splits_equally_per_job_not_per_process() -> None:
    split = shares([_job("1", 1), _job("1", 2), _job("1", 3), _job("2", 4)])
    assert split == {("slurm_job", "1"): 0.5, ("slurm_job", "2"): 0.5}
    pod = ProcessSnapshot(pid=5, pod_uid="0b6f", systemd_unit="kubepods.slice")
    unit = ProcessSnapshot(pid=6, systemd_unit="trainer.service")
    assert set(shares([pod, unit])) == {("pod", "0b6f"), ("systemd_unit", "trainer.service")}


def test_idle_energy_and_a_counter_reset_are_billed_to_nobody() -> None:
    energy = OwnerEnergy("/nonexistent")
    energy.on_snapshot(snap(0, gpu(0, energy_joules_total=100.0, processes=())))
    energy.on_snapshot(snap(1, gpu(0, energy_joules_total=200.0, processes=(_job("7"),))))
    energy.on_snapshot(snap(2, gpu(0, energy_joules_total=300.0, processes=())))  # idle: nobody's
    energy.on_snapshot(snap(3, gpu(0, energy_joules_total=50.0, processes=(_job("7"),))))  # GPU reset
    energy.on_snapshot(snap(4, gpu(0, energy_joules_total=80.0, processes=(_job("7"),))))
    assert energy.joules("slurm_job", "7") == 100.0 + 30.0


def test_a_finished_jobs_series_goes_after_the_keep_window_and_its_joules_stay_in_a_record(tmp_path: Path) -> None:
    energy = OwnerEnergy(tmp_path, keep_seconds=60)
    for t in range(5):
        procs = (_job("42"),) if 1 <= t <= 3 else ()
        energy.on_snapshot(snap(float(t), gpu(0, energy_joules_total=1000.0 + 100 * t, processes=procs)))

    def series() -> dict[str, float]:
        return {
            f"{f.name}{labels}": value for f in energy.families() for labels, value in f.samples if labels[1] == "42"
        }

    assert series() == {
        "gpumon_owner_energy_joules_total('slurm_job', '42')": 300.0,
        "gpumon_owner_active('slurm_job', '42')": 0.0,
    }
    energy.on_snapshot(snap(63.0, gpu(0, energy_joules_total=9000.0, processes=())))  # 60 s after it was last seen
    assert series() == {}
    (line,) = (tmp_path / "energy" / "owners.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert (record["owner_kind"], record["owner"], record["joules"]) == ("slurm_job", "42", 300.0)
    assert (record["first_seen_seconds"], record["last_seen_seconds"]) == (1.0, 3.0)


def test_owners_past_the_cap_are_dropped_oldest_first_and_recorded(tmp_path: Path) -> None:
    energy = OwnerEnergy(tmp_path, max_owners=3)
    for t in range(6):
        energy.on_snapshot(snap(float(t), gpu(0, energy_joules_total=10.0 * t, processes=(_job(str(t)),))))
    kept = {labels[1] for f in energy.families() if f.name.endswith("_total") for labels, _ in f.samples}
    assert kept == {"3", "4", "5"}
    recorded = [json.loads(x)["owner"] for x in (tmp_path / "energy" / "owners.jsonl").read_text().splitlines()]
    assert recorded == ["0", "1", "2"]


def test_the_daemon_exports_energy_per_slurm_job(tmp_path: Path) -> None:
    config = Config(
        listen="127.0.0.1:0",
        backend="fake",
        state_dir=tmp_path,
        kernel_log=False,
        interval_seconds=0.2,
        slow_interval_seconds=0.2,
    )
    backend = FakeBackend.from_mapping(
        {
            "gpus": [
                {
                    "values": {
                        "energy_joules_total": [float(100 * t) for t in range(1000)],
                        "processes": [{"pid": 10, "slurm_job_id": "42"}],
                    }
                }
            ]
        }
    )
    daemon = Daemon(config, backend)
    daemon.start()
    try:

        def joules() -> float:
            text = daemon.collector.render().decode()
            m = re.search(r'gpumon_owner_energy_joules_total\{owner="42",owner_kind="slurm_job"\} (\S+)', text)
            return float(m.group(1)) if m else 0.0

        wait_for(lambda: joules() > 0, 30, 0.1, "energy counted for job 42")
    finally:
        daemon.stop()


def test_snapshots_kept_by_the_poll_thread_are_all_accounted_before_a_scrape_reads_them(tmp_path: Path) -> None:
    """The poll thread only keeps each snapshot; what a scrape (or ``joules``) reads is what
    accounting each of them as it came gives, however few flushes ran."""
    polls = [
        snap(t, gpu(0, energy_joules_total=100.0 + 40.0 * t, processes=(_job("42", sm=0.5), _job("43", 11, 0.25))))
        for t in range(1, 8)
    ]
    at_once, batched = OwnerEnergy(tmp_path / "a"), OwnerEnergy(tmp_path / "b")
    for n, snapshot in enumerate(polls):
        at_once.on_snapshot(snapshot)
        batched.take(snapshot)
        if n == 2:
            batched.flush()  # one flush on the way: the rest wait for the scrape

    def served(energy: OwnerEnergy) -> list[tuple[object, ...]]:
        return [(f.name, *s) for f in energy.families() for s in f.samples]

    assert served(batched) == served(at_once)
    assert batched.joules("slurm_job", "43") == at_once.joules("slurm_job", "43") == pytest.approx(40.0 * 6 / 3)


def test_the_daemon_accounts_energy_per_owner_every_flush_polls(tmp_path: Path) -> None:
    config = Config(listen="127.0.0.1:0", backend="fake", state_dir=tmp_path, kernel_log=False)
    scenario = {"gpus": [{"values": {"processes": [{"pid": 10, "slurm_job_id": "42"}]}}]}
    daemon = Daemon(config, FakeBackend.from_mapping(scenario))
    try:
        accounted: list[int] = []
        owners = next(s for name, s in daemon.collector._extras._sources if name == "owner_energy")._source
        real = owners.on_snapshot
        owners.on_snapshot = lambda snapshot: (accounted.append(1), real(snapshot))[1]  # type: ignore[method-assign]
        for n in range(1, energy.FLUSH_POLLS * 2 + 1):
            daemon.poller.poll()
            assert len(accounted) == n // energy.FLUSH_POLLS * energy.FLUSH_POLLS  # in batches, on the flush thread
        assert value(daemon.collector.render().decode(), "gpumon_owner_active", owner_kind="slurm_job", owner="42") == 1
    finally:
        daemon.server.stop()
