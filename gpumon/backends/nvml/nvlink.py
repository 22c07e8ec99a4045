"""NVLink: link state (nvidia-smi nvlink --status) and link errors (nvidia-smi nvlink -e).

The per-link data counters (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/_RX and _RAW_*, fields 138–141,
nvidia-smi nvlink -gt d) are not read: on H200 with driver 580.159.04, asking for them from a
thread of a process whose other threads also call NVML corrupted the C heap (``free(): invalid
next size``, the process aborted) in every burn and daemon run that had them, and in none
without. NVLink throughput comes from GPM instead (gpm_throughput_bytes_per_second).
"""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.codes import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_GONE_CODES,
    NVML_SUCCESS,
    UNSUPPORTED_CODES,
    Unsupported,
    code_of,
    nvml_error,
)
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, field_value, handle_of, opt
from gpumon.model.fields.nvlink import NVLINK_ERRORS_SECONDS, NVLINK_STATE_SECONDS
from gpumon.model.snapshot import Tier

NVLINK_ERROR_FIELDS = {"replay": 161, "recovery": 162, "crc": 163}
"""NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY / _RECOVERY / _CRC (scopeId = link): nvidia-smi nvlink -e's three errors."""
NVLINK_ERROR_COUNTERS = {"replay": 0, "recovery": 1, "crc": 2}
"""NVML_NVLINK_ERROR_DL_REPLAY / _RECOVERY / _CRC_FLIT for nvmlDeviceGetNvLinkErrorCounter (drivers without the
fields). DL_CRC_DATA (3) and DL_ECC_DATA (4) are not read: on Hopper they count events the link corrects, grow by
hundreds a minute on healthy links, and nvidia-smi nvlink -e does not show them as errors."""
NVLINK_MAX_LINKS_DEFAULT = 18
_COUNT_END_CODES = UNSUPPORTED_CODES | {NVML_ERROR_INVALID_ARGUMENT}


def nvlink_count(ctx: Context, g: GpuState) -> int:
    """Number of NVLink links: links 0.. until the first NOT_SUPPORTED / INVALID_ARGUMENT (cached)."""
    if g.nvlink_count is None:
        nv, h = ctx.nv, handle_of(g)
        count = 0
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", NVLINK_MAX_LINKS_DEFAULT))):
            try:
                nv.nvmlDeviceGetNvLinkState(h, link)
            except Exception as exc:
                if code_of(exc) in _COUNT_END_CODES:
                    break
                raise
            count += 1
        g.nvlink_count = count
    return g.nvlink_count


def read_nvlink_state(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetNvLinkState per link (nvidia-smi nvlink --status): up or not."""
    count = nvlink_count(ctx, g)
    if count == 0:
        raise Unsupported
    state = ctx.nv.nvmlDeviceGetNvLinkState
    if len(g.nvlink_names) != count:
        g.nvlink_names = tuple(str(link) for link in range(count))  # the keys, made once (read every second)
    out["nvlink_up"] = {name: bool(state(h, link)) for link, name in enumerate(g.nvlink_names)}


def read_nvlink_errors(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvidia-smi nvlink -e per link: Replay / Recovery / CRC Errors -> ``replay``, ``recovery``, ``crc``.

    One nvmlDeviceGetFieldValues call for every link and type (NVML_FI_DEV_NVLINK_ERROR_DL_*,
    scopeId = link); a type whose field this driver does not support is read with
    nvmlDeviceGetNvLinkErrorCounter(DL_REPLAY / DL_RECOVERY / DL_CRC_FLIT) instead. Both agree
    with nvidia-smi on H200 (driver 580). DL_CRC_DATA / DL_ECC_DATA are left out (see
    NVLINK_ERROR_COUNTERS).

    The daemon's backend asks at most every NVLINK_ERRORS_SECONDS (``ReaderSpec.every_seconds``):
    the call costs ~43 ms of CPU per GPU on an H100 (18 links).
    """
    count = nvlink_count(ctx, g)
    if count == 0:
        raise Unsupported
    nv = ctx.nv
    links: dict[str, dict[str, int]] = {str(link): {} for link in range(count)}
    by_field = [name for name in NVLINK_ERROR_FIELDS if f"nvlink_field.{name}" not in g.unsupported]
    if by_field:
        _read_error_fields(nv, g, h, count, by_field, links)
    for name, counter in NVLINK_ERROR_COUNTERS.items():
        if f"nvlink_field.{name}" not in g.unsupported:
            continue
        for link in range(count):
            n = opt(g, f"nvlink_error.{name}", nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
            if n is not None:
                links[str(link)][name] = int(n)
    links = {link: counters for link, counters in links.items() if counters}
    if not links:
        raise Unsupported
    out["nvlink_errors_total"] = links


def _read_error_fields(
    nv: Any, g: GpuState, h: Any, count: int, by_field: list[str], links: dict[str, dict[str, int]]
) -> None:
    """The error types ``by_field`` of every link in one nvmlDeviceGetFieldValues call, into ``links``.

    A type that no link answers is remembered as ``nvlink_field.NAME`` (read with the error counter API).
    """
    ids = [
        (int(getattr(nv, f"NVML_FI_DEV_NVLINK_ERROR_DL_{name.upper()}", NVLINK_ERROR_FIELDS[name])), link)
        for name in by_field
        for link in range(count)
    ]
    try:
        got = opt(g, "nvlink_field.call", nv.nvmlDeviceGetFieldValues, h, ids)
    except (TypeError, AttributeError):  # a binding without (fieldId, scopeId) pairs
        got = None
    if got is None:
        g.unsupported.update(f"nvlink_field.{name}" for name in by_field)
        return
    values = list(got)
    for i, name in enumerate(by_field):
        mine = values[i * count : (i + 1) * count]
        codes = [int(v.nvmlReturn) for v in mine]
        if all(code in UNSUPPORTED_CODES for code in codes):
            g.unsupported.add(f"nvlink_field.{name}")  # this driver: the error counter API
            continue
        for link, (code, value) in enumerate(zip(codes, mine, strict=True)):
            if code == NVML_SUCCESS:
                links[str(link)][name] = int(field_value(value))
            elif code in NVML_GONE_CODES:
                raise nvml_error(nv, code)
            # else: this link's counter is not available now (a link down): omitted


READERS = (
    ReaderSpec("nvlink_state", Tier.FAST, read_nvlink_state, NVLINK_STATE_SECONDS),
    ReaderSpec("nvlink_errors", Tier.SLOW, read_nvlink_errors, NVLINK_ERRORS_SECONDS),
)
