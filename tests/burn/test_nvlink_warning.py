"""The burn warns about NVLink errors only when a counter that nvidia-smi nvlink -e shows as an error grows."""

from __future__ import annotations

from gpumon.backends.nvml import NvmlBackend
from gpumon.burn.orchestration.watcher import Watcher, summarise
from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.thresholds import Thresholds
from tests.burn.test_judge_rules import _node
from tests.fake_pynvml import h200_pair


def _burn_telemetry(grow: dict[str, dict[int, int]]) -> list[dict]:
    """The burn's telemetry checks for GPU 0 of a fake H200 pair whose NVLink counters grow during the burn."""
    fake = h200_pair()
    backend = NvmlBackend(fake)
    backend.init()
    watcher = Watcher(backend, (0,), interval_seconds=0.01, slow_interval_seconds=3600)
    watcher.start()
    g = fake.gpus[0]
    for counter, n in grow.get("counter", {}).items():
        g.nvlink_errors[counter] = g.nvlink_errors.get(counter, 0) + n
    for field_id, n in grow.get("field", {}).items():
        g.nvlink_error_fields[field_id] += n
    watcher.stop()
    tel = summarise(watcher.telemetry[0])
    j = judge([_node({0: {}}, telemetry={"0": tel})], Thresholds(), ("matmul",))
    return [c for c in j.checks if c["test"] == "telemetry"]


def test_data_crc_and_ecc_counters_growing_on_a_healthy_h200_give_no_warning():
    # as measured on 2xH200: DL_CRC_DATA and DL_ECC_DATA grow by hundreds a minute, nvidia-smi shows 0 errors
    checks = _burn_telemetry({"counter": {3: 352, 4: 500}})
    assert [c for c in checks if "(warning)" in c["detail"] or c["check"] == "nvlink_errors"] == []


def test_a_replay_error_nvidia_smi_would_show_is_a_warning_naming_the_link():
    checks = _burn_telemetry({"field": {161: 2}})  # NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY on every link
    nvl = [c for c in checks if c["check"] == "nvlink_errors"]
    assert len(nvl) == 1 and nvl[0]["passed"] is True
    assert "link 0: replay +2" in nvl[0]["detail"] and nvl[0]["detail"].endswith("(warning)")
