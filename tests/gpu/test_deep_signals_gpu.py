"""Process attribution, kernel-log XIDs and DCGM names on a real GPU host.

Run with ``python3 -m pytest -m gpu tests/gpu/test_deep_signals_gpu.py -s -v``: every
compared value is printed. Skipped (with the reason shown) where nvidia-smi or NVML is
missing, or torch for the workload test.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpumon.backends.nvml import NvmlBackend
from gpumon.collect.poller import Poller
from gpumon.collect.processes import ProcessEnricher, parse_cgroup_file
from gpumon.collect.store import SnapshotStore
from gpumon.events.kernel_log import read_boot_xids
from gpumon.events.tracker import XidTracker
from gpumon.exposition.dcgm import DcgmCompatCollector
from gpumon.exposition.registry import MetricsOf
from gpumon.model.bus_id import normalize_bus_id
from gpumon.model.snapshot import Snapshot, Tier
from gpumon.model.xid_catalog import XidCatalog
from tests.gpu.conftest import smi

pytestmark = pytest.mark.gpu


def snapshot_of(backend: NvmlBackend, enricher: ProcessEnricher | None = None) -> Snapshot:
    store = SnapshotStore()
    poller = Poller(backend, store, enrich_processes=enricher.enrich if enricher else None)
    return poller.poll()


def test_nvml_bus_ids_are_already_in_the_form_kernel_log_events_are_normalised_to(backend: NvmlBackend) -> None:
    for index in range(backend.device_count()):
        bus = backend.read(index, Tier.STATIC).get("pci_bus_id")
        print(f"\nGPU {index}: NVML pci_bus_id {bus!r} -> normalised {normalize_bus_id(str(bus))!r}")
        assert bus is not None and normalize_bus_id(bus) == bus


def test_kernel_log_xids_since_boot_are_attributed_to_this_hosts_gpus(backend: NvmlBackend) -> None:
    result = read_boot_xids()
    print(f"\n{result.summary()}")
    buses = {str(backend.read(i, Tier.STATIC)["pci_bus_id"]): i for i in range(backend.device_count())}
    tracker = XidTracker(live_since_seconds=time.time())
    tracker.set_gpus(buses)
    assert tracker.record_all(result.events) == len(result.events), "one source: nothing is paired away"
    for index in sorted(set(buses.values())):
        print(f"GPU {index}: XIDs since boot {tracker.counts(index)}")
    print(f"not on a watched GPU: {tracker.counts(None)}")
    # each event is counted on the GPU at its bus id (NVML's ids are in the kernel log's form, see
    # above), and under no GPU when none of this host's GPUs has that bus id
    index_of_bus = {normalize_bus_id(bus): index for bus, index in buses.items() if normalize_bus_id(bus)}
    expected: dict[int | None, dict[str, int]] = {}
    for event in result.events:
        bus = normalize_bus_id(event.pci_bus_id) if event.pci_bus_id else None
        index = event.gpu_index if event.gpu_index is not None else (index_of_bus.get(bus) if bus else None)
        per_code = expected.setdefault(index, {})
        per_code[str(event.xid)] = per_code.get(str(event.xid), 0) + 1
    for index in {*buses.values(), None}:
        assert tracker.counts(index) == expected.get(index, {}), f"GPU {index}"
    for event in result.events[-10:]:
        print(f"  {event.pci_bus_id} xid {event.xid} at {event.timestamp_seconds:.0f}: {event.message}")
    if result.source is None:
        assert os.geteuid() != 0, "root must be able to read /dev/kmsg"
    dmesg = shutil.which("dmesg")
    if result.source is not None and dmesg:
        done = subprocess.run([dmesg], capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0:
            in_dmesg = done.stdout.count("NVRM: Xid (")
            print(f"dmesg shows {in_dmesg} XID lines; gpumon read {len(result.events)} from {result.source}")
            # the same ring buffer (or the journal, which keeps what the ring buffer lost)
            assert len(result.events) >= in_dmesg
    for event in result.events:
        assert event.pci_bus_id is not None and normalize_bus_id(event.pci_bus_id) == event.pci_bus_id


WORKLOAD = r"""
import os, sys, time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = a @ a
torch.cuda.synchronize()
print(f"ready {os.getpid()}", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
"""


def test_a_torch_process_is_shown_with_name_user_and_cgroup(backend: NvmlBackend) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: cannot start the workload")
    uuid = backend.uuid(0)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKLOAD, "15"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()
        assert ready.startswith("ready"), (
            f"workload did not start: {ready!r} {proc.stderr.read() if proc.stderr else ''}"
        )
        pid = int(ready.split()[1])
        enricher = ProcessEnricher()
        snap = snapshot_of(backend, enricher)
        procs = {p.pid: p for p in snap.gpus[0].processes or ()}
        print(f"\nprocesses on GPU 0 while torch runs: {list(procs.values())}")
        assert pid in procs, f"torch pid {pid} not among {sorted(procs)} (a container's pid namespace differs?)"
        p = procs[pid]
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        place = parse_cgroup_file(Path(f"/proc/{pid}/cgroup").read_text())
        print(f"pid {pid}: comm {comm!r}, cgroup {Path(f'/proc/{pid}/cgroup').read_text().strip()!r} -> {place}")
        assert p.name == comm
        assert p.user == getpass.getuser()
        assert (p.systemd_unit, p.container_id, p.pod_uid, p.slurm_job_id) == (
            place.systemd_unit,
            place.container_id,
            place.pod_uid,
            place.slurm_job_id,
        )
        assert p.used_memory_bytes is not None and p.used_memory_bytes >= 4096 * 4096 * 2
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_dcgm_names_match_nvidia_smi_in_dcgm_units(backend: NvmlBackend) -> None:
    query = "index,memory.total,clocks.sm,temperature.gpu,power.draw,pci.bus_id"

    def smi_rows() -> list[list[str]]:
        out = smi(f"--query-gpu={query}", "--format=csv,noheader,nounits").strip().splitlines()
        return [[c.strip() for c in line.split(",")] for line in out]

    # nvidia-smi before and after gpumon's read: a GPU still cooling from the previous test moves by degrees
    before = smi_rows()
    store = SnapshotStore()
    store.publish(snapshot_of(backend))
    after = smi_rows()
    registry = CollectorRegistry()
    registry.register(MetricsOf(DcgmCompatCollector(store, "gpu-host", XidCatalog.load())))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    for row, row_after in zip(before, after, strict=True):
        index, total, sm, temp, power, bus = row
        temps = (float(temp), float(row_after[3]))

        def value(name: str, index: str = index) -> float:
            (s,) = [s for s in families[name].samples if s.labels["gpu"] == index]
            return float(s.value)

        print(
            f"\nGPU {index}: FB_TOTAL {value('DCGM_FI_DEV_FB_TOTAL')} MiB vs smi {total}; "
            f"SM_CLOCK {value('DCGM_FI_DEV_SM_CLOCK')} vs {sm} MHz; GPU_TEMP {value('DCGM_FI_DEV_GPU_TEMP')} vs {temp}; "
            f"POWER {value('DCGM_FI_DEV_POWER_USAGE')} vs {power} W"
        )
        assert value("DCGM_FI_DEV_FB_TOTAL") == pytest.approx(float(total), abs=1)
        assert min(temps) - 2 <= value("DCGM_FI_DEV_GPU_TEMP") <= max(temps) + 2, temps
        assert value("DCGM_FI_DEV_SM_CLOCK") == pytest.approx(float(sm), rel=0.5)  # clocks move between reads
        (temp_sample,) = [s for s in families["DCGM_FI_DEV_GPU_TEMP"].samples if s.labels["gpu"] == index]
        assert temp_sample.labels["pci_bus_id"] == normalize_bus_id(bus)
        assert temp_sample.labels["device"] == f"nvidia{index}"


def _smi_fabric_sections(text: str) -> list[tuple[str | None, str | None]]:
    """(State, Status) of each GPU's ``Fabric`` block in ``nvidia-smi -q``, in GPU order."""
    out: list[tuple[str | None, str | None]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "Fabric":
            continue
        fields: dict[str, str] = {}
        for follow in lines[i + 1 : i + 8]:
            key, _, value = follow.partition(":")
            fields.setdefault(key.strip(), value.strip())
        out.append((fields.get("State"), fields.get("Status")))
    return out


def test_fabric_state_matches_nvidia_smi(backend: NvmlBackend) -> None:
    smi_states = {"Completed": "completed", "In Progress": "in_progress", "Not Started": "not_started", "N/A": None}
    sections = _smi_fabric_sections(smi("-q"))
    assert len(sections) == backend.device_count(), sections
    for index, (state, status) in enumerate(sections):
        slow = backend.read(index, Tier.SLOW)
        print(
            f"\nGPU {index}: nvidia-smi Fabric State {state!r} Status {status!r}; gpumon {slow.get('fabric_state')!r}"
            f" ok={slow.get('fabric_status_ok')!r}"
        )
        assert slow.get("fabric_state") == smi_states[state or "N/A"]
        if slow.get("fabric_state") is not None:
            assert slow.get("fabric_status_ok") == (status == "Success")
