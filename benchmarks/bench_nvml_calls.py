"""Cost of gpumon's NVML reads against the bare pynvml calls and nvidia-smi, on a real GPU host.

    python3 benchmarks/bench_nvml_calls.py [--repeat N]

For every reader group of NvmlBackend (see NvmlBackend.reader_names) it times, on every GPU,
the median of ``backend.read_group(i, name)`` against a bare pynvml loop over the same calls
(the reference, measured in the same run: only the calls that succeeded once on that GPU, as
a hand-written exporter that knows its hardware would do, no unit conversion, no caching).
Then the full FAST read of all GPUs (what the poller does every second) against the bare loop
over all those calls, and against one ``nvidia-smi --query-gpu`` with the matching fields.
Prints tables with ratios; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml

from gpumon.backends.base import NvmlUnavailableError
from gpumon.backends.nvml import (
    NVLINK_ERROR_COUNTERS,
    NVLINK_ERROR_FIELDS,
    P2P_CAPABILITIES,
    PERF_POLICIES,
    NvmlBackend,
)
from gpumon.snapshot import Tier

Call = Callable[[], Any]

SMI_FAST_FIELDS = [
    "index",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.free",
    "memory.total",
    "memory.reserved",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "clocks.sm",
    "clocks.mem",
    "clocks.gr",
    "pstate",
    "clocks_event_reasons.active",
    "fan.speed",
    "pcie.link.gen.current",
    "pcie.link.width.current",
]


def median_us(fn: Call, repeat: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000.0


def bare_groups(nv: Any, index: int, count: int) -> dict[str, list[Call]]:
    """The pynvml calls each reader group makes on GPU ``index``, as zero-argument callables."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    peers = [nv.nvmlDeviceGetHandleByIndex(p) for p in range(count) if p != index]
    links = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        try:
            nv.nvmlDeviceGetNvLinkState(h, link)
        except nv.NVMLError:
            break
        links.append(link)
    try:
        fans = list(range(nv.nvmlDeviceGetNumFans(h)))
    except nv.NVMLError:
        fans = []
    samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
    fabric_info = (ctypes.c_ubyte * 32)()  # room for nvmlGpuFabricInfo_t (v1, 28 bytes)
    state = {"current": 0, "taken": 0}

    def gpm() -> None:
        """One sample, and the metrics against the previous one (as gpumon does each FAST read)."""
        current = state["current"]
        nv.nvmlGpmSampleGet(h, samples[current])
        state["taken"] += 1
        if state["taken"] > 1:
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            metrics = (2, 3, 5, 10, 11, 12, 13, 60, 61, 20, 21)  # the NVML_GPM_METRIC_* ids gpumon asks for
            request.numMetrics = len(metrics)
            request.sample1, request.sample2 = samples[1 - current], samples[current]
            for i, metric in enumerate(metrics):
                request.metrics[i].metricId = metric
            nv.nvmlGpmMetricsGet(request)
        state["current"] = 1 - current

    last_seen = {"stamp": 0}

    def processes() -> None:
        """As gpumon does: the SM share is asked only when processes run, for samples newer than the last."""
        if nv.nvmlDeviceGetComputeRunningProcesses(h):
            with contextlib.suppress(nv.NVMLError):  # NOT_FOUND = no new samples: part of the normal cost
                for s in nv.nvmlDeviceGetProcessUtilization(h, last_seen["stamp"]):
                    last_seen["stamp"] = max(last_seen["stamp"], int(s.timeStamp))

    return {
        "utilization": [lambda: nv.nvmlDeviceGetUtilizationRates(h)],
        "memory": [lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)],
        "temperature": [lambda: nv.nvmlDeviceGetTemperature(h, 0)],
        "memory_temperature": [lambda: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_MEMORY_TEMP])],
        "power": [lambda: nv.nvmlDeviceGetPowerUsage(h)],
        "clocks": [lambda c=c: nv.nvmlDeviceGetClockInfo(h, c) for c in (0, 1, 2)],
        "performance_state": [lambda: nv.nvmlDeviceGetPerformanceState(h)],
        "clock_events": [lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)],
        "fans": [lambda f=f: nv.nvmlDeviceGetFanSpeed_v2(h, f) for f in fans] or [lambda: nv.nvmlDeviceGetNumFans(h)],
        "pcie_link": [lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h), lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)],
        "nvlink_state": [lambda link=link: nv.nvmlDeviceGetNvLinkState(h, link) for link in links],
        "processes": [processes],
        "gpm": [gpm],
        "power_limit": [lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h)],
        "energy": [lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)],
        "violations": [lambda p=p: nv.nvmlDeviceGetViolationStatus(h, p) for p in PERF_POLICIES.values()],
        "pcie_replays": [lambda: nv.nvmlDeviceGetPcieReplayCounter(h)],
        "pcie_bytes": [
            lambda: nv.nvmlDeviceGetFieldValues(
                h, [nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]
            )
        ],
        "pcie_throughput": [lambda d=d: nv.nvmlDeviceGetPcieThroughput(h, d) for d in (0, 1)],
        "ecc_mode": [lambda: nv.nvmlDeviceGetEccMode(h)],
        "ecc_errors": [lambda e=e, c=c: nv.nvmlDeviceGetTotalEccErrors(h, e, c) for e in (0, 1) for c in (0, 1)],
        "remapped_rows": [lambda: nv.nvmlDeviceGetRemappedRows(h)],
        "retired_pages": [lambda c=c: nv.nvmlDeviceGetRetiredPages(h, c) for c in (0, 1)]
        + [lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h)],
        "persistence_mode": [lambda: nv.nvmlDeviceGetPersistenceMode(h)],
        "mig_mode": [lambda: nv.nvmlDeviceGetMigMode(h)],
        "compute_mode": [lambda: nv.nvmlDeviceGetComputeMode(h)],
        "fabric": [lambda: nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(fabric_info))],
        "nvlink_errors": [
            lambda: nv.nvmlDeviceGetFieldValues(h, [(f, link) for f in NVLINK_ERROR_FIELDS.values() for link in links])
        ],
        "nvlink_errors_fallback": [
            lambda link=link, c=c: nv.nvmlDeviceGetNvLinkErrorCounter(h, link, c)
            for link in links
            for c in NVLINK_ERROR_COUNTERS.values()
        ],
        "identity": [
            lambda: nv.nvmlDeviceGetName(h),
            lambda: nv.nvmlDeviceGetPciInfo(h),
            lambda: nv.nvmlDeviceGetSerial(h),
            lambda: nv.nvmlDeviceGetVbiosVersion(h),
            lambda: nv.nvmlDeviceGetCudaComputeCapability(h),
            lambda: nv.nvmlDeviceGetMinorNumber(h),
        ],
        "thresholds": [lambda t=t: nv.nvmlDeviceGetTemperatureThreshold(h, t) for t in (0, 1, 2, 3)],
        "max_clocks": [lambda c=c: nv.nvmlDeviceGetMaxClockInfo(h, c) for c in (0, 1, 2)],
        "pcie_max": [lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h), lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h)],
        "p2p": [lambda p=p, c=c: nv.nvmlDeviceGetP2PStatus(h, p, c) for p in peers for c in P2P_CAPABILITIES.values()],
        "topology": [lambda link=link: nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link) for link in links]
        + [lambda p=p: nv.nvmlDeviceGetP2PStatus(h, p, P2P_CAPABILITIES["nvlink"]) for p in peers]
        + [lambda p=p: nv.nvmlDeviceGetTopologyCommonAncestor(h, p) for p in peers],
    }


def working(nv: Any, calls: list[Call]) -> tuple[list[Call], int]:
    """The calls that succeed (run twice: GPM needs two samples), and how many failed."""
    ok = []
    for call in calls:
        try:
            call()
            call()
        except Exception:  # NVMLError, ctypes.ArgumentError: not on this GPU
            continue
        ok.append(call)
    return ok, len(calls) - len(ok)


def run_all(calls: list[Call]) -> None:
    for call in calls:
        call()


def smi_query(fields: list[str]) -> list[str] | None:
    done = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    return fields if done.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="timed runs per fast measurement (default 200)")
    args = parser.parse_args()

    backend = NvmlBackend.from_system()
    t0 = time.perf_counter()
    try:
        backend.init()
    except NvmlUnavailableError as exc:
        print(f"cannot benchmark: {exc}", file=sys.stderr)
        return 1
    init_ms = (time.perf_counter() - t0) * 1e3
    count = backend.device_count()
    host = backend.host()
    print(f"# {count} GPU(s), driver {host.driver_version}, CUDA {host.cuda_driver_version}, NVML {host.nvml_version}")
    print(f"# nvidia-ml-py {getattr(pynvml, '__version__', '?')}, python {sys.version.split()[0]}")
    print(f"# backend.init() (nvmlInit + handles): {init_ms:.1f} ms")
    for i in range(count):  # first reads probe capabilities (NOT_SUPPORTED is cached from here on)
        for tier in (Tier.STATIC, Tier.SLOW, Tier.FAST, Tier.FAST):
            backend.read(i, tier)
    print(f"# GPU 0: {backend.read(0, Tier.STATIC).get('name')}")

    bare: dict[int, dict[str, list[Call]]] = {}
    failing: dict[int, dict[str, int]] = {}
    for i in range(count):
        groups = bare_groups(pynvml, i, count)
        bare[i], failing[i] = {}, {}
        for name, calls in groups.items():
            bare[i][name], failing[i][name] = working(pynvml, calls)

    print()
    print(
        f"{'tier':6} {'group':20} {'GPU':>3} {'gpumon µs':>11} {'bare µs':>11} {'ratio':>7}  {'calls':>5} {'failing':>7}"
    )
    for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC):
        repeat = args.repeat if tier is Tier.FAST else max(5, args.repeat // 20)
        for name in backend.reader_names(tier):
            for i in range(count):
                ours = median_us(lambda i=i, name=name: backend.read_group(i, name), repeat)
                calls = bare[i][name]
                ref = median_us(lambda calls=calls: run_all(calls), repeat) if calls else 0.0
                ratio = f"{ours / ref:7.2f}" if ref > 0 else "    n/a"
                print(
                    f"{tier.value:6} {name:20} {i:>3} {ours:11.1f} {ref:11.1f} {ratio}  {len(calls):>5} "
                    f"{failing[i][name]:>7}"
                )
    errors = backend.take_errors()
    if errors:
        print(f"# reader errors during the benchmark: {errors}")

    # full FAST read of all GPUs, as the poller does every second
    fast_names = backend.reader_names(Tier.FAST)
    all_bare = [c for i in range(count) for name in fast_names for c in bare[i][name]]

    def ours_fast() -> None:
        for i in range(count):
            backend.read(i, Tier.FAST)

    ours = median_us(ours_fast, args.repeat)
    ref = median_us(lambda: run_all(all_bare), args.repeat)
    print()
    print(f"full FAST read, {count} GPU(s): gpumon {ours:.1f} µs ({ours / count:.1f} µs/GPU), bare pynvml {ref:.1f} µs")
    print(f"  ratio gpumon / bare pynvml: {ours / ref:.2f}  (goal <= 1.5 and <= 100 µs per GPU)")

    backend.shutdown()
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found: no nvidia-smi comparison")
        return 0
    fields = smi_query(SMI_FAST_FIELDS)
    if fields is None:  # an older nvidia-smi without some field names
        fields = [f for f in SMI_FAST_FIELDS if smi_query(["index", f]) is not None]
    smi_us = median_us(lambda: smi_query(fields), max(5, args.repeat // 20), warmup=1)
    print(f"nvidia-smi --query-gpu ({len(fields)} fields, all GPUs): {smi_us / 1000:.1f} ms per call")
    print(f"  ratio nvidia-smi / gpumon full FAST read: {smi_us / ours:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
