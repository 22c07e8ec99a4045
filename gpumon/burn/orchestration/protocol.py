"""What an agent hands each worker, and the messages workers send back (plain dicts on a queue).

Messages (all carry ``rank``):

* ``{"type": "beat", "test", "collective", "metrics"}`` — progress; ``collective`` names the
  collective the worker is about to wait in (None while it computes), so the watchdog can
  tell a hung rank from the ranks waiting for it.
* ``{"type": "ready"}`` — torch imported, device and process group up.
* ``{"type": "result", "test", "data"}`` — a test's figures (JSON-ready).
* ``{"type": "error", "test", "kind", "message"}`` — kind ``oom`` | ``error`` | ``cannot_run``.
* ``{"type": "done"}`` — the worker finished every test.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.burn.workloads.inject import Injection

# NVLink multicast (NVLS) stays off: burn must never turn it on, in any process it starts.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker needs; picklable for the spawn start method."""

    rank: int
    world_size: int
    gpu: int
    """This worker's GPU index on its node (NVML / PCI order; CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    node_gpus: tuple[int, ...]
    """All GPUs of this node taking part (p2p pairs are drawn from them)."""
    expected_uuid: str | None
    device: str
    dtype: str
    tests: tuple[str, ...]
    duration_seconds: float
    quick: bool
    store_host: str
    store_port: int
    store_prefix: str
    injection: Injection
    allreduce_floor_bytes_per_second: float | None
    link_fraction: float
    p2p_concurrent: bool = False
    """Every pair of this node's GPUs is joined by NVLink: the p2p rounds copy on all GPUs at once."""
    socket_interface: str | None = None
    """The interface gloo reaches the other nodes by (GLOO_SOCKET_IFNAME), when gpumon picked one."""
    dist_timeout_seconds: float = 900.0
    beat_interval_seconds: float = 0.5
