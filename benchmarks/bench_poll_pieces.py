"""Where a one-GPU poll's time goes beyond its NVML calls: each piece right after the calls, and the floor.

    python3 benchmarks/bench_poll_pieces.py [--rounds 3000]   # GPU 0 of this host
    python3 benchmarks/bench_poll_pieces.py --fake            # tests/fake_pynvml.py
    python3 benchmarks/bench_poll_pieces.py --quick           # --fake, few rounds (checks the script runs)

Two tables, from one run:

1. Each piece of ``Poller.poll()`` timed right after a bare replay of a FAST read's NVML calls
   ("cold": the state a poll's Python runs in, after the driver's ioctls) and once more at once
   ("warm"), less an empty call timed alike. The poller's pieces run over a backend that returns a
   constant read, so they hold no NVML call.
2. The bare pynvml loop over the same calls (the reference of ``bench_daemon.py``), a hand-written
   read of the usual FAST fields that makes those calls one by one with no error handling (what any
   reader of these fields must at least do; skipped when this GPU lacks one of its calls), the
   backend's FAST readers called in a row, ``NvmlBackend.read(FAST)`` and ``Poller.poll()``,
   interleaved round by round in a rotating order, medians, each as a ratio to the bare loop.
Nothing is asserted; the tables are the result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_nvml_calls import recorded_groups, replay
from bench_read_overhead import ConstantBackend

from gpumon.backends.nvml.core import NvmlBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import GpuSnapshot, Snapshot, Tier, TierStats


def hand_written_read(nv: Any, h: Any) -> Callable[[], dict[str, Any]]:
    """The usual FAST fields of one GPU read call by call, converted as gpumon converts them, with no
    error handling and no reader structure: a floor for any reader of these fields."""
    version = nv.nvmlMemory_v2

    def read() -> dict[str, Any]:
        out: dict[str, Any] = {}
        u = nv.nvmlDeviceGetUtilizationRates(h)
        out["utilization_ratio"] = u.gpu / 100.0
        out["memory_bandwidth_utilization_ratio"] = u.memory / 100.0
        m = nv.nvmlDeviceGetMemoryInfo(h, version=version)
        out["memory_used_bytes"] = int(m.used)
        out["memory_free_bytes"] = int(m.free)
        out["memory_total_bytes"] = int(m.total)
        out["memory_reserved_bytes"] = int(m.reserved)
        out["encoder_utilization_ratio"] = nv.nvmlDeviceGetEncoderUtilization(h)[0] / 100.0
        out["decoder_utilization_ratio"] = nv.nvmlDeviceGetDecoderUtilization(h)[0] / 100.0
        out["temperature_celsius"] = float(nv.nvmlDeviceGetTemperature(h, 0))
        (field,) = nv.nvmlDeviceGetFieldValues(h, [82])  # NVML_FI_DEV_MEMORY_TEMP
        out["memory_temperature_celsius"] = float(field.value.uiVal) if int(field.nvmlReturn) == 0 else None
        out["power_watts"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        out["clocks_hertz"] = {
            "graphics": nv.nvmlDeviceGetClockInfo(h, 0) * 1e6,
            "sm": nv.nvmlDeviceGetClockInfo(h, 1) * 1e6,
            "memory": nv.nvmlDeviceGetClockInfo(h, 2) * 1e6,
        }
        out["performance_state"] = int(nv.nvmlDeviceGetPerformanceState(h))
        out["clock_events"] = int(nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        out["processes"] = tuple(int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(h))
        return out

    return read


def median_us(values: list[float]) -> float:
    return statistics.median(values) * 1e6


def rotating(steps: dict[str, Callable[[], Any]], rounds: int) -> Iterator[tuple[str, Callable[[], Any]]]:
    """Every step once a round, ``rounds`` times, each round starting one step later (so each step
    follows every other one alike)."""
    names = list(steps)
    for n in range(rounds):
        for k in range(len(names)):
            name = names[(n + k) % len(names)]
            yield name, steps[name]


def pieces_table(calls: list[Any], pieces: dict[str, Callable[[], Any]], rounds: int) -> None:
    cold: dict[str, list[float]] = {name: [] for name in pieces}
    warm: dict[str, list[float]] = {name: [] for name in pieces}
    names = list(pieces)
    clock = time.perf_counter
    for name, fn in rotating(pieces, rounds):
        replay(calls)
        t0 = clock()
        fn()
        t1 = clock()
        fn()
        t2 = clock()
        cold[name].append(t1 - t0)
        warm[name].append(t2 - t1)
    empty_cold, empty_warm = median_us(cold["(empty call)"]), median_us(warm["(empty call)"])
    print(f"## the poll's pieces after the calls, {rounds} rounds, µs less an empty call")
    print(f"{'piece':<44}{'cold':>8}{'warm':>8}")
    for name in names[1:]:
        print(f"{name:<44}{median_us(cold[name]) - empty_cold:>8.2f}{median_us(warm[name]) - empty_warm:>8.2f}")


def floor_table(steps: dict[str, Callable[[], Any]], rounds: int) -> None:
    timings: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    clock = time.perf_counter
    for name, fn in rotating(steps, rounds):
        t0 = clock()
        fn()
        timings[name].append(clock() - t0)
    bare = median_us(timings[names[0]])
    print(f"## one GPU's fast tier against its calls, {rounds} rounds interleaved")
    print(f"{'what':<52}{'p50 µs':>8}{'/ bare':>8}")
    for name in names:
        p50 = median_us(timings[name])
        print(f"{name:<52}{p50:>8.2f}{p50 / bare:>8.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--fake", action="store_true", help="read tests/fake_pynvml.py, not the GPUs")
    parser.add_argument("--quick", action="store_true", help="--fake with 50 rounds (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.fake, args.rounds = True, 50
    if args.fake:
        from tests.fake_pynvml import FakeGpu, FakeNvml

        nv: Any = FakeNvml([FakeGpu(index=0)])
    else:
        import pynvml as nv

    backend = NvmlBackend(nv)
    backend.init()
    poller = Poller(backend, SnapshotStore(), PollIntervals(1.0, 1e9, 1e9))
    if not poller.poll().nvml_up:
        print("NVML is not up on this host")
        return 1
    for tier in (Tier.STATIC, Tier.SLOW, Tier.FAST, Tier.FAST):
        backend.read(0, tier)
    gpu = backend._gpus[0]
    liveness, others = gpu.plans[Tier.FAST]
    readers = [reader for _, reader in liveness + others]
    context = backend._ctx

    def readers_in_a_row() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for reader in readers:
            reader(context, gpu, gpu.handle, out)
        return out

    print(f"# GPU 0 of {'tests/fake_pynvml.py' if args.fake else 'this host'}, python {sys.version.split()[0]}")
    print(f"# FAST readers: {', '.join(name for name, _ in liveness + others)}")
    with recorded_groups(nv, 1) as groups:
        calls = groups[-1]["fast"]
        constant = Poller(ConstantBackend(backend, 1), SnapshotStore(), PollIntervals(1.0, 1e9, 1e9))
        for _ in range(5):
            snapshot = constant.poll()
            poller.poll()
        state = constant._gpus[0]
        values, base = state.cache[Tier.FAST], state.base or {}
        pieces: dict[str, Callable[[], Any]] = {
            "(empty call)": lambda: None,
            "Poller.poll() over a constant backend": constant.poll,
            "… merge of the read into the GPU's snapshot": lambda: constant._merge(0, state),
            "… … GpuSnapshot.assemble": lambda: GpuSnapshot.assemble(0, "uuid", values, base, {}),
            "… TierStats.of_read": lambda: TierStats.of_read(1.0, 0, 2.0),
            "… Snapshot.of_poll": lambda: Snapshot.of_poll(1.0, 2.0, snapshot.host, snapshot.gpus, snapshot.tiers),
            "… SnapshotStore.publish (no listener)": lambda: constant._store.publish(snapshot),
        }
        pieces_table(calls, pieces, args.rounds)
        steps: dict[str, Callable[[], Any]] = {
            "bare pynvml loop over the same calls (reference)": lambda: replay(calls)
        }
        hand_written = hand_written_read(nv, gpu.handle)
        try:
            hand_written()
        except Exception as exc:
            print(f"# hand-written read skipped: this GPU lacks one of its calls ({exc})")
        else:
            steps["hand-written read of the usual FAST fields"] = hand_written
        steps["the backend's FAST readers in a row"] = readers_in_a_row
        steps["NvmlBackend.read(FAST)"] = lambda: backend.read(0, Tier.FAST)
        steps["Poller.poll() (fast tier)"] = poller.poll
        floor_table(steps, args.rounds)
    backend.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
