"""The ``nvidia-smi nvlink -e`` parser the GPU tests compare gpumon with (runs everywhere, no GPU needed)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.gpu.nvidia_smi_nvlink import parse_nvlink_errors, render_nvlink_errors

H200_SAMPLE = """GPU 0: NVIDIA H200 (UUID: GPU-2e2b6342-3996-51b9-5480-e20df571e09c)
\t Link 0: Replay Errors: 0
\t Link 0: Recovery Errors: 0
\t Link 0: CRC Errors: 0

\t Link 1: Replay Errors: 3
\t Link 1: Recovery Errors: 1
\t Link 1: CRC Errors: 12

GPU 1: NVIDIA H200 (UUID: GPU-67ff7ed1-19b8-1998-84ef-59fc0cbb0f3e)
\t Link 0: Replay Errors: 0
\t Link 0: Recovery Errors: N/A
\t Link 0: CRC Errors: 0
"""


def test_nvidia_smi_nvlink_e_of_an_h200_is_read_per_gpu_link_and_type():
    assert parse_nvlink_errors(H200_SAMPLE) == {
        0: {"0": {"replay": 0, "recovery": 0, "crc": 0}, "1": {"replay": 3, "recovery": 1, "crc": 12}},
        1: {"0": {"replay": 0, "crc": 0}},  # N/A is left out, as gpumon omits what NVML does not support
    }


_counters = st.dictionaries(
    st.sampled_from(["replay", "recovery", "crc", "effective_errors"]), st.integers(0, 2**64 - 1), min_size=1
)
_links = st.dictionaries(st.integers(0, 17).map(str), _counters, max_size=18)
_errors = st.dictionaries(st.integers(0, 63), _links, max_size=8)


@given(_errors, st.sampled_from(["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]))
def test_whatever_nvidia_smi_prints_reads_back_the_same(errors, name):
    text = render_nvlink_errors(errors, names={g: name for g in errors})
    assert parse_nvlink_errors(text) == errors


@given(st.text())
def test_any_text_gives_a_result_never_an_exception(text):
    parsed = parse_nvlink_errors(text)
    assert all(isinstance(n, int) and n >= 0 for links in parsed.values() for c in links.values() for n in c.values())


def test_nvidia_smi_clock_event_masks_give_each_gpus_hardware_slowdowns():
    from tests.gpu.nvidia_smi_clocks import active_slowdowns

    sample = "0, 0x0000000000000020\n1, 0x0000000000000004\n2, 0x00000000000000C8\n3, [N/A]\n"
    assert active_slowdowns(sample) == {
        0: {"sw_thermal_slowdown"},
        1: set(),  # a power cap slows every busy GPU alike: not a hardware slowdown
        2: {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"},
    }


@given(st.dictionaries(st.integers(0, 63), st.integers(0, 2**64 - 1), max_size=8))
def test_every_mask_nvidia_smi_can_print_is_read_back(masks: dict[int, int]):
    from tests.gpu.nvidia_smi_clocks import HARDWARE_SLOWDOWNS, active_slowdowns

    text = "".join(f"{gpu}, 0x{mask:016X}\n" for gpu, mask in masks.items())
    assert active_slowdowns(text) == {
        gpu: {name for name, bit in HARDWARE_SLOWDOWNS.items() if mask & bit} for gpu, mask in masks.items()
    }


def test_every_hardware_slowdown_the_gpu_tests_watch_has_words_in_gpumons_findings():
    from gpumon.health.stragglers import REASONS
    from tests.gpu.nvidia_smi_clocks import HARDWARE_SLOWDOWNS

    assert set(HARDWARE_SLOWDOWNS) <= set(REASONS)
