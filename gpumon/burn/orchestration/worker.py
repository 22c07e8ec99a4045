"""One worker process per GPU: imports torch, joins the process group, runs the load tests.

Forked by the agent's fork server (torch already imported there); talks back only through the message queue
(see ``gpumon.burn.orchestration.protocol``). Never raises out: every failure becomes one message.
"""

from __future__ import annotations

import importlib
import os
import signal
import time
import traceback
from typing import Any

from gpumon.burn.orchestration.protocol import NO_MULTICAST_ENV, WorkerSpec


class CannotRunWorkerError(RuntimeError):
    """The worker cannot run at all here (no CUDA device, NCCL init failed)."""


class Heartbeat:
    """Progress messages to the agent, rate-limited; also where ``hang:G`` takes effect."""

    def __init__(self, spec: WorkerSpec, queue: Any) -> None:
        self.spec = spec
        self.queue = queue
        self.last_sent = 0.0
        self.test = "start"
        self.first_load_test = next((t for t in spec.tests if t != "sw"), None)

    def send(self, message: dict[str, Any]) -> None:
        message["rank"] = self.spec.rank
        self.queue.put(message)

    def progress(self, test: str, metrics: dict[str, float] | None = None, force: bool = False) -> None:
        """Report progress in ``test`` (at most every beat interval unless ``force`` or the test changed)."""
        if self.spec.injection.has("hang", self.spec.gpu) and test == self.first_load_test:
            self.send({"type": "beat", "test": test, "collective": None, "metrics": {}})
            while True:  # the injected hang: computing, no more progress, ever
                time.sleep(3600)
        now = time.monotonic()
        if force or test != self.test or metrics or now - self.last_sent >= self.spec.beat_interval_seconds:
            self.test = test
            self.last_sent = now
            self.send({"type": "beat", "test": test, "collective": None, "metrics": metrics or {}})

    def collective(self, test: str, name: str) -> None:
        """About to wait in collective ``name``: while there, silence is not a hang of this rank."""
        self.test = test
        self.last_sent = time.monotonic()
        self.send({"type": "beat", "test": test, "collective": name, "metrics": {}})


def main(spec: WorkerSpec, queue: Any) -> None:
    """Entry point of the spawned process."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})  # held by the agent while starting us
    for key, value in NO_MULTICAST_ENV.items():
        os.environ[key] = value
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if spec.socket_interface:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", spec.socket_interface)
    hb = Heartbeat(spec, queue)
    hb.progress("start", force=True)
    try:
        code = _run(spec, hb)
    except CannotRunWorkerError as exc:
        hb.send({"type": "error", "test": hb.test, "kind": "cannot_run", "message": str(exc)})
        code = 3
    except BaseException as exc:  # a bug: report it in one message rather than a bare traceback
        hb.send(
            {
                "type": "error",
                "test": hb.test,
                "kind": "error",
                "message": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc(limit=8),
            }
        )
        code = 1
    queue.close()
    queue.join_thread()
    os._exit(code)


def _run(spec: WorkerSpec, hb: Heartbeat) -> int:
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    started = time.monotonic()
    try:
        import torch
    except ImportError as exc:
        raise CannotRunWorkerError(f"torch is not installed: {exc}") from exc
    from gpumon.burn.workloads import context
    from gpumon.burn.workloads.registry import TESTS

    imported = time.monotonic()
    dev = _device(spec, torch)
    ctx = context.Context(spec=spec, hb=hb, device=dev, dist=None, torch=torch)
    opened = time.monotonic()
    if spec.world_size > 1:
        ctx.dist = _init_dist(spec, hb, dev, torch)
        if ctx.cuda:
            # Barriers between tests wait on the CPU (gloo): an NCCL barrier leaves a kernel spinning on
            # the waiting GPUs, which cut p2p copy bandwidth to 56 GB/s on 2xH200 (a bare copy: 375 GB/s).
            hb.collective("start", "new_group(gloo)")
            ctx.cpu_group = ctx.dist.new_group(backend="gloo")
    startup = {
        "import_torch": imported - started,
        "device": opened - imported,
        "process_group": time.monotonic() - opened,
    }
    hb.send({"type": "ready", "model": context.model_name(ctx), "startup_seconds": startup})
    failed = False
    for test in spec.tests:
        if test == "sw":
            continue
        if ctx.dist is not None:
            hb.collective(test, "barrier")
            ctx.barrier()
        hb.progress(test, force=True)
        try:
            data = TESTS[test](ctx)
            hb.send({"type": "result", "test": test, "data": data})
        except Exception as exc:
            failed = True
            kind, message = context.classify_error(exc, ctx)
            if kind == "cannot_run":
                raise CannotRunWorkerError(message) from exc
            hb.send({"type": "error", "test": test, "kind": kind, "message": message})
        finally:
            context.release(ctx)
    if ctx.dist is not None:
        hb.collective("end", "barrier")
        ctx.barrier()
        ctx.dist.destroy_process_group()
    hb.send({"type": "done"})
    return 1 if failed else 0


def _device(spec: WorkerSpec, torch: Any) -> Any:
    if spec.device == "cpu":
        torch.set_num_threads(1)
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise CannotRunWorkerError(f"GPU {spec.gpu}: CUDA is not available to torch (no GPU, or driver/torch mismatch)")
    if spec.gpu >= torch.cuda.device_count():
        raise CannotRunWorkerError(
            f"GPU {spec.gpu}: torch sees only {torch.cuda.device_count()} CUDA devices (CUDA_VISIBLE_DEVICES set?)"
        )
    torch.cuda.set_device(spec.gpu)
    uuid = str(getattr(torch.cuda.get_device_properties(spec.gpu), "uuid", "") or "")
    if spec.expected_uuid and uuid and uuid.removeprefix("GPU-") != spec.expected_uuid.removeprefix("GPU-"):
        raise CannotRunWorkerError(
            f"GPU {spec.gpu}: CUDA device {spec.gpu} is {uuid}, NVML's GPU {spec.gpu} is {spec.expected_uuid}: "
            "unset CUDA_VISIBLE_DEVICES so both count GPUs the same way"
        )
    return torch.device("cuda", spec.gpu)


def _init_dist(spec: WorkerSpec, hb: Heartbeat, dev: Any, torch: Any) -> Any:
    import datetime

    dist: Any = importlib.import_module("torch.distributed")

    # NCCL only where a test all-reduces on the GPUs: the others meet in barriers on the CPU, and without
    # NCCL several burn nodes can share one GPU (the fingerprint across nodes on a one-GPU host).
    nccl = spec.device == "cuda" and "allreduce" in spec.tests
    backend = "nccl" if nccl else "gloo"
    timeout = datetime.timedelta(seconds=spec.dist_timeout_seconds)
    hb.collective("start", "init_process_group")
    try:
        store = dist.TCPStore(spec.store_host, spec.store_port, is_master=False, timeout=timeout)
        kwargs: dict[str, Any] = {}
        if nccl:
            kwargs["device_id"] = dev
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(spec.store_prefix + "/pg", store),
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=timeout,
            **kwargs,
        )
        if nccl:
            dist.barrier(device_ids=[spec.gpu])
        else:
            dist.barrier()
    except Exception as exc:
        raise CannotRunWorkerError(
            f"rank {spec.rank} GPU {spec.gpu}: {backend.upper()} would not initialise: {exc}"
        ) from exc
    return dist
