"""The NVML backend on a real GPU host, checked against nvidia-smi read in the same run.

Run with ``python3 -m pytest -m gpu tests/gpu -s -v``: every compared value is printed, so
the log shows the comparison. Works on 1, 2, 4 or 8 GPUs. Skipped (with the reason shown)
where nvidia-smi or NVML is missing.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from gpumon.backends.nvml import NvmlBackend
from gpumon.model.snapshot import Tier, fields_of_tier
from tests.gpu.conftest import smi

pytestmark = pytest.mark.gpu

MIB = 1024 * 1024
TIERS = (Tier.STATIC, Tier.SLOW, Tier.FAST)


def read_all(backend: NvmlBackend, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tier in TIERS:
        out.update(backend.read(index, tier))
    return out


# ---- nvidia-smi --query-gpu -------------------------------------------------------
QUERY = (
    "index,uuid,pci.bus_id,name,temperature.gpu,power.draw,enforced.power.limit,memory.total,memory.used,"
    "clocks.sm,clocks.mem,utilization.gpu,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,"
    "pcie.link.width.max,ecc.mode.current,persistence_mode,pstate"
)


def query_smi() -> dict[int, dict[str, str | None]]:
    names = QUERY.split(",")
    rows: dict[int, dict[str, str | None]] = {}
    for line in smi(f"--query-gpu={QUERY}", "--format=csv,noheader,nounits").strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        row: dict[str, str | None] = {
            n: (None if c.startswith("[") or c == "N/A" else c) for n, c in zip(names, cells, strict=True)
        }
        rows[int(str(row["index"]))] = row
    return rows


def _num(value: str | None) -> float | None:
    return None if value is None else float(value)


def _enabled(value: str | None) -> bool | None:
    return None if value is None else value.strip().lower() == "enabled"


# name, nvidia-smi value -> comparable, gpumon value -> comparable, tolerance(reference) (None = exact)
Check = tuple[str, str, Callable[[str | None], Any], Callable[[dict[str, Any]], Any], Callable[[float], float] | None]
CHECKS: list[Check] = [
    ("uuid", "uuid", lambda s: s, lambda g: g.get("uuid"), None),
    (
        "pci_bus_id",
        "pci.bus_id",
        lambda s: s and s.upper(),
        lambda g: (g.get("pci_bus_id") or "").upper() or None,
        None,
    ),
    ("name", "name", lambda s: s, lambda g: g.get("name"), None),
    ("temperature_celsius", "temperature.gpu", _num, lambda g: g.get("temperature_celsius"), lambda r: 2.0),
    ("power_watts", "power.draw", _num, lambda g: g.get("power_watts"), lambda r: max(0.05 * r, 10.0)),
    ("power_limit_watts", "enforced.power.limit", _num, lambda g: g.get("power_limit_watts"), lambda r: 0.5),
    ("memory_total MiB", "memory.total", _num, lambda g: _mib(g.get("memory_total_bytes")), lambda r: 1.0),
    (
        "memory_used MiB",
        "memory.used",
        _num,
        lambda g: _mib(g.get("memory_used_bytes")),
        lambda r: max(0.03 * r, 64.0),
    ),
    ("clocks sm MHz", "clocks.sm", _num, lambda g: _mhz(g, "sm"), lambda r: max(0.05 * r, 1.0)),
    ("clocks mem MHz", "clocks.mem", _num, lambda g: _mhz(g, "memory"), lambda r: max(0.05 * r, 1.0)),
    (
        "utilization %",
        "utilization.gpu",
        _num,
        lambda g: None if g.get("utilization_ratio") is None else g["utilization_ratio"] * 100,
        lambda r: 10.0,
    ),
    ("pcie gen", "pcie.link.gen.current", _num, lambda g: g.get("pcie_link_generation"), lambda r: 0.0),
    ("pcie width", "pcie.link.width.current", _num, lambda g: g.get("pcie_link_width"), lambda r: 0.0),
    ("pcie gen max", "pcie.link.gen.max", _num, lambda g: g.get("pcie_link_generation_max"), lambda r: 0.0),
    ("pcie width max", "pcie.link.width.max", _num, lambda g: g.get("pcie_link_width_max"), lambda r: 0.0),
    ("ecc mode", "ecc.mode.current", _enabled, lambda g: g.get("ecc_mode_enabled"), None),
    ("persistence", "persistence_mode", _enabled, lambda g: g.get("persistence_mode_enabled"), None),
    (
        "pstate",
        "pstate",
        lambda s: None if s is None else int(s.lstrip("P")),
        lambda g: g.get("performance_state"),
        lambda r: 0.0,
    ),
]


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


def _mhz(g: dict[str, Any], domain: str) -> float | None:
    clocks = g.get("clocks_hertz") or {}
    return None if domain not in clocks else clocks[domain] / 1e6


def test_every_tier_of_every_gpu_reads_cleanly(backend: NvmlBackend, caplog: pytest.LogCaptureFixture) -> None:
    print(f"\nhost: {backend.host()}")
    with caplog.at_level(logging.WARNING, logger="gpumon.backends.nvml"):
        for index in range(backend.device_count()):
            for tier in TIERS:
                t0 = time.perf_counter()
                values = backend.read(index, tier)
                took_us = (time.perf_counter() - t0) * 1e6
                print(f"GPU {index} {tier.value:6} ({took_us:9.0f} µs, first read): {dict(values)}")
                assert set(values) <= fields_of_tier(tier)
    errors = backend.take_errors()
    assert errors == {}, f"reader errors {errors}: {[r.getMessage() for r in caplog.records]}"
    for index in range(backend.device_count()):
        got = read_all(backend, index)
        for name in ("name", "pci_bus_id", "memory_total_bytes", "temperature_celsius", "power_watts", "clocks_hertz"):
            assert name in got, f"GPU {index}: {name} missing"


def test_values_match_nvidia_smi_read_in_the_same_run(backend: NvmlBackend) -> None:
    before = query_smi()
    ours = {i: {**read_all(backend, i), "uuid": backend.uuid(i)} for i in range(backend.device_count())}
    after = query_smi()
    assert sorted(before) == sorted(ours), "nvidia-smi and NVML see different GPUs"
    failures = []
    print(f"\n{'GPU':>3} {'field':22} {'nvidia-smi before':>28} {'gpumon':>28} {'nvidia-smi after':>28}  verdict")
    for index in sorted(ours):
        for label, smi_field, parse_smi, take_ours, tolerance in CHECKS:
            ref_before, ref_after = parse_smi(before[index][smi_field]), parse_smi(after[index][smi_field])
            mine = take_ours(ours[index])
            if ref_before is None and ref_after is None:
                ok = mine is None
            elif mine is None:
                ok = False
            elif tolerance is None:
                ok = mine in (ref_before, ref_after)
            else:
                refs = [r for r in (ref_before, ref_after) if r is not None]
                low, high = min(refs), max(refs)
                slack = tolerance(high)
                ok = low - slack <= mine <= high + slack
            verdict = "ok" if ok else "MISMATCH"
            print(f"{index:>3} {label:22} {ref_before!s:>28} {mine!s:>28} {ref_after!s:>28}  {verdict}")
            if not ok:
                failures.append(f"GPU {index} {label}: nvidia-smi {ref_before}/{ref_after}, gpumon {mine}")
    assert failures == []


# ---- NVLink --------------------------------------------------------------------
def parse_nvlink_status(text: str) -> dict[int, dict[str, bool]]:
    """``nvidia-smi nvlink --status`` -> GPU index -> link -> up."""
    out: dict[int, dict[str, bool]] = {}
    gpu = None
    for line in text.splitlines():
        m = re.match(r"GPU (\d+):", line)
        if m:
            gpu = int(m.group(1))
            out[gpu] = {}
            continue
        m = re.match(r"\s*Link (\d+):\s*(.*)$", line)
        if m and gpu is not None:
            out[gpu][m.group(1)] = "inactive" not in m.group(2).lower()
    return out


def test_nvlink_state_matches_nvidia_smi(backend: NvmlBackend) -> None:
    smi_links = parse_nvlink_status(smi("nvlink", "--status"))
    for index in range(backend.device_count()):
        ours = dict(backend.read(index, Tier.FAST).get("nvlink_up") or {})
        theirs = smi_links.get(index, {})
        up = sorted(int(k) for k, v in ours.items() if v)
        print(f"\nGPU {index}: gpumon links up {up} of {len(ours)}; nvidia-smi {sum(theirs.values())} of {len(theirs)}")
        assert ours == theirs


# ---- topology and P2P -----------------------------------------------------------
SMI_LEVELS = {
    "PIX": {"single", "internal"},
    "PXB": {"multiple"},
    "PHB": {"hostbridge"},
    "NODE": {"node"},
    "SYS": {"system"},
    "SOC": {"system", "node"},
}


def parse_gpu_matrix(text: str) -> dict[int, dict[int, str]]:
    """A ``nvidia-smi topo -m`` / ``topo -p2p X`` matrix -> row GPU -> column GPU -> cell."""
    header: list[str] | None = None
    out: dict[int, dict[int, str]] = {}
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():  # nvidia-smi underlines the header
        cells = line.split()
        if not cells:
            if header is not None and out:
                break
            continue
        if header is None and cells[0].startswith("GPU") and re.fullmatch(r"GPU\d+", cells[0]) and "X" not in cells:
            header = cells
            continue
        if header is not None and re.fullmatch(r"GPU\d+", cells[0]):
            row = int(cells[0][3:])
            out[row] = {}
            for column, cell in zip(header, cells[1:], strict=False):
                if re.fullmatch(r"GPU\d+", column):
                    out[row][int(column[3:])] = cell
    return out


def test_topology_matches_nvidia_smi_topo_m(backend: NvmlBackend) -> None:
    matrix = parse_gpu_matrix(smi("topo", "-m"))
    count = backend.device_count()
    print(f"\nnvidia-smi topo -m GPU matrix: {matrix}")
    failures = []
    for index in range(count):
        ours = dict(backend.read(index, Tier.STATIC).get("topology_level") or {})
        print(f"GPU {index}: gpumon topology {ours}")
        if count == 1:
            assert ours == {}
            continue
        for peer in range(count):
            if peer == index:
                continue
            cell = matrix[index][peer]
            expected = {"nvlink"} if cell.startswith("NV") else SMI_LEVELS.get(cell, {cell})
            if ours.get(str(peer)) not in expected:
                failures.append(f"GPU {index} -> {peer}: nvidia-smi {cell}, gpumon {ours.get(str(peer))}")
    assert failures == []


@pytest.mark.parametrize(("flag", "capability"), [("r", "read"), ("w", "write"), ("n", "nvlink"), ("a", "atomics")])
def test_p2p_matches_nvidia_smi_topo_p2p(backend: NvmlBackend, flag: str, capability: str) -> None:
    matrix = parse_gpu_matrix(smi("topo", "-p2p", flag))
    count = backend.device_count()
    print(f"\nnvidia-smi topo -p2p {flag}: {matrix}")
    failures, compared = [], 0
    for index in range(count):
        ours = {
            p.peer_index: p.ok
            for p in (backend.read(index, Tier.STATIC).get("p2p_status") or ())
            if p.capability == capability
        }
        print(f"GPU {index}: gpumon p2p {capability} {ours}")
        for peer in range(count):
            if peer == index:
                continue
            theirs = matrix[index][peer] == "OK"
            if peer not in ours:
                failures.append(
                    f"GPU {index} -> {peer} {capability}: omitted by gpumon, nvidia-smi {matrix[index][peer]}"
                )
            elif ours[peer] != theirs:
                failures.append(
                    f"GPU {index} -> {peer} {capability}: nvidia-smi {matrix[index][peer]}, gpumon {ours[peer]}"
                )
            compared += 1
    print(f"compared {compared} pairs")
    assert failures == []


# ---- events ---------------------------------------------------------------------
def test_event_wait_times_out_cleanly_on_a_healthy_gpu(backend: NvmlBackend) -> None:
    t0 = time.monotonic()
    events = backend.wait_events(1.0)
    took = time.monotonic() - t0
    registered = sorted(backend._event_registered)  # which GPUs the event set covers
    print(f"\nwait_events(1.0) -> {events} after {took:.3f} s; GPUs registered for XID events: {registered}")
    assert events == []
    assert 0.5 <= took <= 3.0
    assert registered == list(range(backend.device_count()))


# ---- GPM and processes under a real workload ---------------------------------------------
WORKLOAD = r"""
import os, sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
print(f"ready {os.getpid()}", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
print("done", flush=True)
"""


def gpm_series(backend: NvmlBackend, index: int, seconds: float, every: float = 0.5) -> list[dict[str, Any]]:
    """FAST and SLOW reads merged (GPM is read in the slow tier), ``every`` seconds apart."""
    backend.read(index, Tier.SLOW)
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(every)  # GPM measures over the interval between two samples
        out.append({**backend.read(index, Tier.FAST), **backend.read(index, Tier.SLOW)})
    return out


def test_gpm_and_processes_follow_a_torch_matmul(backend: NvmlBackend) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: cannot start the matmul workload")
    index = 0
    uuid = backend.uuid(index)
    idle = gpm_series(backend, index, 2.0)
    if backend.gpm_supported(index) is False:
        name = backend.read(index, Tier.STATIC).get("name")
        pytest.skip(f"NVML GPM not supported on GPU {index} ({name}); Hopper or newer needed")
    assert "sm_active_ratio" in idle[-1], f"GPM supported but no GPM fields: {idle[-1]}"
    idle_tensor = max(s.get("tensor_active_ratio", 0.0) for s in idle)
    print(f"\nidle GPU {index}: tensor_active max {idle_tensor:.3f}, samples {[_gpm(s) for s in idle]}")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKLOAD, "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().strip()  # blocks until the workload warmed up (or died)
        assert ready.startswith("ready"), (
            f"workload did not start: {ready!r} {proc.stderr.read() if proc.stderr else ''}"
        )
        pid = int(ready.split()[1])
        busy = gpm_series(backend, index, 4.0)
        busy_tensor = max(s.get("tensor_active_ratio", 0.0) for s in busy)
        print(f"busy GPU {index} (pid {pid}): tensor_active max {busy_tensor:.3f}, samples {[_gpm(s) for s in busy]}")
        procs = {p.pid: p for p in busy[-1].get("processes", ())}
        print(f"processes on GPU {index}: {list(procs.values())}")
        assert idle_tensor < 0.05
        assert busy_tensor > 0.3
        assert pid in procs, f"torch pid {pid} not among {sorted(procs)} (a container's pid namespace differs?)"
        used = procs[pid].used_memory_bytes
        assert used is not None and used >= 2 * 8192 * 8192 * 2, f"torch process memory {used}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _gpm(sample: dict[str, Any]) -> dict[str, Any]:
    keys = ("sm_active_ratio", "tensor_active_ratio", "dram_active_ratio", "utilization_ratio", "power_watts")
    return {k.replace("_ratio", ""): round(sample[k], 3) for k in keys if k in sample}
