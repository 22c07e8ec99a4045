"""Memory errors: ECC mode and counts, row remapping, retired pages (pre-Ampere)."""

from __future__ import annotations

import contextlib
from typing import Any

from gpumon.backends.nvml.codes import Unsupported
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, gather, opt
from gpumon.model.fields.ecc import BANK_LEVELS
from gpumon.model.fields.modes import MODES_SECONDS
from gpumon.model.snapshot import Tier

ECC_COUNTERS = {  # (NVML_MEMORY_ERROR_TYPE_*, NVML_VOLATILE_ECC / NVML_AGGREGATE_ECC)
    "corrected_volatile": (0, 0),
    "uncorrected_volatile": (1, 0),
    "corrected_aggregate": (0, 1),
    "uncorrected_aggregate": (1, 1),
}
RETIREMENT_CAUSES = {"single_bit": 0, "double_bit": 1}  # NVML_PAGE_RETIREMENT_CAUSE_*


def read_ecc_mode(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetEccMode: ecc.mode.current."""
    current, _pending = ctx.nv.nvmlDeviceGetEccMode(h)
    out["ecc_mode_enabled"] = bool(current)


def read_ecc_errors(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetTotalEccErrors: ecc.errors.{corrected,uncorrected}.{volatile,aggregate}.total."""
    fn = ctx.nv.nvmlDeviceGetTotalEccErrors
    calls = ((key, f"ecc.{key}", fn, (h, error_type, counter)) for key, (error_type, counter) in ECC_COUNTERS.items())
    out["ecc_errors_total"] = gather(g, calls, int)


def read_remapped_rows(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetRemappedRows: remapped_rows.correctable/.uncorrectable/.pending/.failure."""
    correctable, uncorrectable, pending, failure = ctx.nv.nvmlDeviceGetRemappedRows(h)
    out["remapped_rows"] = {"correctable": int(correctable), "uncorrectable": int(uncorrectable)}
    out["row_remap_pending"] = bool(pending)
    out["row_remap_failure"] = bool(failure)


def read_retired_pages(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetRetiredPages per cause and ...PendingStatus (pre-Ampere; NOT_SUPPORTED on Hopper)."""
    nv = ctx.nv
    fields: dict[str, Any] = {}  # written into out after the last call
    fn = nv.nvmlDeviceGetRetiredPages
    calls = ((name, f"retired.{name}", fn, (h, cause)) for name, cause in RETIREMENT_CAUSES.items())
    with contextlib.suppress(Unsupported):  # no cause answers: maybe the pending status does
        fields["retired_pages"] = gather(g, calls, len)
    pending = opt(g, "retired.pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if pending is not None:
        fields["retired_pages_pending"] = bool(pending)
    if not fields:
        raise Unsupported
    out.update(fields)


def read_remap_histogram(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetRowRemapperHistogram: remapped_rows.histogram.max/.high/.partial/.low/.none, banks."""
    banks = ctx.nv.nvmlDeviceGetRowRemapperHistogram(h)
    out["row_remap_bank_availability"] = {level: int(getattr(banks, level)) for level in BANK_LEVELS}


READERS = (
    ReaderSpec("ecc_mode", Tier.SLOW, read_ecc_mode, MODES_SECONDS),
    ReaderSpec("ecc_errors", Tier.SLOW, read_ecc_errors),
    ReaderSpec("remapped_rows", Tier.SLOW, read_remapped_rows),
    ReaderSpec("retired_pages", Tier.SLOW, read_retired_pages),
    ReaderSpec("remap_histogram", Tier.SLOW, read_remap_histogram),
)
