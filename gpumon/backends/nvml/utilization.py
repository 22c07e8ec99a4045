"""Utilization and memory: the two FAST reads every GPU answers (the liveness reads); video engine utilization."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.codes import NVML_ERROR_ARGUMENT_VERSION_MISMATCH, UNSUPPORTED_CODES, Unsupported, code_of
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec
from gpumon.snapshot import Tier

_MEMORY_V2_FALLBACK_CODES = UNSUPPORTED_CODES | {NVML_ERROR_ARGUMENT_VERSION_MISMATCH}


def read_utilization(ctx: Context, g: GpuState, h: Any) -> dict[str, Any]:
    """nvmlDeviceGetUtilizationRates: utilization.gpu / utilization.memory (%) -> 0-1."""
    u = ctx.nv.nvmlDeviceGetUtilizationRates(h)
    return {"utilization_ratio": u.gpu / 100.0, "memory_bandwidth_utilization_ratio": u.memory / 100.0}


def read_memory(ctx: Context, g: GpuState, h: Any) -> dict[str, Any]:
    """nvmlDeviceGetMemoryInfo (v2 for reserved, else v1): memory.used/free/total/reserved, bytes."""
    nv = ctx.nv
    if not g.memory_v1:
        version = getattr(nv, "nvmlMemory_v2", None)
        if version is not None:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=version)
                return {
                    "memory_used_bytes": int(m.used),
                    "memory_free_bytes": int(m.free),
                    "memory_total_bytes": int(m.total),
                    "memory_reserved_bytes": int(m.reserved),
                }
            except TypeError:  # a binding without the version argument
                pass
            except Exception as exc:
                if code_of(exc) not in _MEMORY_V2_FALLBACK_CODES:
                    raise
        g.memory_v1 = True
    m = nv.nvmlDeviceGetMemoryInfo(h)
    return {"memory_used_bytes": int(m.used), "memory_free_bytes": int(m.free), "memory_total_bytes": int(m.total)}


def read_video(ctx: Context, g: GpuState, h: Any) -> dict[str, Any]:
    """nvmlDeviceGetEncoderUtilization / ...DecoderUtilization: utilization.encoder / .decoder (%) -> 0-1.

    Each answer is [percent, sampling period µs]; a call the GPU lacks is remembered and left out."""
    # gather's rule, written out: this runs every second for every GPU
    nv = ctx.nv
    unsupported = g.unsupported
    out = {}
    for name, key, fn in (
        ("encoder_utilization_ratio", "video.encoder", nv.nvmlDeviceGetEncoderUtilization),
        ("decoder_utilization_ratio", "video.decoder", nv.nvmlDeviceGetDecoderUtilization),
    ):
        if key in unsupported:
            continue
        try:
            answer = fn(h)
        except Exception as exc:
            if code_of(exc) not in UNSUPPORTED_CODES:
                raise
            unsupported.add(key)
            continue
        if answer is not None:
            out[name] = answer[0] / 100.0
    if not out:
        raise Unsupported
    return out


READERS = (
    ReaderSpec("utilization", Tier.FAST, read_utilization),
    ReaderSpec("memory", Tier.FAST, read_memory),
    ReaderSpec("video", Tier.FAST, read_video),
)
