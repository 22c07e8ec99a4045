"""The NVML backend, against a fake pynvml module (tests/fake_pynvml.py).

What is specified here: the fields each tier returns and their units, that NVML is
initialised once, that NOT_SUPPORTED is asked once, that a lost GPU is reported and
re-probed when it returns, that one failing call spoils nothing else, P2P/topology
probing, XID events, and that gpumon never calls a function that changes a GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
import threading
import time
from pathlib import Path

import pynvml
import pytest

from gpumon.backends.base import GpuLostError, NvmlUnavailableError
from gpumon.backends.nvml import NvmlBackend
from gpumon.backends.nvml.processes import PROCESS_UTILIZATION_SECONDS
from gpumon.model.fields.gpm import GpmFields
from gpumon.model.fields.nvlink import NVLINK_ERRORS_SECONDS
from gpumon.model.snapshot import P2pStatus, ProcessSnapshot, Tier, fields_of_tier
from tests.fake_pynvml import MIB, FakeGpu, FakeNvml

GPM = pynvml  # metric ids


# ---- init / shutdown --------------------------------------------------------
def test_nvml_is_initialised_once_however_many_polls(fake: FakeNvml, backend: NvmlBackend) -> None:
    for _ in range(5):
        for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC):
            backend.read(0, tier)
            backend.read(1, tier)
    backend.init()  # a second init of a running backend is a no-op
    assert fake.calls["nvmlInit"] == 1
    backend.shutdown()
    assert fake.calls["nvmlShutdown"] == 1
    assert fake.initialised == 0
    backend.shutdown()  # twice is harmless
    assert fake.calls["nvmlShutdown"] == 1


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_UNKNOWN, "nvmlInit failed"),
    ],
)
def test_init_failure_is_one_clear_line(fake: FakeNvml, code: int, words: str) -> None:
    fake.init_error = code
    backend = NvmlBackend(fake)
    with pytest.raises(NvmlUnavailableError) as err:
        backend.init()
    message = str(err.value)
    assert words in message and "\n" not in message
    backend.shutdown()  # safe after a failed init
    assert fake.calls["nvmlShutdown"] == 0
    fake.init_error = None  # the driver appears: the next init works
    backend.init()
    assert backend.device_count() == 2


def test_missing_pynvml_fails_at_init_not_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    backend = NvmlBackend.from_system()
    with pytest.raises(NvmlUnavailableError, match="cannot import pynvml"):
        backend.init()


def test_reading_before_init_is_nvml_unavailable(fake: FakeNvml) -> None:
    with pytest.raises(NvmlUnavailableError):
        NvmlBackend(fake).read(0, Tier.FAST)


# ---- values and units per tier ----------------------------------------------
NOT_ON_AN_H200 = {"fan_speed_ratios", "retired_pages", "retired_pages_pending"}
"""An SXM board has no fans; page retirement ended with Ampere (row remapping replaced it)."""

GPM_FIELDS = {f.name for f in dataclasses.fields(GpmFields)}
"""Declared in gpumon/model/fields/gpm.py: read from GPM metrics, which the fake answers only when a test sets them."""

RATES = GPM_FIELDS | {"pcie_throughput_bytes_per_second"}
"""Rates of two reads' counters: none on a first read."""


def answered_on_a_first_read(tier: Tier) -> set[str]:
    """The fields a first read of ``tier`` gives on the fake H200: every field declared in that tier
    (gpumon/model/fields/) but those above, so a new field needs no edit here, only its fake NVML answer."""
    return set(fields_of_tier(tier)) - NOT_ON_AN_H200 - RATES


def test_fast_tier_in_base_units(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].processes = [(4242, 1000 * MIB), (4343, None)]
    fake.gpus[0].process_samples = [(4242, 10, 50), (4242, 20, 75)]
    got = dict(backend.read(0, Tier.FAST))
    assert set(got) == answered_on_a_first_read(Tier.FAST)
    expected = {
        "utilization_ratio": 0.37,
        "memory_bandwidth_utilization_ratio": 0.12,
        "memory_used_bytes": 2048 * MIB,
        "memory_free_bytes": (143771 - 550 - 2048) * MIB,
        "memory_total_bytes": 143771 * MIB,
        "memory_reserved_bytes": 550 * MIB,
        "encoder_utilization_ratio": 0.0,
        "decoder_utilization_ratio": 0.0,
        "temperature_celsius": 31.0,
        "memory_temperature_celsius": 36.0,
        "power_watts": 75.5,
        "clocks_hertz": {"graphics": 1980e6, "sm": 1980e6, "memory": 3201e6},
        "performance_state": 0,
        "clock_events_active": {
            "gpu_idle": True,
            "applications_clocks_setting": False,
            "sw_power_cap": True,
            "hw_slowdown": False,
            "sync_boost": False,
            "sw_thermal_slowdown": False,
            "hw_thermal_slowdown": False,
            "hw_power_brake_slowdown": False,
            "display_clock_setting": False,
        },
        "nvlink_up": {str(link): True for link in range(18)},
        "processes": (
            ProcessSnapshot(pid=4242, used_memory_bytes=1000 * MIB, sm_utilization_ratio=0.75),
            ProcessSnapshot(pid=4343, used_memory_bytes=None, sm_utilization_ratio=None),
        ),
    }
    assert {name: got[name] for name in expected} == expected


def test_slow_tier_in_base_units(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].nvlink_states = [1, 0]
    fake.gpus[0].nvlink_remote_bus_ids = [fake.gpus[1].bus_id] * 2
    got = dict(backend.read(0, Tier.SLOW))
    assert set(got) == answered_on_a_first_read(Tier.SLOW)
    expected = {
        "pcie_link_generation": 5,
        "pcie_link_width": 16,
        "power_limit_watts": 700.0,
        "energy_joules_total": 1_234_567.89,
        "throttle_seconds_total": {"power": 2.5, "thermal": 0.0},
        "pcie_replays_total": 3,
        "pcie_bytes_total": {"tx": 5_000_000_000, "rx": 7_000_000_000},
        # no throughput on the first read: it is the counters' rate from the next (tests/test_nvml_spacing.py)
        "row_remap_bank_availability": {"max": 3072, "high": 0, "partial": 0, "low": 0, "none": 0},
        "recovery_action": "none",
        "ecc_mode_enabled": True,
        "ecc_errors_total": {
            "corrected_volatile": 1,
            "uncorrected_volatile": 0,
            "corrected_aggregate": 5,
            "uncorrected_aggregate": 2,
        },
        "remapped_rows": {"correctable": 0, "uncorrectable": 1},
        "row_remap_pending": False,
        "row_remap_failure": False,
        "persistence_mode_enabled": True,
        "mig_mode_enabled": False,
        "compute_mode": "default",
        "fabric_state": "completed",
        "fabric_status_ok": True,
        "nvlink_errors_total": {str(link): {"replay": 0, "recovery": 0, "crc": 4} for link in range(2)},
    }
    assert {name: got[name] for name in expected} == expected


def test_fabric_state_is_omitted_outside_an_nvswitch_fabric_and_read_on_one(
    fake: FakeNvml, backend: NvmlBackend
) -> None:
    fake.gpus[0].fabric_state = 0  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: a PCIe card, a 2-GPU NVLink bridge
    fake.gpus[1].fabric_state, fake.gpus[1].fabric_status = 2, 21  # in progress, NVML_ERROR_IN_USE
    assert "fabric_state" not in backend.read(0, Tier.SLOW)
    got = backend.read(1, Tier.SLOW)
    assert (got["fabric_state"], got["fabric_status_ok"]) == ("in_progress", False)
    fake.gpus[1].fabric_state, fake.gpus[1].fabric_status = 3, 0  # the fabric manager finished
    got = backend.read(1, Tier.SLOW)
    assert (got["fabric_state"], got["fabric_status_ok"]) == ("completed", True)
    fake.gpus[0].fabric_state = 3
    assert "fabric_state" not in backend.read(0, Tier.SLOW)  # not supported is remembered, not asked again
    fake.fail("nvmlDeviceGetGpuFabricInfo", 13)  # FUNCTION_NOT_FOUND: a driver older than 525
    assert "fabric_state" not in backend.read(1, Tier.SLOW)
    assert backend.take_errors() == {}


def test_static_tier(fake: FakeNvml, backend: NvmlBackend) -> None:
    got = dict(backend.read(1, Tier.STATIC))
    assert set(got) == answered_on_a_first_read(Tier.STATIC)
    expected = {
        "name": "NVIDIA H200",
        "pci_bus_id": "00000000:28:00.0",
        "serial": "1650024010001",
        "vbios_version": "96.00.AF.00.01",
        "compute_capability": "9.0",
        "minor_number": 1,
        "temperature_shutdown_threshold_celsius": 95.0,
        "temperature_slowdown_threshold_celsius": 90.0,
        "memory_temperature_max_operating_celsius": 95.0,
        "temperature_max_operating_celsius": 87.0,
        "clocks_max_hertz": {"graphics": 1980e6, "sm": 1980e6, "memory": 3201e6},
        "pcie_link_generation_max": 5,
        "pcie_link_width_max": 16,
        "p2p_status": tuple(P2pStatus(0, cap, True) for cap in ("read", "write", "nvlink", "atomics")),
        "topology_level": {"0": "nvlink"},
    }
    assert {name: got[name] for name in expected} == expected


def test_each_tier_returns_only_its_own_fields_and_covers_the_rest(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].fans_percent = [40, 45]
    fake.gpus[0].retired_pages = {0: [1, 2], 1: []}
    fake.gpus[0].gpm_metrics = {GPM.NVML_GPM_METRIC_SM_UTIL: 10.0}
    seen: set[str] = set()
    for _ in range(2):  # GPM needs two samples
        for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC):
            got = set(backend.read(0, tier))
            assert got <= fields_of_tier(tier), f"{tier}: {got - fields_of_tier(tier)}"
            seen |= got
    expected = (fields_of_tier(Tier.FAST) | fields_of_tier(Tier.SLOW) | fields_of_tier(Tier.STATIC)) - GPM_FIELDS
    assert expected - seen == set()
    assert "sm_active_ratio" in seen
    assert backend.read(0, Tier.DAEMON) == {}


def test_fans_and_retired_pages_when_present(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].fans_percent = [40, 45]
    fake.gpus[0].retired_pages = {0: [1, 2, 3], 1: [9]}
    assert backend.read(0, Tier.FAST)["fan_speed_ratios"] == {"0": 0.40, "1": 0.45}
    slow = backend.read(0, Tier.SLOW)
    assert slow["retired_pages"] == {"single_bit": 3, "double_bit": 1}
    assert slow["retired_pages_pending"] is False


def test_memory_falls_back_to_v1_without_reserved(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.fail("nvmlDeviceGetMemoryInfo_v2", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    for _ in range(3):
        got = backend.read(0, Tier.FAST)
    assert got["memory_used_bytes"] == (2048 + 550) * MIB
    assert got["memory_total_bytes"] == 143771 * MIB
    assert "memory_reserved_bytes" not in got
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1


def test_host_versions(fake: FakeNvml, backend: NvmlBackend) -> None:
    host = backend.host()
    assert (host.driver_version, host.cuda_driver_version, host.nvml_version) == ("580.159.04", "13.0", "13.580.159.04")
    fake.cuda_version = 12040
    assert backend.host().cuda_driver_version == "12.4"


def test_uuid_and_count(backend: NvmlBackend) -> None:
    assert backend.device_count() == 2
    assert backend.uuid(1) == "GPU-00000001-1111-2222-3333-444444444444"


# ---- NOT_SUPPORTED ----------------------------------------------------------
def test_not_supported_is_omitted_and_never_asked_again(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=0)
    fake.gpus[0].memory_temperature = None
    fake.gpus[0].pcie_bytes = {}  # both PCIe byte counters NOT_SUPPORTED too
    for _ in range(4):
        fast0 = backend.read(0, Tier.FAST)
        slow0 = backend.read(0, Tier.SLOW)
        fast1 = backend.read(1, Tier.FAST)
    assert "power_watts" not in fast0 and "memory_temperature_celsius" not in fast0
    assert fast1["power_watts"] == 75.5
    assert "retired_pages" not in slow0
    # GPU 0 asked once, GPU 1 every time
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1 + 4
    assert "pcie_bytes_total" not in slow0
    # memory temperature and PCIe bytes asked once on GPU 0; memory temperature on every read of GPU 1;
    # GPU 0's NVLink error fields, recovery action and violation counters (supported) on each of its 4 slow reads
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2 + 4 + 4 + 4 + 4
    assert fake.calls["nvmlDeviceGetNumFans"] == 2  # no fans on SXM: once per GPU
    assert fake.calls["nvmlDeviceGetRetiredPages"] == 2  # both causes, once
    assert backend.take_errors() == {}


def test_one_unsupported_item_keeps_the_rest_of_its_group(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].violation_fields = False  # a driver without NVML_FI_DEV_PERF_POLICY_*: one call per policy
    del fake.gpus[0].violations_ns[1]  # thermal violation counter not supported
    for _ in range(3):
        got = backend.read(0, Tier.SLOW)
    assert got["throttle_seconds_total"] == {"power": 2.5}
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 8 + 2  # 8 policies once, then only power


def test_violation_counters_come_from_one_field_values_call(fake: FakeNvml, backend: NvmlBackend) -> None:
    """The eight nvmlDeviceGetViolationStatus calls cost ~5.7 ms of CPU per GPU on an H200, the one
    field-values call for NVML_FI_DEV_PERF_POLICY_* 0.6 ms: the slow read asks the fields."""
    fake.gpus[0].violations_ns = {0: 2_500_000_000, 1: 0, 4: 17_673_341_248}
    before = fake.calls["nvmlDeviceGetFieldValues"]
    got = backend.read(0, Tier.SLOW)
    assert got["throttle_seconds_total"] == {"power": 2.5, "thermal": 0.0, "low_utilization": 17.673341248}
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 0
    assert (
        fake.calls["nvmlDeviceGetFieldValues"] - before == 4
    )  # NVLink errors, PCIe bytes, recovery action, violations


def test_a_driver_without_the_violation_fields_is_asked_per_policy(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].violation_fields = False
    reads = [backend.read(0, Tier.SLOW)["throttle_seconds_total"] for _ in range(3)]
    assert reads == [{"power": 2.5, "thermal": 0.0}] * 3
    # all 8 policies on the first read (6 not supported, remembered), then the two the GPU has
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 8 + 2 + 2
    assert backend.take_errors() == {}


def test_nvlink_links_are_counted_once(fake: FakeNvml, backend: NvmlBackend) -> None:
    backend.read(0, Tier.FAST)
    first = fake.calls["nvmlDeviceGetNvLinkState"]
    assert first == (18 + 1) + 18  # probe: 18 links and the INVALID_ARGUMENT that ends them; then the read
    backend.read(0, Tier.FAST)
    assert fake.calls["nvmlDeviceGetNvLinkState"] - first == 18


def test_nvlink_errors_are_nvidia_smis_three_from_field_values_per_link(fake: FakeNvml, backend: NvmlBackend) -> None:
    """nvidia-smi nvlink -e shows Replay, Recovery and CRC Errors per link: NVML_FI_DEV_NVLINK_ERROR_DL_*.

    DL_CRC_DATA / DL_ECC_DATA (nvmlDeviceGetNvLinkErrorCounter 3 and 4) grow on healthy H200 links and
    are not errors to nvidia-smi: they are not reported at all.
    """
    fake.gpus[0].nvlink_error_fields = {161: 1, 162: 2, 163: 3}
    got = backend.read(0, Tier.SLOW)["nvlink_errors_total"]
    assert got == {str(link): {"replay": 1, "recovery": 2, "crc": 3} for link in range(18)}
    assert fake.calls["nvmlDeviceGetNvLinkErrorCounter"] == 0
    assert fake.calls["nvmlDeviceGetFieldValues"] >= 1


def test_the_daemons_backend_asks_for_nvlink_errors_at_most_every_five_minutes(fake: FakeNvml) -> None:
    # one field-values call for 18 links x 3 types costs ~43 ms of CPU per GPU on an H100
    now = [0.0]
    backend = NvmlBackend(fake, clock=lambda: now[0], spaced=True)
    backend.init()
    asked: list[float] = []
    original = fake.nvmlDeviceGetFieldValues

    def counted(h: object, ids: list[object]) -> object:
        if any(isinstance(i, tuple) for i in ids):  # (field, link): the NVLink error counters
            asked.append(now[0])
        return original(h, ids)  # type: ignore[arg-type]

    fake.nvmlDeviceGetFieldValues = counted  # type: ignore[method-assign]
    fake.gpus[0].nvlink_error_fields = {161: 0, 162: 0, 163: 0}
    seen = []
    for _ in range(7):  # a slow read every 100 s
        fake.gpus[0].nvlink_error_fields[161] += 1  # a replay on every link every 100 s
        seen.append(backend.read(0, Tier.SLOW)["nvlink_errors_total"]["0"]["replay"])
        now[0] += 100.0
    assert asked == [0.0, 300.0, 600.0]
    assert seen == [1, 1, 1, 4, 4, 4, 7], "between calls, the counters of the last call"
    assert NVLINK_ERRORS_SECONDS == 300.0
    fresh = NvmlBackend(fake, clock=lambda: now[0])  # gpumon burn, once, health: every read asks
    fresh.init()
    fake.gpus[0].nvlink_error_fields[161] = 10
    first = fresh.read(0, Tier.SLOW)["nvlink_errors_total"]["0"]["replay"]
    fake.gpus[0].nvlink_error_fields[161] = 12
    assert (first, fresh.read(0, Tier.SLOW)["nvlink_errors_total"]["0"]["replay"]) == (10, 12)


def test_only_gpumon_run_spaces_the_nvlink_error_counters() -> None:
    from gpumon.backends.factory import make_backend

    daemon, other = make_backend("nvml", daemon=True), make_backend("nvml")
    assert isinstance(daemon, NvmlBackend) and isinstance(other, NvmlBackend)
    assert (daemon._ctx.spaced, other._ctx.spaced) == (True, False)


def test_nvlink_errors_fall_back_to_the_error_counter_api_without_the_fields(fake: FakeNvml) -> None:
    fake.gpus[0].nvlink_error_fields = {}  # a driver without NVML_FI_DEV_NVLINK_ERROR_DL_*
    b = NvmlBackend(fake)
    b.init()
    for _ in range(2):
        got = b.read(0, Tier.SLOW)["nvlink_errors_total"]
    assert got == {str(link): {"replay": 0, "recovery": 0, "crc": 4} for link in range(18)}
    assert all("crc_data" not in c and "ecc_data" not in c for c in got.values())
    assert fake.nvlink_counters_asked == {
        0,
        1,
        2,
    }  # DL_REPLAY, DL_RECOVERY, DL_CRC_FLIT; never DL_CRC_DATA (3) or DL_ECC_DATA (4)


def test_gpu_without_nvlink_has_no_nvlink_fields(fake: FakeNvml) -> None:
    nv = FakeNvml([FakeGpu(index=0)])
    b = NvmlBackend(nv)
    b.init()
    for _ in range(3):
        fast, slow = b.read(0, Tier.FAST), b.read(0, Tier.SLOW)
    assert "nvlink_up" not in fast and "nvlink_errors_total" not in slow
    assert nv.calls["nvmlDeviceGetNvLinkState"] == 1
    assert "p2p_status" not in b.read(0, Tier.STATIC)


def test_process_utilization_without_new_samples_is_not_unsupported(fake: FakeNvml) -> None:
    now = [0.0]
    backend = NvmlBackend(fake, clock=lambda: now[0])
    backend.init()
    fake.gpus[0].processes = [(77, 5 * MIB)]
    assert backend.read(0, Tier.FAST)["processes"] == (ProcessSnapshot(77, 5 * MIB),)  # NOT_FOUND: no samples yet
    fake.gpus[0].process_samples = [(77, 100, 30)]
    now[0] += PROCESS_UTILIZATION_SECONDS
    assert backend.read(0, Tier.FAST)["processes"] == (ProcessSnapshot(77, 5 * MIB, sm_utilization_ratio=0.3),)
    # nothing newer than timestamp 100: no share this time, and still asked next time
    now[0] += PROCESS_UTILIZATION_SECONDS
    assert backend.read(0, Tier.FAST)["processes"] == (ProcessSnapshot(77, 5 * MIB),)
    fake.gpus[0].process_samples.append((77, 200, 90))
    now[0] += PROCESS_UTILIZATION_SECONDS
    assert backend.read(0, Tier.FAST)["processes"][0].sm_utilization_ratio == 0.9


def test_process_sm_share_costs_one_call_per_interval_and_a_new_pid_is_read_at_once(fake: FakeNvml) -> None:
    # nvmlDeviceGetProcessUtilization costs 1.7-2.7 ms of CPU a call on an H200 (the pid list 10-30 us)
    now = [0.0]
    backend = NvmlBackend(fake, clock=lambda: now[0])
    backend.init()
    gpu = fake.gpus[0]
    gpu.processes, gpu.process_samples = [(77, 5 * MIB)], [(77, 100, 30)]
    asked: list[float] = []
    original = fake.nvmlDeviceGetProcessUtilization

    def counted(h: object, timestamp: int) -> object:
        asked.append(now[0])
        return original(h, timestamp)

    fake.nvmlDeviceGetProcessUtilization = counted  # type: ignore[method-assign]
    shares = []
    for second in range(12):
        now[0] = float(second)
        if second == 7:  # a second process starts: its share is read at once, not at second 10
            gpu.processes = [(77, 5 * MIB), (88, 7 * MIB)]
            gpu.process_samples += [(77, 700, 40), (88, 700, 60)]
        shares.append({p.pid: p.sm_utilization_ratio for p in backend.read(0, Tier.FAST)["processes"]})
    assert asked == [0.0, 5.0, 7.0]
    assert shares[0] == shares[4] == {77: 0.3}  # kept between reads, the pid list read every poll
    assert shares[7] == shares[11] == {77: 0.4, 88: 0.6}
    assert backend.take_errors() == {}


def test_an_older_binding_without_a_function_omits_its_fields(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("nvmlDeviceGetNumFans", "nvmlGpmQueryDeviceSupport", "nvmlDeviceGetSupportedClocksEventReasons"):
        monkeypatch.delattr(FakeNvml, name)
    fake.gpus[0].fans_percent = [50]
    backend = NvmlBackend(fake)
    backend.init()
    for _ in range(2):
        got = backend.read(0, Tier.FAST)
    assert "fan_speed_ratios" not in got and "sm_active_ratio" not in got
    assert got["power_watts"] == 75.5
    assert backend.take_errors() == {}


def test_older_binding_spelling_of_clock_reasons_is_used(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        FakeNvml,
        "nvmlDeviceGetSupportedClocksThrottleReasons",
        FakeNvml.nvmlDeviceGetSupportedClocksEventReasons,
        raising=False,
    )
    monkeypatch.setattr(
        FakeNvml,
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        FakeNvml.nvmlDeviceGetCurrentClocksEventReasons,
        raising=False,
    )
    monkeypatch.delattr(FakeNvml, "nvmlDeviceGetSupportedClocksEventReasons")
    monkeypatch.delattr(FakeNvml, "nvmlDeviceGetCurrentClocksEventReasons")
    fake.gpus[0].clock_events_supported = 0x1 | 0x4 | 0x40
    fake.gpus[0].clock_events_current = 0x40
    backend = NvmlBackend(fake)
    backend.init()
    assert backend.read(0, Tier.FAST)["clock_events_active"] == {
        "gpu_idle": False,
        "sw_power_cap": False,
        "hw_thermal_slowdown": True,
    }


# ---- partial failures -------------------------------------------------------
def test_one_failing_reader_spoils_nothing_else(
    fake: FakeNvml, backend: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_NO_PERMISSION, gpu=0)
    with caplog.at_level(logging.WARNING, logger="gpumon.backends.nvml"):
        got = backend.read(0, Tier.FAST)
        backend.read(0, Tier.FAST)
    assert "temperature_celsius" not in got
    assert got["power_watts"] == 75.5 and got["utilization_ratio"] == 0.37
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "GPU 0 temperature" in warnings[0] and "Insufficient Permissions" in warnings[0]
    assert backend.take_errors() == {"fast": 2}
    assert backend.take_errors() == {}
    fake.heal("nvmlDeviceGetTemperature", gpu=0)  # not cached as unsupported: read again next time
    assert backend.read(0, Tier.FAST)["temperature_celsius"] == 31.0
    assert backend.take_errors() == {}


def test_every_reader_failing_still_returns_and_counts(fake: FakeNvml, backend: NvmlBackend) -> None:
    for name in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetEccMode"):
        fake.fail(name, pynvml.NVML_ERROR_TIMEOUT)
    got = backend.read(1, Tier.SLOW)
    assert "power_limit_watts" not in got and "ecc_mode_enabled" not in got and "pcie_replays_total" in got
    assert backend.take_errors() == {"slow": 3}


def test_nvml_gone_during_a_read_is_nvml_unavailable(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.fail("nvmlDeviceGetUtilizationRates", pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    with pytest.raises(NvmlUnavailableError):
        backend.read(0, Tier.FAST)


# ---- lost GPUs --------------------------------------------------------------
@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_RESET_REQUIRED, pynvml.NVML_ERROR_GPU_NOT_FOUND]
)
def test_lost_gpu_is_reported_and_the_other_keeps_reporting(fake: FakeNvml, backend: NvmlBackend, code: int) -> None:
    backend.read(1, Tier.FAST)
    fake.fail("nvmlDeviceGetMemoryInfo_v2", code, gpu=1)
    with pytest.raises(GpuLostError) as err:
        backend.read(1, Tier.FAST)
    assert err.value.index == 1 and err.value.reason
    assert backend.read(0, Tier.FAST)["power_watts"] == 75.5
    assert backend.uuid(1) == fake.gpus[1].uuid  # identity is kept


@pytest.mark.parametrize(
    ("function", "reader"),
    [
        ("nvmlDeviceGetTemperature", "temperature"),
        ("nvmlDeviceGetMemoryInfo_v2", "memory"),  # a liveness read: utilization still answers
        ("nvmlDeviceGetPowerUsage", "power"),
    ],
)
def test_unknown_on_one_field_is_that_fields_error_not_a_lost_gpu(
    fake: FakeNvml, backend: NvmlBackend, function: str, reader: str
) -> None:
    first = backend.read(1, Tier.FAST)
    reader_fields = set(backend.read_group(0, reader))
    fake.fail(function, pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    for _ in range(10):  # stuck on UNKNOWN: never lost, never flapping
        got = backend.read(1, Tier.FAST)
        assert got.keys() == first.keys() - reader_fields, "only that reader's fields are missing"
    assert backend.take_errors() == {"fast": 10}
    assert backend.read_errors() == {(1, fake.gpus[1].uuid, reader): 10}
    assert fake.calls["nvmlDeviceGetNumFans"] == 1, "the GPU's caches were not reset"
    fake.heal(function, gpu=1)
    assert backend.read(1, Tier.FAST).keys() == first.keys()


@pytest.mark.parametrize(
    ("function", "reader", "tier"),
    [
        ("nvmlDeviceGetDecoderUtilization", "video", Tier.FAST),  # after the encoder answered
        ("nvmlDeviceGetSerial", "identity", Tier.STATIC),  # after the name and the PCI info answered
    ],
)
def test_a_reader_failing_after_some_of_its_calls_answered_leaves_all_its_fields_out(
    fake: FakeNvml, backend: NvmlBackend, function: str, reader: str, tier: Tier
) -> None:
    first = backend.read(1, tier)
    reader_fields = set(backend.read_group(1, reader))
    assert reader_fields and reader_fields <= first.keys()
    fake.fail(function, pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    got = backend.read(1, tier)
    assert got.keys() == first.keys() - reader_fields, "a reader that raised wrote none of its fields"
    assert backend.read_errors() == {(1, fake.gpus[1].uuid, reader): 1}


def test_liveness_reads_failing_three_times_in_a_row_make_the_gpu_lost(fake: FakeNvml, backend: NvmlBackend) -> None:
    backend.read(1, Tier.FAST)
    for function in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetUtilizationRates"):
        fake.fail(function, pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    for _ in range(2):
        assert backend.read(1, Tier.FAST)["power_watts"] == 75.5  # not yet: one bad poll is not a lost GPU
    with pytest.raises(GpuLostError, match=r"utilization: Unknown Error \(3 read\(s\) in a row"):
        backend.read(1, Tier.FAST)
    with pytest.raises(GpuLostError):  # re-probed: the handle answers but the GPU does not; no flapping
        backend.read(1, Tier.FAST)
    assert backend.read(0, Tier.FAST)["power_watts"] == 75.5
    fake.heal("nvmlDeviceGetMemoryInfo_v2", gpu=1)  # one liveness read answers again: up
    assert backend.read(1, Tier.FAST)["memory_used_bytes"] == 2048 * MIB


def test_a_liveness_read_that_answers_between_failures_restarts_the_count(fake: FakeNvml, backend: NvmlBackend) -> None:
    for _ in range(5):
        for function in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetUtilizationRates"):
            fake.fail(function, pynvml.NVML_ERROR_UNKNOWN, gpu=0)
        backend.read(0, Tier.FAST)
        backend.read(0, Tier.FAST)
        fake.heal("nvmlDeviceGetUtilizationRates", gpu=0)
        assert "utilization_ratio" in backend.read(0, Tier.FAST)


def test_lost_gpu_is_reprobed_when_it_returns(fake: FakeNvml, backend: NvmlBackend) -> None:
    backend.read(1, Tier.FAST)
    fake.lost.add(1)
    for _ in range(2):
        with pytest.raises(GpuLostError, match="GPU is lost"):
            backend.read(1, Tier.FAST)
    handles_before = fake.calls["nvmlDeviceGetHandleByIndex"]
    fans_before = fake.calls["nvmlDeviceGetNumFans"]
    fake.lost.discard(1)
    got = backend.read(1, Tier.FAST)
    assert got["power_watts"] == 75.5
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == handles_before + 1  # handle re-acquired
    assert fake.calls["nvmlDeviceGetNumFans"] == fans_before + 1  # capabilities re-probed
    backend.read(1, Tier.FAST)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == handles_before + 1  # only once


def test_gpu_lost_at_start_reports_lost_then_recovers(fake: FakeNvml) -> None:
    fake.fail("nvmlDeviceGetUUID", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=1)
    fake.lost.add(1)
    backend = NvmlBackend(fake)
    backend.init()
    assert backend.device_count() == 2
    with pytest.raises(GpuLostError):
        backend.read(1, Tier.FAST)
    with pytest.raises(GpuLostError):
        backend.uuid(1)
    fake.lost.clear()
    fake.heal("nvmlDeviceGetUUID", gpu=1)
    assert backend.read(1, Tier.STATIC)["pci_bus_id"] == "00000000:28:00.0"
    assert backend.uuid(1) == fake.gpus[1].uuid


def test_index_that_names_another_gpu_after_a_loss_stays_lost(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.lost.add(1)
    with pytest.raises(GpuLostError):
        backend.read(1, Tier.FAST)
    fake.lost.clear()
    fake.gpus[1].uuid = "GPU-someone-else"
    with pytest.raises(GpuLostError, match="now names GPU-someone-else"):
        backend.read(1, Tier.FAST)


# ---- P2P and topology ---------------------------------------------------------
def test_p2p_probes_each_capability_and_omits_the_one_that_raises(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].p2p_errors = {0}  # the read index raises an argument error
    fake.gpus[0].p2p[(1, 3)] = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED  # no atomics
    got = backend.read(0, Tier.STATIC)["p2p_status"]
    assert got == (P2pStatus(1, "write", True), P2pStatus(1, "nvlink", True), P2pStatus(1, "atomics", False))
    assert backend.take_errors() == {}


def test_topology_levels_and_nvlink_detection() -> None:
    gpus = [FakeGpu(index=i) for i in range(4)]
    # 0 and 1: NVLink bridge (remote PCI id in NVML's other spelling); 2 and 3: PCIe only
    gpus[0].nvlink_states, gpus[0].nvlink_remote_bus_ids = [1, 1], ["0000:28:00.0", "0000:28:00.0"]
    gpus[1].nvlink_states, gpus[1].nvlink_remote_bus_ids = [1, 1], [gpus[0].bus_id] * 2
    for g in gpus:
        for peer in range(4):
            g.p2p[(peer, 2)] = pynvml.NVML_P2P_STATUS_NOT_SUPPORTED  # NVLink P2P not reported
    gpus[0].topology = {
        1: pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
        2: pynvml.NVML_TOPOLOGY_NODE,
        3: pynvml.NVML_TOPOLOGY_SYSTEM,
    }
    gpus[2].topology = {3: pynvml.NVML_TOPOLOGY_SINGLE}
    b = NvmlBackend(FakeNvml(gpus))
    b.init()
    assert b.read(0, Tier.STATIC)["topology_level"] == {"1": "nvlink", "2": "node", "3": "system"}
    assert b.read(1, Tier.STATIC)["topology_level"]["0"] == "nvlink"
    assert b.read(2, Tier.STATIC)["topology_level"]["3"] == "single"


def test_topology_reports_nvlink_when_nvml_says_p2p_over_nvlink(fake: FakeNvml) -> None:
    # NVSwitch systems: links end at switches, not at the peer; NVML's NVLink P2P status decides.
    for g in fake.gpus:
        g.nvlink_remote_bus_ids = ["00000000:C5:00.0"] * 18
    b = NvmlBackend(fake)
    b.init()
    assert b.read(0, Tier.STATIC)["topology_level"] == {"1": "nvlink"}


# ---- GPM --------------------------------------------------------------------
GPM_VALUES = {
    GPM.NVML_GPM_METRIC_SM_UTIL: 80.0,
    GPM.NVML_GPM_METRIC_SM_OCCUPANCY: 40.0,
    GPM.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 65.0,
    GPM.NVML_GPM_METRIC_DRAM_BW_UTIL: 30.0,
    GPM.NVML_GPM_METRIC_FP64_UTIL: 0.0,
    GPM.NVML_GPM_METRIC_FP32_UTIL: 5.0,
    GPM.NVML_GPM_METRIC_FP16_UTIL: 1.0,
    GPM.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 1000.0,
    GPM.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 2000.0,
    GPM.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 10.0,
}


def test_gpm_metrics_from_the_second_slow_read(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].gpm_metrics = dict(GPM_VALUES)
    first = backend.read(0, Tier.SLOW)
    assert "sm_active_ratio" not in first  # one sample only
    second = backend.read(0, Tier.SLOW)
    assert {k: second[k] for k in second if k.endswith("_ratio") and not k.startswith(("util", "memory"))} == {
        "sm_active_ratio": 0.8,
        "sm_occupancy_ratio": 0.4,
        "tensor_active_ratio": 0.65,
        "dram_active_ratio": 0.3,
        "fp64_active_ratio": 0.0,
        "fp32_active_ratio": 0.05,
        "fp16_active_ratio": 0.01,
    }
    # MiB/s -> bytes/s; PCIe rx not offered by this GPU: omitted
    assert second["gpm_throughput_bytes_per_second"] == {
        "nvlink_tx": 1000.0 * MIB,
        "nvlink_rx": 2000.0 * MIB,
        "pcie_tx": 10.0 * MIB,
    }
    assert backend.read(0, Tier.SLOW)["tensor_active_ratio"] == 0.65  # and on every read after
    assert fake.calls["nvmlGpmSampleAlloc"] == 2  # two samples per GPU, reused
    backend.shutdown()
    assert fake.gpm_samples_live == 0


def test_gpm_unsupported_gpu_is_asked_once(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[1].gpm_supported = False
    for _ in range(3):
        got = backend.read(1, Tier.SLOW)
    assert not any(k.startswith(("sm_", "tensor_", "dram_", "fp", "gpm_")) for k in got)
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1
    assert fake.calls["nvmlGpmSampleGet"] == 0


def test_gpm_samples_are_dropped_with_a_lost_gpu_and_taken_anew(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[1].gpm_metrics = dict(GPM_VALUES)
    backend.read(1, Tier.SLOW)
    fake.lost.add(1)
    with pytest.raises(GpuLostError):
        backend.read(1, Tier.SLOW)
    assert fake.gpm_samples_live == 0
    fake.lost.clear()
    assert "sm_active_ratio" not in backend.read(1, Tier.SLOW)
    assert backend.read(1, Tier.SLOW)["sm_active_ratio"] == 0.8


# ---- events -----------------------------------------------------------------
def test_xid_event_is_delivered_with_the_gpu_identity(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.push_event(1, 79)
    events = backend.wait_events(1.0)
    assert len(events) == 1
    e = events[0]
    assert (e.xid, e.source, e.gpu_index, e.uuid, e.pci_bus_id) == (
        79,
        "nvml",
        1,
        fake.gpus[1].uuid,
        "00000000:28:00.0",
    )
    assert e.timestamp_seconds > 0


def test_wait_times_out_cleanly(fake: FakeNvml, backend: NvmlBackend) -> None:
    assert backend.wait_events(0.05) == []
    assert fake.calls["nvmlEventSetCreate"] == 1
    assert backend.wait_events(0.05) == []
    assert fake.calls["nvmlEventSetCreate"] == 1  # one event set for the life of the backend


def test_a_burst_comes_back_in_one_wait_and_non_xid_events_are_not_xids(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.push_event(0, 13)
    fake.push_event(0, 0, event_type=0x2)  # double-bit ECC event: logged, not an XID
    fake.push_event(0, 13)
    fake.push_event(1, 48)
    assert [(e.gpu_index, e.xid) for e in backend.wait_events(1.0)] == [(0, 13), (0, 13), (1, 48)]


def test_event_arriving_during_the_wait_is_seen_at_once(fake: FakeNvml, backend: NvmlBackend) -> None:
    result: list[list[int]] = []
    waiter = threading.Thread(target=lambda: result.append([e.xid for e in backend.wait_events(30.0)]))
    waiter.start()
    while fake.calls["nvmlEventSetWait_v2"] == 0:  # the wait has begun
        threading.Event().wait(0.001)
    fake.push_event(0, 94)
    waiter.join(timeout=10)
    assert result == [[94]]


def test_gpu_lost_inside_the_wait_and_the_others_keep_being_served(fake: FakeNvml, backend: NvmlBackend) -> None:
    backend.wait_events(0.01)
    fake.lose_in_wait = 1
    with pytest.raises(GpuLostError) as err:
        backend.wait_events(1.0)
    assert err.value.index == 1
    fake.push_event(0, 31)
    assert [(e.gpu_index, e.xid) for e in backend.wait_events(1.0)] == [(0, 31)]
    # GPU 1 answers again: after a successful read it is registered again
    fake.lost.clear()
    backend.read(1, Tier.FAST)
    fake.push_event(1, 43)
    assert [(e.gpu_index, e.xid) for e in backend.wait_events(1.0)] == [(1, 43)]


def test_gpu_without_xid_events_is_skipped(fake: FakeNvml, backend: NvmlBackend) -> None:
    fake.gpus[0].supported_events = 0
    fake.push_event(1, 62)
    assert [e.gpu_index for e in backend.wait_events(1.0)] == [1]


def test_shutdown_never_waits_for_an_event_wait_nor_shuts_nvml_down_under_it(
    fake: FakeNvml, backend: NvmlBackend
) -> None:
    """The event thread's wait may last seconds: a stop does not wait for it, and leaves the event set
    and NVML as they are (the process's exit frees them) rather than shut NVML down under the wait."""
    result: list[list[int]] = []
    waiter = threading.Thread(target=lambda: result.append([e.xid for e in backend.wait_events(30.0)]))
    waiter.start()
    while fake.calls["nvmlEventSetWait_v2"] == 0:  # the wait has begun
        threading.Event().wait(0.001)
    began = time.monotonic()
    backend.shutdown()
    assert time.monotonic() - began < 1.0
    assert fake.calls["nvmlShutdown"] == 0 and fake.calls["nvmlEventSetFree"] == 0
    fake.push_event(0, 79)  # the wait goes on, on a set never freed under it
    waiter.join(timeout=10)
    assert result == [[79]]


def test_nvml_gone_under_an_event_wait_is_initialised_again_only_after_the_wait(
    fake: FakeNvml, backend: NvmlBackend
) -> None:
    """The poller shuts the backend down when NVML went away and initialises it again later: with
    the event thread inside a wait, NVML is shut down after that wait ends, then initialised afresh."""
    waiter = threading.Thread(target=lambda: backend.wait_events(30.0))
    waiter.start()
    while fake.calls["nvmlEventSetWait_v2"] == 0:
        threading.Event().wait(0.001)
    backend.shutdown()
    with pytest.raises(NvmlUnavailableError):
        backend.init()  # not over the old session while the wait runs
    assert fake.calls["nvmlShutdown"] == 0 and fake.calls["nvmlInit"] == 1
    fake.push_event(0, 79)
    waiter.join(timeout=10)
    assert fake.calls["nvmlEventSetFree"] == 1 and fake.calls["nvmlShutdown"] == 1  # as the wait ended
    backend.init()
    assert fake.calls["nvmlShutdown"] == 1 and fake.calls["nvmlInit"] == 2
    fake.push_event(1, 48)
    assert [(e.gpu_index, e.xid) for e in backend.wait_events(1.0)] == [(1, 48)]  # a fresh set


def test_event_wait_after_shutdown_returns_nothing(fake: FakeNvml, backend: NvmlBackend) -> None:
    backend.wait_events(0.01)
    backend.shutdown()
    assert fake.calls["nvmlEventSetFree"] == 1
    assert backend.wait_events(0.01) == []


# ---- never change a card ----------------------------------------------------------
MUTATING = re.compile(
    r"nvml(Device|Unit|System|Vgpu\w*|GpuInstance|ComputeInstance|Gpm)"
    r"(Set|Clear|Reset|Freeze|Modify|Remove|Discover|Create|Destroy)\w*"
    r"|ResetGpu"
)


def test_gpumon_never_calls_an_nvml_function_that_changes_a_gpu() -> None:
    root = Path(__file__).resolve().parent.parent / "gpumon"
    offenders = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in {".py", ".yaml", ".yml", ".json", ".toml", ".txt", ".sh"}:
            for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if MUTATING.search(line):
                    offenders.append(f"{path.relative_to(root.parent)}:{lineno}: {line.strip()}")
    assert offenders == []


def test_the_mutation_check_would_catch_a_setter() -> None:
    for call in (
        "nv.nvmlDeviceSetPowerManagementLimit(h, 1)",
        "nvmlDeviceClearEccErrorCounts",
        "nvmlDeviceResetGpuLockedClocks",
        "nvmlDeviceSetPersistenceMode",
        "nvmlDeviceSetMigMode",
        "nvmlGpmSetStreamingEnabled",
        "nvmlDeviceModifyDrainState",
        "ResetGpu",
    ):
        assert MUTATING.search(call), call
    for call in ("nvmlEventSetCreate", "nvmlEventSetWait_v2", "nvmlDeviceGetPowerUsage", "nvmlGpmSampleGet"):
        assert not MUTATING.search(call), call


def test_a_link_whose_error_fields_fail_is_omitted_and_the_other_links_still_report(fake: FakeNvml) -> None:
    real = fake.nvmlDeviceGetFieldValues

    def one_link_down(h, ids):  # type: ignore[no-untyped-def]
        out = real(h, ids)
        for v, requested in zip(out, ids, strict=True):
            if isinstance(requested, tuple) and requested[1] == 5:
                v.nvmlReturn = pynvml.NVML_ERROR_INVALID_ARGUMENT
        return out

    fake.nvmlDeviceGetFieldValues = one_link_down  # type: ignore[method-assign]
    b = NvmlBackend(fake)
    b.init()
    got = b.read(0, Tier.SLOW)["nvlink_errors_total"]
    assert "5" not in got and got["4"] == {"replay": 0, "recovery": 0, "crc": 4} and len(got) == 17


# ---- the package: one reader module per subsystem ------------------------------
def test_every_subsystem_modules_readers_are_run_once_in_their_tier(backend: NvmlBackend) -> None:
    from gpumon.backends.nvml.registry import SUBSYSTEMS, collect_readers

    declared = [(spec.name, spec.tier) for module in SUBSYSTEMS for spec in module.READERS]
    names = [name for name, _ in declared]
    assert len(names) == len(set(names)), "reader names are unique (read_errors' reader label)"
    for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC):
        assert sorted(spec.name for spec in collect_readers()[tier]) == sorted(
            name for name, t in declared if t is tier
        )
    static = [spec.name for spec in collect_readers()[Tier.STATIC]]
    assert static.index("identity") < static.index("topology")  # topology uses the peers' bus ids


def test_a_reader_found_unsupported_leaves_the_gpus_plan_and_the_other_gpu_keeps_it(
    fake: FakeNvml, backend: NvmlBackend
) -> None:
    backend.read(0, Tier.FAST)
    backend.read(1, Tier.FAST)
    fake.fail("nvmlDeviceGetPerformanceState", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=0)
    for _ in range(3):
        assert "performance_state" not in backend.read(0, Tier.FAST)
        assert "performance_state" in backend.read(1, Tier.FAST)
    assert fake.calls["nvmlDeviceGetPerformanceState"] == 2 + 1 + 3  # GPU 0 asked once after the failure


def test_gather_keeps_what_answers_remembers_what_is_unsupported_and_says_when_nothing_answers() -> None:
    from gpumon.backends.nvml.codes import Unsupported
    from gpumon.backends.nvml.reader import GpuState, gather

    g = GpuState(index=0, handle="h", uuid="GPU-x")
    asked: list[str] = []

    def call(name: str) -> int:
        asked.append(name)
        if name == "b":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 0 if name == "c" else 7

    calls = [(name, f"k.{name}", call, (name,)) for name in "abc"]
    assert gather(g, calls, lambda v: v * 2) == {"a": 14, "c": 0}
    assert gather(g, calls, lambda v: v * 2, zero_is_absent=True) == {"a": 14}
    assert asked == ["a", "b", "c", "a", "c"] and "k.b" in g.unsupported
    with pytest.raises(Unsupported):
        gather(g, calls[1:2], int)

    def unknown() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    with pytest.raises(pynvml.NVMLError):  # any other error is the core's to sort
        gather(g, [("a", "k.a", call, ("a",)), ("u", "k.u", unknown, ())], int)
    assert "k.u" not in g.unsupported
