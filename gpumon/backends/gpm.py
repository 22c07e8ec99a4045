"""Profiling metrics from NVML GPM (GPU Performance Monitoring, Hopper and newer).

GPM gives DCGM's profiling figures (SM active, tensor-pipe active, DRAM bandwidth, ...)
without DCGM and without its system-wide profiling lock. A metric is computed from two
samples taken some time apart, so ``GpmSampler.read`` takes one sample per call and
computes the metrics over the interval since the previous call: the first call after
start (or after an error) returns nothing.

The pynvml module is passed in; this module never imports it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

MIB = 1024 * 1024

RATIO_METRICS: dict[str, str] = {
    "NVML_GPM_METRIC_SM_UTIL": "sm_active_ratio",
    "NVML_GPM_METRIC_SM_OCCUPANCY": "sm_occupancy_ratio",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": "tensor_active_ratio",
    "NVML_GPM_METRIC_DRAM_BW_UTIL": "dram_active_ratio",
    "NVML_GPM_METRIC_FP64_UTIL": "fp64_active_ratio",
    "NVML_GPM_METRIC_FP32_UTIL": "fp32_active_ratio",
    "NVML_GPM_METRIC_FP16_UTIL": "fp16_active_ratio",
    "NVML_GPM_METRIC_GRAPHICS_UTIL": "graphics_active_ratio",
}
"""GPM percent metrics (0-100) -> GpuSnapshot ratio fields (0-1)."""

THROUGHPUT_METRICS: dict[str, str] = {
    "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": "nvlink_tx",
    "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": "nvlink_rx",
    "NVML_GPM_METRIC_PCIE_TX_PER_SEC": "pcie_tx",
    "NVML_GPM_METRIC_PCIE_RX_PER_SEC": "pcie_rx",
}
"""GPM MiB/s metrics -> keys of ``gpm_throughput_bytes_per_second`` (bytes/s)."""

_UNSUPPORTED_CODES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_FOUND")


@dataclass
class _GpuGpm:
    """GPM state of one GPU: two samples used in turn, and the metrics it answers."""

    samples: list[Any]
    metric_ids: dict[int, tuple[str, str]]
    """metric id -> (kind 'ratio'|'throughput', field or key)."""
    request: Any = None
    """One nvmlGpmMetricsGet request struct, reused for every pair of samples."""
    previous: int | None = None
    """Index in ``samples`` of the last sample taken, None until the first one."""
    dropped: set[int] = field(default_factory=set)


class GpmSampler:
    """Takes GPM samples per GPU and turns pairs of them into GpuSnapshot fields.

    Not thread-safe: call it from the polling thread only (the FAST tier of NvmlBackend).
    A GPU without GPM support is remembered and never asked again.
    """

    def __init__(self, pynvml: Any) -> None:
        self._nv = pynvml
        self._gpus: dict[int, _GpuGpm] = {}
        self._unsupported: set[int] = set()

    def supported(self, index: int) -> bool | None:
        """True/False once GPU ``index`` was probed, None before."""
        if index in self._unsupported:
            return False
        return True if index in self._gpus else None

    def read(self, index: int, handle: Any) -> dict[str, Any]:
        """Take a sample of GPU ``index`` and return the metrics since the previous one.

        Ratios are 0-1 (GPM gives percent); throughputs are bytes/s (GPM gives MiB/s).
        Returns {} for an unsupported GPU and on the first call. NVML errors other than
        NOT_SUPPORTED propagate (the caller decides whether the GPU is lost); the next
        call then starts a new pair of samples.
        """
        if index in self._unsupported:
            return {}
        state = self._gpus.get(index)
        if state is None:
            state = self._probe(index, handle)
            if state is None:
                return {}
        current = 0 if state.previous is None else 1 - state.previous
        try:
            self._nv.nvmlGpmSampleGet(handle, state.samples[current])
        except Exception as exc:
            state.previous = None
            if self._is_unsupported(exc):
                log.info("GPU %d: GPM sampling not supported (%s); GPM metrics omitted", index, exc)
                self.forget(index)
                self._unsupported.add(index)
                return {}
            raise
        previous, state.previous = state.previous, current
        if previous is None:
            return {}
        return self._metrics(index, state, state.samples[previous], state.samples[current])

    def forget(self, index: int) -> None:
        """Drop the state of GPU ``index`` (lost, or re-probed): free its samples."""
        self._unsupported.discard(index)
        state = self._gpus.pop(index, None)
        if state is not None:
            self._free(state)

    def shutdown(self) -> None:
        """Free every sample. Call before nvmlShutdown."""
        for index in list(self._gpus):
            self.forget(index)
        self._unsupported.clear()

    # ---- internals ------------------------------------------------------
    def _probe(self, index: int, handle: Any) -> _GpuGpm | None:
        nv = self._nv
        try:
            support = nv.nvmlGpmQueryDeviceSupport(handle)
            ok = bool(getattr(support, "isSupportedDevice", 0))
        except Exception as exc:
            if not self._is_unsupported(exc):
                raise
            ok = False
        if not ok:
            log.info("GPU %d: NVML GPM not supported; profiling metrics omitted", index)
            self._unsupported.add(index)
            return None
        metric_ids: dict[int, tuple[str, str]] = {}
        for const, name in RATIO_METRICS.items():
            if hasattr(nv, const):
                metric_ids[int(getattr(nv, const))] = ("ratio", name)
        for const, key in THROUGHPUT_METRICS.items():
            if hasattr(nv, const):
                metric_ids[int(getattr(nv, const))] = ("throughput", key)
        samples = [nv.nvmlGpmSampleAlloc()]
        try:
            samples.append(nv.nvmlGpmSampleAlloc())
        except Exception:
            nv.nvmlGpmSampleFree(samples[0])
            raise
        state = _GpuGpm(samples=samples, metric_ids=metric_ids)
        self._gpus[index] = state
        return state

    def _metrics(self, index: int, state: _GpuGpm, first: Any, second: Any) -> dict[str, Any]:
        nv = self._nv
        ids = [m for m in state.metric_ids if m not in state.dropped]
        if not ids:
            return {}
        if state.request is None:
            state.request = nv.c_nvmlGpmMetricsGet_t()
            state.request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request = state.request
        request.numMetrics = len(ids)
        request.sample1 = first
        request.sample2 = second
        for i, metric_id in enumerate(ids):
            request.metrics[i].metricId = metric_id
        nv.nvmlGpmMetricsGet(request)
        out: dict[str, Any] = {}
        throughput: dict[str, float] = {}
        success = int(getattr(nv, "NVML_SUCCESS", 0))
        for i, metric_id in enumerate(ids):
            metric = request.metrics[i]
            if int(metric.nvmlReturn) != success:
                # This metric is not offered on this GPU (e.g. NVLink without links): stop asking.
                state.dropped.add(metric_id)
                log.debug("GPU %d: GPM metric %d returned %d; dropped", index, metric_id, int(metric.nvmlReturn))
                continue
            kind, name = state.metric_ids[metric_id]
            value = float(metric.value)
            if kind == "ratio":
                out[name] = min(max(value / 100.0, 0.0), 1.0)
            else:
                throughput[name] = max(value, 0.0) * MIB
        if throughput:
            out["gpm_throughput_bytes_per_second"] = throughput
        return out

    def _free(self, state: _GpuGpm) -> None:
        for sample in state.samples:
            try:
                self._nv.nvmlGpmSampleFree(sample)
            except Exception as exc:  # freeing host memory; nothing else to do
                log.debug("nvmlGpmSampleFree failed: %s", exc)

    def _is_unsupported(self, exc: Exception) -> bool:
        if isinstance(exc, AttributeError) and getattr(exc, "obj", None) is self._nv:
            return True  # an nvidia-ml-py without GPM
        code = getattr(exc, "value", None)
        return code is not None and any(code == getattr(self._nv, name, object()) for name in _UNSUPPORTED_CODES)
