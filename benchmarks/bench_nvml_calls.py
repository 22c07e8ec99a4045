"""Cost of gpumon's NVML reads against the bare pynvml calls and nvidia-smi, on a real GPU host.

    python3 benchmarks/bench_nvml_calls.py [--repeat N]
    python3 benchmarks/bench_nvml_calls.py --fake [--gpus N]   # tests/fake_pynvml.py: gpumon's own Python cost
    python3 benchmarks/bench_nvml_calls.py --quick             # --fake, few repeats (checks the script runs)

For every reader group of NvmlBackend (see gpumon.backends.nvml.registry.collect_readers) it times, on every GPU,
the median of ``backend.read_group(i, name)`` against a bare pynvml loop over the same calls.
The bare loop follows the backend by itself: a second backend reads through a recording proxy
of the pynvml module (after the first reads, which probe what the GPU supports), and the bare
loop replays exactly the calls it saw (function and arguments) on the raw module, with no unit
conversion, no caching, no error sorting. So a new reader is compared without editing this file.
The last column is the CPU this thread spent per gpumon read (user + system, so time in the
driver counts): what the read costs the daemon's CPU, against its wall time.
Then the full FAST read of all GPUs (what the poller does every second) against the replay of
all its calls, and against one ``nvidia-smi --query-gpu`` with the matching fields.
Prints tables with ratios; nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpumon.backends.base import NvmlUnavailableError
from gpumon.backends.nvml import NvmlBackend
from gpumon.backends.nvml.registry import collect_readers
from gpumon.model.snapshot import Tier

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
"""A recorded pynvml call: the raw module's function, its positional and keyword arguments."""

SMI_FAST_FIELDS = [
    "index",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.free",
    "memory.total",
    "memory.reserved",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "clocks.sm",
    "clocks.mem",
    "clocks.gr",
    "pstate",
    "clocks_event_reasons.active",
    "fan.speed",
    "pcie.link.gen.current",
    "pcie.link.width.current",
]


class RecordingNvml:
    """Stands in for the pynvml module and records every ``nvml*`` call made through it while ``recording``."""

    def __init__(self, nv: Any) -> None:
        self._nv = nv
        self.recording = False
        self.calls: list[Call] = []

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self._nv, name)
        except AttributeError:  # as the module says it (the backend's rule for an older binding)
            raise AttributeError(name, name=name, obj=self) from None
        if not name.startswith("nvml") or isinstance(value, type) or not callable(value):
            return value  # constants, NVMLError, ctypes structs

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.recording:
                self.calls.append((value, args, kwargs))
            return value(*args, **kwargs)

        call.__name__ = name
        return call

    def record(self, fn: Callable[[], Any]) -> list[Call]:
        """The calls ``fn()`` makes through this module."""
        self.calls, self.recording = [], True
        try:
            fn()
        finally:
            self.recording = False
        return self.calls


def reader_names(tier: Tier) -> tuple[str, ...]:
    """Names of NvmlBackend's reader groups of ``tier``, in the order its ``read`` runs them."""
    return tuple(spec.name for spec in collect_readers()[tier])


def replay(calls: list[Call]) -> None:
    """The bare loop: the recorded calls on the raw module, answers and errors dropped."""
    for fn, args, kwargs in calls:
        try:  # noqa: SIM105 (contextlib.suppress would add ~0.3 µs a call to the reference)
            fn(*args, **kwargs)
        except Exception:  # e.g. NOT_FOUND from nvmlDeviceGetProcessUtilization: no new sample
            pass


def warm_up(backend: NvmlBackend, count: int) -> None:
    """The first reads probe capabilities (NOT_SUPPORTED is cached from here on)."""
    for i in range(count):
        for tier in (Tier.STATIC, Tier.SLOW, Tier.FAST, Tier.FAST):
            backend.read(i, tier)


@contextlib.contextmanager
def recorded_groups(nv: Any, count: int) -> Iterator[dict[int, dict[str, list[Call]]]]:
    """Per GPU and reader group, the pynvml calls the backend makes in steady state (after warm_up);
    under key -1, ``{"fast": calls}`` of a FAST read of every GPU.

    The recording backend stays initialised inside the ``with``: the recorded arguments include its
    GPM samples, which its shutdown frees (a replay after that would hand NVML freed memory).
    """
    recorder = RecordingNvml(nv)
    backend = NvmlBackend(recorder)
    backend.init()
    try:
        warm_up(backend, count)
        groups: dict[int, dict[str, list[Call]]] = {}
        for i in range(count):
            groups[i] = {}
            for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC):
                for name in reader_names(tier):
                    groups[i][name] = recorder.record(lambda i=i, name=name: backend.read_group(i, name))
        groups[-1] = {"fast": recorder.record(lambda: [backend.read(i, Tier.FAST) for i in range(count)])}
        yield groups
    finally:
        backend.shutdown()


def median_us(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> float:
    return timed_us(fn, repeat, warmup)[0]


def timed_us(fn: Callable[[], Any], repeat: int, warmup: int = 3) -> tuple[float, float]:
    """(median wall µs, median CPU µs of this thread, user + system) per call of ``fn``."""
    for _ in range(warmup):
        fn()
    times, cpu = [], []
    for _ in range(repeat):
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
        cpu.append(time.thread_time_ns() - c0)
    return statistics.median(times) / 1000.0, statistics.median(cpu) / 1000.0


def smi_query(fields: list[str]) -> list[str] | None:
    done = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    return fields if done.returncode == 0 else None


def nvml_module(args: argparse.Namespace) -> tuple[Any, str]:
    if args.fake:
        from tests.fake_pynvml import FakeGpu, FakeNvml

        return FakeNvml([FakeGpu(index=i) for i in range(args.gpus)]), "tests/fake_pynvml.py"
    import pynvml

    return pynvml, f"nvidia-ml-py {getattr(pynvml, '__version__', '?')}"


def compare(backend: NvmlBackend, bare: dict[int, dict[str, list[Call]]], count: int, repeat_fast: int) -> float:
    """Print the per-group table and the full FAST read against the replayed calls; the full read's µs."""
    print()
    print(
        f"{'tier':6} {'group':20} {'GPU':>3} {'gpumon µs':>11} {'bare µs':>11} {'ratio':>7}  {'calls':>5} {'CPU µs':>9}"
    )
    for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC):
        repeat = repeat_fast if tier is Tier.FAST else max(5, repeat_fast // 20)
        for name in reader_names(tier):
            for i in range(count):
                ours, cpu = timed_us(lambda i=i, name=name: backend.read_group(i, name), repeat)
                calls = bare[i][name]
                ref = median_us(lambda calls=calls: replay(calls), repeat) if calls else 0.0
                ratio = f"{ours / ref:7.2f}" if ref > 0 else "    n/a"
                print(f"{tier.value:6} {name:20} {i:>3} {ours:11.1f} {ref:11.1f} {ratio}  {len(calls):>5} {cpu:9.1f}")
    errors = backend.take_errors()
    if errors:
        print(f"# reader errors during the benchmark: {errors}")

    # full FAST read of all GPUs, as the poller does every second
    all_bare = bare[-1]["fast"]

    def ours_fast() -> None:
        for i in range(count):
            backend.read(i, Tier.FAST)

    ours = median_us(ours_fast, repeat_fast)
    ref = median_us(lambda: replay(all_bare), repeat_fast)
    print()
    print(
        f"full FAST read, {count} GPU(s): gpumon {ours:.1f} µs ({ours / count:.1f} µs/GPU), "
        f"bare pynvml {ref:.1f} µs ({len(all_bare)} calls)"
    )
    print(f"  ratio gpumon / bare pynvml: {ours / ref:.2f}  (goal <= 1.5 and <= 100 µs per GPU)")

    return ours


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="timed runs per fast measurement (default 200)")
    parser.add_argument("--fake", action="store_true", help="read tests/fake_pynvml.py, not the GPUs")
    parser.add_argument("--gpus", type=int, default=2, help="GPUs of the fake (default 2)")
    parser.add_argument("--quick", action="store_true", help="--fake with 10 repeats (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.fake, args.repeat = True, 10

    nv, binding = nvml_module(args)
    backend = NvmlBackend(nv)
    t0 = time.perf_counter()
    try:
        backend.init()
    except NvmlUnavailableError as exc:
        print(f"cannot benchmark: {exc}", file=sys.stderr)
        return 1
    init_ms = (time.perf_counter() - t0) * 1e3
    count = backend.device_count()
    host = backend.host()
    print(f"# {count} GPU(s), driver {host.driver_version}, CUDA {host.cuda_driver_version}, NVML {host.nvml_version}")
    print(f"# {binding}, python {sys.version.split()[0]}")
    print(f"# backend.init() (nvmlInit + handles): {init_ms:.1f} ms")
    warm_up(backend, count)
    print(f"# GPU 0: {backend.read(0, Tier.STATIC).get('name')}")
    with recorded_groups(nv, count) as bare:
        ours = compare(backend, bare, count, args.repeat)
    backend.shutdown()
    if args.fake or shutil.which("nvidia-smi") is None:
        print("no nvidia-smi comparison (fake NVML, or nvidia-smi not found)")
        return 0
    fields = smi_query(SMI_FAST_FIELDS)
    if fields is None:  # an older nvidia-smi without some field names
        fields = [f for f in SMI_FAST_FIELDS if smi_query(["index", f]) is not None]
    smi_us = median_us(lambda: smi_query(fields), max(5, args.repeat // 20), warmup=1)
    print(f"nvidia-smi --query-gpu ({len(fields)} fields, all GPUs): {smi_us / 1000:.1f} ms per call")
    print(f"  ratio nvidia-smi / gpumon full FAST read: {smi_us / ours:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
