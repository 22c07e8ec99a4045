"""The name sets of dcgm-exporter's versions that ``--compat`` serves, and how one differs from another.

``dcgm``: dcgm-exporter up to 4.8.x (DCGM up to 4.5): the names gpumon/model/fields declare (``Dcgm``
twins), driver label ``DCGM_FI_DRIVER_VERSION``, host label ``Hostname`` (dcgm-exporter 4.8.3
renamed it ``hostname``: ``--compat-hostname-label hostname`` for those).

``dcgm-4.9``: dcgm-exporter 4.9 (DCGM 4.7), which serves DCGM's new field names:

* a name with the same unit where DCGM 4.6's ``dcgm_fields.h`` defines the old name as a
  deprecated alias of a new one (``DCGM_FI_DEV_GPU_TEMP`` -> ``DCGM_FI_DEV_GPU_TEMP_CELSIUS``);
  tests/data/dcgm/dcgm-4.6-deprecated-aliases.txt holds that list and a test holds
  ``SAME_UNIT_4_9`` to it;
* a name with a new unit for the 11 default fields whose unit changed (MHz -> Hz, mJ -> J,
  % -> ratio 0-1, MiB -> bytes, MB/s -> B/s), computed from the snapshot in base units. The Hz and
  J fields are in NVIDIA's DCGM 4.6.1 header (tests/data/dcgm/dcgm-4.6.1-fields-excerpt.txt); the
  ratio, bytes and B/s ones are DCGM 4.7's, taken from a summary of its field reference and not yet
  checked against an NVIDIA file (tests/test_dcgm_name_sources.py lists them);
* ``DCGM_FI_DEV_FB_CAPACITY_BYTES`` for ``DCGM_FI_DEV_FB_TOTAL``;
* driver label ``DCGM_FI_SYSTEM_DRIVER_VERSION``, host label ``hostname``;
* every other field keeps its name and unit.

Nothing here imports NVML; values are functions of a GpuSnapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpumon.model.snapshot import GpuSnapshot

Value = Callable[[GpuSnapshot], float | None]

LEGACY = "dcgm"
V4_9 = "dcgm-4.9"
SETS = (LEGACY, V4_9)
"""The names ``--compat`` accepts for DCGM sets, oldest first."""
HOSTNAME_LABELS = ("Hostname", "hostname")


@dataclass(frozen=True)
class Converted:
    """A field served under a new name in a new unit: ``value`` gives it from the snapshot."""

    name: str
    help: str
    unit: str
    value: Value


@dataclass(frozen=True)
class LabelField:
    """An optional label row of dcgm-exporter's CSV (``DCGM_FI_DEV_SERIAL, label, ...``)."""

    legacy: str
    """The label name up to dcgm-exporter 4.8 (DCGM's field name)."""
    renamed: str
    """The label name in 4.9 (DCGM 4.7's field name)."""


@dataclass(frozen=True)
class DcgmSet:
    """One version's names: how each legacy family is named there, and its fixed labels."""

    name: str
    hostname_label: str
    """The default spelling of the host label."""
    driver_label: str
    same_unit: Mapping[str, str] = field(default_factory=dict)
    """Legacy name -> this set's name, same value."""
    converted: Mapping[str, Converted] = field(default_factory=dict)
    """Legacy name -> this set's name and value in a new unit."""
    dropped: frozenset[str] = frozenset()
    """Legacy names this set does not serve (a deprecated twin of another family)."""

    def label_name(self, label: LabelField) -> str:
        return label.legacy if self.name == LEGACY else label.renamed


def _key(field_name: str, key: str) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        mapping = getattr(gpu, field_name)
        if mapping is None or mapping.get(key) is None:
            return None
        return float(mapping[key])

    return value


def _plain(field_name: str) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        raw = getattr(gpu, field_name)
        return None if raw is None else float(raw)

    return value


def _nvlink_bytes_per_second(gpu: GpuSnapshot) -> float | None:
    gpm = gpu.gpm_throughput_bytes_per_second
    if gpm is None or ("nvlink_tx" not in gpm and "nvlink_rx" not in gpm):
        return None
    return gpm.get("nvlink_tx", 0.0) + gpm.get("nvlink_rx", 0.0)


SAME_UNIT_4_9: Mapping[str, str] = {
    "DCGM_FI_DEV_MEMORY_TEMP": "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
    "DCGM_FI_DEV_SLOWDOWN_TEMP": "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS",
    "DCGM_FI_DEV_SHUTDOWN_TEMP": "DCGM_FI_DEV_GPU_TEMP_SHUTDOWN_CELSIUS",
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP": "DCGM_FI_DEV_GPU_MAX_OP_TEMP_CELSIUS",
    "DCGM_FI_DEV_MEM_MAX_OP_TEMP": "DCGM_FI_DEV_MEMORY_MAX_OP_TEMP_CELSIUS",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
    "DCGM_FI_DEV_PSTATE": "DCGM_FI_DEV_GPU_PSTATE",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
    "DCGM_FI_DEV_RETIRED_SBE": "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL",
    "DCGM_FI_DEV_RETIRED_DBE": "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL",
    "DCGM_FI_DEV_RETIRED_PENDING": "DCGM_FI_DEV_PAGE_RETIRED_PENDING",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
    "DCGM_FI_PROF_SM_ACTIVE": "DCGM_FI_PROF_SM_UTIL_RATIO",
    "DCGM_FI_PROF_SM_OCCUPANCY": "DCGM_FI_PROF_SM_OCCUPANCY_RATIO",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
    "DCGM_FI_PROF_DRAM_ACTIVE": "DCGM_FI_PROF_DRAM_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "DCGM_FI_PROF_FP64_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "DCGM_FI_PROF_FP32_UTIL_RATIO",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "DCGM_FI_PROF_FP16_UTIL_RATIO",
    "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX": "DCGM_FI_DEV_BANK_REMAP_AVAIL_MAX",
    "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_HIGH": "DCGM_FI_DEV_BANK_REMAP_AVAIL_HIGH",
    "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_PARTIAL": "DCGM_FI_DEV_BANK_REMAP_AVAIL_PARTIAL",
    "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_LOW": "DCGM_FI_DEV_BANK_REMAP_AVAIL_LOW",
    "DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE": "DCGM_FI_DEV_BANK_REMAP_AVAIL_NONE",
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
}
"""DCGM 4.6's deprecated aliases (old -> new, same field and unit) of the families gpumon serves."""

CONVERTED_4_9: Mapping[str, Converted] = {
    "DCGM_FI_DEV_SM_CLOCK": Converted(
        "DCGM_FI_DEV_SM_CLOCK_HERTZ", "SM clock frequency (in Hz).", "Hz", _key("clocks_hertz", "sm")
    ),
    "DCGM_FI_DEV_MEM_CLOCK": Converted(
        "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "Memory clock frequency (in Hz).", "Hz", _key("clocks_hertz", "memory")
    ),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": Converted(
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
        "Total energy consumption since boot (in J).",
        "J",
        _plain("energy_joules_total"),
    ),
    "DCGM_FI_DEV_GPU_UTIL": Converted(
        "DCGM_FI_DEV_GPU_UTIL_RATIO", "GPU utilization (ratio 0-1).", "ratio 0–1", _plain("utilization_ratio")
    ),
    "DCGM_FI_DEV_MEM_COPY_UTIL": Converted(
        "DCGM_FI_DEV_MEMORY_UTIL_RATIO",
        "Memory utilization (ratio 0-1).",
        "ratio 0–1",
        _plain("memory_bandwidth_utilization_ratio"),
    ),
    "DCGM_FI_DEV_ENC_UTIL": Converted(
        "DCGM_FI_DEV_ENC_UTIL_RATIO",
        "Encoder utilization (ratio 0-1).",
        "ratio 0–1",
        _plain("encoder_utilization_ratio"),
    ),
    "DCGM_FI_DEV_DEC_UTIL": Converted(
        "DCGM_FI_DEV_DEC_UTIL_RATIO",
        "Decoder utilization (ratio 0-1).",
        "ratio 0–1",
        _plain("decoder_utilization_ratio"),
    ),
    "DCGM_FI_DEV_FB_TOTAL": Converted(
        "DCGM_FI_DEV_FB_CAPACITY_BYTES",
        "Framebuffer memory capacity (in bytes).",
        "bytes",
        _plain("memory_total_bytes"),
    ),
    "DCGM_FI_DEV_FB_FREE": Converted(
        "DCGM_FI_DEV_FB_FREE_BYTES", "Framebuffer memory free (in bytes).", "bytes", _plain("memory_free_bytes")
    ),
    "DCGM_FI_DEV_FB_USED": Converted(
        "DCGM_FI_DEV_FB_USED_BYTES", "Framebuffer memory used (in bytes).", "bytes", _plain("memory_used_bytes")
    ),
    "DCGM_FI_DEV_FB_RESERVED": Converted(
        "DCGM_FI_DEV_FB_RESERVED_BYTES",
        "Framebuffer memory reserved (in bytes).",
        "bytes",
        _plain("memory_reserved_bytes"),
    ),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": Converted(
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
        "NVLink throughput over all links and both directions (in B/s).",
        "B/s",
        _nvlink_bytes_per_second,
    ),
}
"""dcgm-exporter 4.9's fields with a new unit (DCGM 4.7's base-unit fields), from gpumon's base units.
Only the Hz and J names are confirmed by an NVIDIA file (DCGM 4.6.1's header); see the module docstring."""

LABEL_FIELDS: Mapping[str, LabelField] = {
    "nvml_version": LabelField("DCGM_FI_NVML_VERSION", "DCGM_FI_SYSTEM_NVML_VERSION"),
    "serial": LabelField("DCGM_FI_DEV_SERIAL", "DCGM_FI_DEV_BOARD_SERIAL"),
    "vbios_version": LabelField("DCGM_FI_DEV_VBIOS_VERSION", "DCGM_FI_DEV_VBIOS_VERSION"),
}
"""The optional label rows of dcgm-exporter's CSV gpumon has the data for, by ``--compat-labels`` name.
(Brand and the inforom versions are not read by gpumon.)"""

HPC_JOB = "hpc_job"
"""dcgm-exporter's label of the HPC job using the GPU (``--hpc-job-mapping-dir``); gpumon takes it
from the Slurm job of the GPU's processes."""

COMPAT_LABELS = (*LABEL_FIELDS, HPC_JOB)
"""What ``--compat-labels`` accepts."""

DCGM_SETS: Mapping[str, DcgmSet] = {
    LEGACY: DcgmSet(LEGACY, "Hostname", "DCGM_FI_DRIVER_VERSION"),
    V4_9: DcgmSet(
        V4_9,
        "hostname",
        "DCGM_FI_SYSTEM_DRIVER_VERSION",
        same_unit=SAME_UNIT_4_9,
        converted=CONVERTED_4_9,
        dropped=frozenset({"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}),  # DCGM's alias of ..._CLOCKS_EVENT_REASONS
    ),
}
