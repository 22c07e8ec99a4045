"""gpumon's own Python cost per FAST read and per poll, on tests/fake_pynvml.py (NVML calls cost ~1 µs there).

    python3 benchmarks/bench_read_overhead.py [--gpus 1] [--nvlinks 0] [--repeat 20000] [--profile]

Times (best of 7 rounds' means, after a warm-up; the first reads probe what the GPU supports):

* ``NvmlBackend.read(0, Tier.FAST)``,
* the replay of the pynvml calls that read makes (bench_nvml_calls' bare loop) on the same fake,
  so the difference is the backend's Python around the calls,
* ``Poller.poll()`` over that backend (FAST-only polls: every GPU's fast read, the snapshot,
  the store; no store listeners, no process attribution), and the same poll over a backend that
  answers a constant mapping (the poller's own cost).

``--nvlinks 18`` gives each fake GPU 18 NVLink links up, as an H200 SXM has (its FAST read then
asks each link's state). ``--profile`` prints cProfile's top functions for 20000 polls. On a real GPU the NVML calls
add their own cost (~60 µs a FAST read on an H200); bench_nvml_calls.py measures that.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import pstats
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from gpumon.backends.nvml import NvmlBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import HostSnapshot, Tier
from tests.fake_pynvml import FakeGpu, FakeNvml


def best_us(fn: Callable[[], Any], repeat: int, rounds: int = 7) -> float:
    """The fastest of ``rounds`` rounds' mean time of ``fn()`` (as timeit does: on a shared host the
    slower rounds are other processes' time), after a warm-up round."""
    per_round = max(1, repeat // rounds)
    for _ in range(per_round):
        fn()
    clock = time.perf_counter_ns
    best = float("inf")
    for _ in range(rounds):
        t0 = clock()
        for _ in range(per_round):
            fn()
        best = min(best, (clock() - t0) / per_round)
    return best / 1000.0


class ConstantBackend:
    """Answers every FAST read with one fixed mapping (a real read's): the poller's cost alone."""

    name = "constant"
    simulated = False  # stands in for NVML: the poller treats it as it treats NvmlBackend

    def __init__(self, backend: NvmlBackend, count: int) -> None:
        self._backend = backend
        self._count = count
        self._fast = [dict(backend.read(i, Tier.FAST)) for i in range(count)]

    def init(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def device_count(self) -> int:
        return self._count

    def uuid(self, index: int) -> str:
        return self._backend.uuid(index)

    def host(self) -> HostSnapshot:
        return self._backend.host()

    def read(self, index: int, tier: Tier) -> Mapping[str, Any]:
        return self._fast[index] if tier is Tier.FAST else self._backend.read(index, tier)

    def take_errors(self) -> dict[str, int]:
        return {}

    def read_errors(self) -> dict[tuple[int, str, str], int]:
        return {}

    def wait_events(self, timeout_seconds: float) -> list[Any]:
        return []


def fast_only_poller(backend: Any) -> Poller:
    """A poller whose every poll is FAST only (a fake clock one fast interval ahead per call), as in steady state."""
    clock = [0.0]

    def tick() -> float:
        clock[0] += 1.0
        return clock[0]

    intervals = PollIntervals(fast_seconds=1.0, slow_seconds=1e12, static_seconds=1e12)
    poller = Poller(backend, SnapshotStore(), intervals, monotonic=tick, wall_clock=tick, host_figures=dict)
    poller.poll()  # init, static and slow reads
    return poller


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--nvlinks", type=int, default=0, help="NVLink links per GPU (an H200 SXM has 18)")
    parser.add_argument("--repeat", type=int, default=20000)
    parser.add_argument("--profile", action="store_true", help="cProfile 20000 polls, print the top 25")
    args = parser.parse_args()

    nv = FakeNvml([FakeGpu(index=i, nvlink_states=[1] * args.nvlinks) for i in range(args.gpus)])
    backend = NvmlBackend(nv)
    backend.init()
    for tier in (Tier.STATIC, Tier.SLOW, Tier.FAST, Tier.FAST):
        for i in range(args.gpus):
            backend.read(i, tier)

    bare: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []
    reference = contextlib.ExitStack()  # the recording backend lives while its calls are replayed
    try:  # the benchmark next door records the calls a read makes (not in an older checkout)
        import bench_nvml_calls

        bare = reference.enter_context(bench_nvml_calls.recorded_groups(nv, args.gpus))[-1]["fast"]
    except (ImportError, AttributeError):
        pass

    print(
        f"# {args.gpus} fake GPU(s), {args.nvlinks} NVLink links each, python {sys.version.split()[0]}, best of 7 rounds of {args.repeat // 7}"
    )
    read_us = best_us(lambda: [backend.read(i, Tier.FAST) for i in range(args.gpus)], args.repeat)
    print(f"NvmlBackend.read(FAST), all GPUs:  {read_us:6.2f} µs ({read_us / args.gpus:.2f} µs/GPU)")
    if bare:

        def replay() -> None:
            for fn, a, kw in bare:
                try:  # noqa: SIM105 (as bench_nvml_calls.replay)
                    fn(*a, **kw)
                except Exception:
                    pass

        bare_us = best_us(replay, args.repeat)
        print(
            f"  its {len(bare)} pynvml calls replayed:  {bare_us:6.2f} µs -> backend Python {read_us - bare_us:.2f} µs"
        )
    poller = fast_only_poller(backend)
    poll_us = best_us(poller.poll, args.repeat)
    alone_us = best_us(fast_only_poller(ConstantBackend(backend, args.gpus)).poll, args.repeat)
    print(f"Poller.poll() (FAST only):         {poll_us:6.2f} µs")
    print(f"  over a constant backend:         {alone_us:6.2f} µs (the poller's own cost)")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20000):
            poller.poll()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    reference.close()
    backend.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
