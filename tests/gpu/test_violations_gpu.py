"""The violation counters (gpumon_throttle_seconds_total) on a real GPU: read with one field-values call
(NVML_FI_DEV_PERF_POLICY_*), they match nvmlDeviceGetViolationStatus policy by policy and nvidia-smi's
"Clocks Event Reasons Counters".

Run with ``python3 -m pytest -m gpu tests/gpu/test_violations_gpu.py -s -v``: every compared value is printed.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from gpumon.backends.nvml import NvmlBackend
from gpumon.backends.nvml.clocks import PERF_POLICIES
from tests.gpu.conftest import smi

pytestmark = pytest.mark.gpu

SMI_COUNTERS = {"SW Power Capping": "power", "Sync Boost": "sync_boost"}
"""nvidia-smi -q -d PERFORMANCE counters (µs) that are NVML_FI_DEV_PERF_POLICY_POWER / _SYNC_BOOST."""


class CountingNvml:
    """The pynvml module, counting the calls made through it."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._nv, name)
        if not callable(attr) or not name.startswith("nvml"):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return counted


@pytest.fixture(scope="module")
def counting() -> Any:
    pynvml = pytest.importorskip("pynvml")
    nv = CountingNvml(pynvml)
    backend = NvmlBackend(nv)
    try:
        backend.init()
    except Exception as exc:
        pytest.skip(f"NVML unavailable on this host: {exc}")
    yield nv, backend
    backend.shutdown()


def smi_counters_us(index: int) -> dict[str, float]:
    """nvidia-smi's clock-event counters of GPU ``index`` by gpumon's policy name, µs."""
    text = smi("-i", str(index), "-q", "-d", "PERFORMANCE")
    section = text.split("Clocks Event Reasons Counters", 1)[1] if "Clocks Event Reasons Counters" in text else ""
    out = {}
    for label, name in SMI_COUNTERS.items():
        found = re.search(rf"^\s*{re.escape(label)}\s*:\s*(\d+)\s*us", section, re.MULTILINE)
        if found:
            out[name] = float(found.group(1))
    return out


def test_violation_counters_match_the_violation_status_calls(counting: Any) -> None:
    nv, backend = counting
    pynvml = pytest.importorskip("pynvml")
    for index in range(backend.device_count()):
        before = nv.calls["nvmlDeviceGetViolationStatus"]
        got = backend.read_group(index, "violations")["throttle_seconds_total"]
        assert nv.calls["nvmlDeviceGetViolationStatus"] == before, "read by the per-policy calls, not the fields"
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        for name, policy in PERF_POLICIES.items():
            try:
                seconds = pynvml.nvmlDeviceGetViolationStatus(h, policy).violationTime / 1e9
            except pynvml.NVMLError as exc:
                print(f"GPU {index} {name}: nvmlDeviceGetViolationStatus {exc}, gpumon {got.get(name)}")
                assert name not in got
                continue
            print(f"GPU {index} {name}: nvmlDeviceGetViolationStatus {seconds:.6f} s, gpumon {got.get(name)}")
            # read after gpumon's: the same or later (the low-utilization counter grows while the GPU idles)
            assert name in got
            assert got[name] <= seconds + 1e-6
            assert seconds - got[name] < 5.0


def test_violation_counters_match_nvidia_smi(backend: NvmlBackend) -> None:
    for index in range(backend.device_count()):
        smi_us = smi_counters_us(index)
        got = backend.read_group(index, "violations")["throttle_seconds_total"]
        print(f"GPU {index}: nvidia-smi {smi_us} µs, gpumon {got} s")
        if not smi_us:
            pytest.skip("this nvidia-smi shows no Clocks Event Reasons Counters")
        for name, microseconds in smi_us.items():
            assert abs(got[name] * 1e6 - microseconds) <= max(1e6, 0.01 * microseconds)
