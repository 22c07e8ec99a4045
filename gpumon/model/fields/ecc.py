"""Memory health: ECC mode and counts, row remapping (Ampere and newer), page retirement (before)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpumon.model.fields.modes import MODES_SECONDS
from gpumon.model.fields.spec import Dcgm, Metric, Sample, Tier, declare, declare_mapping, nonzero

_REMAPPED_ROWS = "nvmlDeviceGetRemappedRows"
_RETIRED = "nvmlDeviceGetRetiredPages(cause), …PendingStatus (pre-Ampere; NOT_SUPPORTED on Hopper)"


def _ecc_key(key: str) -> tuple[str, ...]:
    kind, _, scope = key.partition("_")
    return (kind, scope)


def _ecc(key: str, name: str, what: str) -> Dcgm:
    return Dcgm(name, "untyped", f"Total number of {what} ECC errors.", key=key)


_BANK_WORDS = {"max": "full", "high": "high", "partial": "partial", "low": "low", "none": "no"}
"""The histogram's levels, from most spare rows left to none (nvmlRowRemapperHistogramValues)."""
BANK_LEVELS = tuple(_BANK_WORDS)


def _volatile_or_counted(sample: Sample) -> bool:
    """``keep`` of gpumon_ecc_errors_total: the volatile counts, and the aggregate ones above 0."""
    return sample[0][1] == "volatile" or sample[1] != 0


def _bank_samples(banks: Mapping[str, int]) -> Iterable[Sample]:
    """One sample per level, from max to none (the histogram's order, not the alphabet's)."""
    return [((level,), float(banks[level])) for level in BANK_LEVELS if level in banks]


@dataclass(frozen=True)
class EccFields:
    ecc_mode_enabled: bool | None = declare(
        Tier.SLOW,
        "ECC mode currently enabled (ecc.mode.current)",
        nvml="nvmlDeviceGetEccMode()[0]",
        smi="ecc.mode.current",
        metric=Metric(
            "gpumon_ecc_mode_enabled",
            "gauge",
            "1 when ECC is enabled (nvidia-smi ecc.mode.current).",
            read_every_seconds=MODES_SECONDS,
        ),
        fake=True,
    )
    ecc_errors_total: Mapping[str, int] | None = declare_mapping(
        Tier.SLOW,
        "ECC error counts keyed '<corrected|uncorrected>_<volatile|aggregate>' "
        "(ecc.errors.corrected.volatile.total, ...)",
        nvml="nvmlDeviceGetTotalEccErrors(CORRECTED/UNCORRECTED, VOLATILE/AGGREGATE)",
        smi="ecc.errors.corrected.volatile.total …",
        metric=Metric(
            "gpumon_ecc_errors_total",
            "counter",
            "ECC errors by type corrected|uncorrected and scope volatile|aggregate (nvidia-smi ecc.errors.*.total).",
            labels=("type", "scope"),
            keys=_ecc_key,
            detail="zero_rows",
            keep=_volatile_or_counted,
        ),
        dcgm=(
            _ecc("corrected_volatile", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "single-bit volatile"),
            _ecc("uncorrected_volatile", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "double-bit volatile"),
            _ecc("corrected_aggregate", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "single-bit persistent"),
            _ecc("uncorrected_aggregate", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "double-bit persistent"),
        ),
        fake={"corrected_volatile": 0, "uncorrected_volatile": 0, "corrected_aggregate": 0, "uncorrected_aggregate": 0},
    )
    remapped_rows: Mapping[str, int] | None = declare_mapping(
        Tier.SLOW,
        "Remapped rows by kind correctable|uncorrectable (remapped_rows.correctable / .uncorrectable)",
        nvml=_REMAPPED_ROWS,
        smi="remapped_rows.correctable, .uncorrectable",
        metric=Metric(
            "gpumon_remapped_rows",
            "gauge",
            "Rows remapped by kind correctable|uncorrectable (nvidia-smi remapped_rows.*).",
            labels=("kind",),
        ),
        dcgm=(
            Dcgm(
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "untyped",
                "Number of remapped rows for uncorrectable errors.",
                key="uncorrectable",
            ),
            Dcgm(
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                "untyped",
                "Number of remapped rows for correctable errors.",
                key="correctable",
            ),
        ),
        fake={"correctable": 0, "uncorrectable": 0},
    )
    row_remap_pending: bool | None = declare(
        Tier.SLOW,
        "A row remap waits for a GPU reset (remapped_rows.pending)",
        nvml=_REMAPPED_ROWS,
        smi="remapped_rows.pending",
        metric=Metric(
            "gpumon_row_remap_pending",
            "gauge",
            "1 when a row remap waits for a GPU reset (nvidia-smi remapped_rows.pending).",
        ),
        dcgm=Dcgm("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending a GPU reset."),
        fake=False,
    )
    row_remap_failure: bool | None = declare(
        Tier.SLOW,
        "A row remap failed (remapped_rows.failure)",
        nvml=_REMAPPED_ROWS,
        smi="remapped_rows.failure",
        metric=Metric(
            "gpumon_row_remap_failure", "gauge", "1 when a row remap failed (nvidia-smi remapped_rows.failure)."
        ),
        dcgm=Dcgm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed."),
        fake=False,
    )
    retired_pages: Mapping[str, int] | None = declare_mapping(
        Tier.SLOW,
        "Retired pages by cause single_bit|double_bit (retired_pages.sbe / .dbe); pre-Ampere",
        nvml=_RETIRED,
        conversion="count of pages",
        smi="retired_pages.sbe, .dbe",
        metric=Metric(
            "gpumon_retired_pages",
            "gauge",
            "Retired memory pages by cause single_bit|double_bit (nvidia-smi retired_pages.*; before Ampere).",
            labels=("cause",),
        ),
        dcgm=(
            Dcgm(
                "DCGM_FI_DEV_RETIRED_SBE",
                "untyped",
                "Total number of retired pages due to single-bit errors.",
                key="single_bit",
            ),
            Dcgm(
                "DCGM_FI_DEV_RETIRED_DBE",
                "untyped",
                "Total number of retired pages due to double-bit errors.",
                key="double_bit",
            ),
        ),
    )
    retired_pages_pending: bool | None = declare(
        Tier.SLOW,
        "A page retirement waits for reboot (retired_pages.pending)",
        nvml=_RETIRED,
        smi="retired_pages.pending",
        metric=Metric(
            "gpumon_retired_pages_pending",
            "gauge",
            "1 when a page retirement waits for a reboot (nvidia-smi retired_pages.pending).",
        ),
        dcgm=Dcgm("DCGM_FI_DEV_RETIRED_PENDING", "untyped", "Pages pending retirement (1 when any)."),
    )
    row_remap_bank_availability: Mapping[str, int] | None = declare_mapping(
        Tier.SLOW,
        "Memory banks by spare-row availability max|high|partial|low|none (remapped_rows.histogram.*)",
        nvml="nvmlDeviceGetRowRemapperHistogram",
        conversion="count of banks",
        smi="remapped_rows.histogram.max, .high, .partial, .low, .none",
        metric=Metric(
            "gpumon_row_remap_banks",
            "gauge",
            "Memory banks by how many spare rows they have left, availability max|high|partial|low|none"
            " (nvidia-smi remapped_rows.histogram.*).",
            labels=("availability",),
            samples=_bank_samples,
            detail="zero_rows",
            keep=nonzero,
        ),
        dcgm=tuple(
            Dcgm(
                f"DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_{level.upper()}",
                "gauge",
                f"Memory banks with {word} spare-row availability.",
                key=level,
            )
            for level, word in _BANK_WORDS.items()
        ),
        fake={"max": 3072, "high": 0, "partial": 0, "low": 0, "none": 0},
    )
