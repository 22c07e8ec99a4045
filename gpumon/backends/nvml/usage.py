"""Utilization and memory: the two FAST reads every GPU answers (the liveness reads); video engine utilization."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.codes import NVML_ERROR_ARGUMENT_VERSION_MISMATCH, UNSUPPORTED_CODES, Unsupported, code_of
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, opt
from gpumon.model.snapshot import Tier

_MEMORY_V2_FALLBACK_CODES = UNSUPPORTED_CODES | {NVML_ERROR_ARGUMENT_VERSION_MISMATCH}


def read_utilization(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetUtilizationRates: utilization.gpu / utilization.memory (%) -> 0-1."""
    u = ctx.nv.nvmlDeviceGetUtilizationRates(h)
    out["utilization_ratio"] = u.gpu / 100.0
    out["memory_bandwidth_utilization_ratio"] = u.memory / 100.0


def read_memory(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetMemoryInfo (v2 for reserved, else v1): memory.used/free/total/reserved, bytes."""
    nv = ctx.nv
    if not g.memory_v1:
        version = ctx.memory_v2_version
        if version is not None:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=version)
                used, free, total, reserved = int(m.used), int(m.free), int(m.total), int(m.reserved)
            except TypeError:  # a binding without the version argument
                pass
            except Exception as exc:
                if code_of(exc) not in _MEMORY_V2_FALLBACK_CODES:
                    raise
            else:
                out["memory_used_bytes"] = used
                out["memory_free_bytes"] = free
                out["memory_total_bytes"] = total
                out["memory_reserved_bytes"] = reserved
                return
        g.memory_v1 = True
    m = nv.nvmlDeviceGetMemoryInfo(h)
    out["memory_used_bytes"] = int(m.used)
    out["memory_free_bytes"] = int(m.free)
    out["memory_total_bytes"] = int(m.total)


def read_video(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetEncoderUtilization / ...DecoderUtilization: utilization.encoder / .decoder (%) -> 0-1.

    Each answer is [percent, sampling period µs]; a call the GPU lacks is remembered and left out.
    Both calls are made before either ratio is written (a reader that raises writes nothing)."""
    nv = ctx.nv
    encoder = opt(g, "video.encoder", nv.nvmlDeviceGetEncoderUtilization, h)
    decoder = opt(g, "video.decoder", nv.nvmlDeviceGetDecoderUtilization, h)
    if encoder is None and decoder is None:
        raise Unsupported
    if encoder is not None:
        out["encoder_utilization_ratio"] = encoder[0] / 100.0
    if decoder is not None:
        out["decoder_utilization_ratio"] = decoder[0] / 100.0


READERS = (
    ReaderSpec("utilization", Tier.FAST, read_utilization),
    ReaderSpec("memory", Tier.FAST, read_memory),
    ReaderSpec("video", Tier.FAST, read_video),
)
