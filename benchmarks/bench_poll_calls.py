"""What one poll runs on the poll thread, counted: Python calls, C calls and distinct functions per poll,
by module; and its thread CPU. Optionally against another checkout.

    python benchmarks/bench_poll_calls.py [--backend nvml|fake] [--gpus 1] [--polls 200] [--top 0]
        [--cold] [--reference CHECKOUT] [--pairs 3] [--quick]

A ``Daemon`` (built, its port bound, never started) is polled with a simulated second between polls,
on ``--backend nvml``: the real ``NvmlBackend`` (spaced, as the daemon's) over tests/fake_pynvml.py,
so every line of gpumon's Python around each NVML call runs as on a real host, the binding's own
Python counted apart (``binding``: on a real host the lines of pynvml and ctypes it stands for); or
``--backend fake``: ``FakeBackend.plausible`` (a simulation, not the real backend). Each store
listener runs as in the daemon (the collector's render-ahead included: its own line).

Calls are counted with ``sys.setprofile`` over ``--polls // 10`` polls (the profile slows them, so
CPU is measured on other polls, without it): a call count is steady where thread CPU is noise, and
what a poll costs in a running daemon follows how many distinct functions and objects it touches
after the idle second (docs/benchmarks.md, "Daemon CPU, round 4"). The CPU is hot (back-to-back
polls): a running daemon pays 3-8x as much (bench_daemon_threads.py --parts measures that); with
``--cold`` each timed poll comes after 64 MiB were written, which evicts the caches as the idle second
does (the figures come near the running daemon's).

With ``--reference CHECKOUT`` (a ``git archive REV gpumon | tar -x -C DIR`` tree) the same runs in a
subprocess for that tree and for this one, ``--pairs`` times alternately (the CPU line: medians), and
each line shows both and their difference.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def _part(filename: str) -> str:
    """The part of the poll a function belongs to, by its file."""
    if "fake_pynvml" in filename:
        return "binding (tests/fake_pynvml.py)"
    if "/gpumon/" in filename:
        return "gpumon/" + filename.rsplit("/gpumon/", 1)[1]
    return "other: " + filename.rsplit("/", 1)[-1]


def measure(backend_kind: str, gpus: int, polls: int, top: int, cold: bool = False) -> dict[str, Any]:
    """Calls per poll by part, distinct functions, the most called ones, and µs of thread CPU per poll
    (``cold``: 64 MiB written before each timed poll, outside its time, so that it finds its code and
    data out of the caches, as a daemon's poll does after the idle second)."""
    from gpumon.config.file import Config
    from gpumon.daemon import Daemon

    clock, wall = [1000.0], [1.8e9]
    with tempfile.TemporaryDirectory() as state:
        config = Config(listen="127.0.0.1:0", state_dir=Path(state), backend="fake", fake_gpus=gpus)
        if backend_kind == "nvml":
            from gpumon.backends.nvml import NvmlBackend

            sys.path.append(str(HERE))  # tests/, last: a --reference tree's gpumon stays first
            from tests.fake_pynvml import FakeGpu, FakeNvml

            backend: Any = NvmlBackend(FakeNvml([FakeGpu(index=i) for i in range(gpus)]), spaced=True)
        else:
            from gpumon.backends.fake import FakeBackend

            backend = FakeBackend.plausible(gpus)
        daemon = Daemon(config, backend, monotonic=lambda: clock[0], wall_clock=lambda: wall[0])
        poller = daemon.poller
        python: collections.Counter[str] = collections.Counter()
        native: collections.Counter[str] = collections.Counter()
        functions: collections.Counter[tuple[str, str]] = collections.Counter()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                part = _part(frame.f_code.co_filename)
                python[part] += 1
                functions[(part, frame.f_code.co_name)] += 1
            elif event == "c_call":
                native[_part(frame.f_code.co_filename)] += 1

        try:
            for _ in range(30):  # every tier read, the caches of each part filled
                poller.poll()
                clock[0] += 1.0
                wall[0] += 1.0
            profiled = max(1, polls // 10)
            for _ in range(profiled):
                sys.setprofile(profile)
                poller.poll()
                sys.setprofile(None)
                clock[0] += 1.0
                wall[0] += 1.0
            cpu = 0.0
            scratch, filler = (bytearray(64 << 20), bytes(64 << 20)) if cold else (bytearray(), b"")
            for _ in range(polls):
                scratch[:] = filler  # a memcpy in C: every cache line of the last level evicted (cold only)
                start = time.thread_time()
                poller.poll()
                cpu += time.thread_time() - start
                clock[0] += 1.0
                wall[0] += 1.0
        finally:
            sys.setprofile(None)
            daemon.server.stop()  # never started: closes its listener
    by_part = {part: (python[part] / profiled, native[part] / profiled) for part in sorted(set(python) | set(native))}
    ours = [k for k in functions if not k[0].startswith(("binding", "other"))]
    return {
        "cpu_us": cpu * 1e6 / polls,
        "cold": cold,
        "parts": by_part,
        "distinct": len(ours),
        "top": [(f"{p} {name}", n / profiled) for (p, name), n in functions.most_common(top)],
    }


def in_subprocess(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)])}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--json", "--backend", args.backend]
    cmd += ["--gpus", str(args.gpus), "--polls", str(args.polls), "--top", str(args.top)]
    cmd += ["--cold"] if args.cold else []
    done = subprocess.run(cmd, env=env, cwd=HERE, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def totals(result: dict[str, Any], ours: bool) -> tuple[float, float]:
    """(Python calls, C calls) per poll: gpumon's own (``ours``) or every one."""
    rows = [v for k, v in result["parts"].items() if not ours or k.startswith("gpumon/")]
    return sum(r[0] for r in rows), sum(r[1] for r in rows)


def report(result: dict[str, Any], reference: dict[str, Any] | None) -> None:
    def line(name: str, this: float, ref: float | None) -> str:
        if ref is None:
            return f"{name:<58}{this:>10.1f}"
        return f"{name:<58}{ref:>10.1f}{this:>10.1f}{this - ref:>+9.1f}"

    head = (
        f"{'per poll':<58}{'this':>10}"
        if reference is None
        else f"{'per poll':<58}{'reference':>10}{'this':>10}{'diff':>9}"
    )
    print(head)
    ref = reference
    print(line(f"thread CPU, µs ({'cold' if result.get('cold') else 'hot'})", result["cpu_us"], ref and ref["cpu_us"]))
    for ours, label in ((False, "every"), (True, "gpumon's own")):
        py, c = totals(result, ours)
        rpy, rc = totals(ref, ours) if ref else (None, None)
        print(line(f"Python calls, {label}", py, rpy))
        print(line(f"C calls, {label}", c, rc))
    print(line("distinct gpumon functions", result["distinct"], ref and ref["distinct"]))
    parts = list(result["parts"]) + [p for p in (ref["parts"] if ref else {}) if p not in result["parts"]]
    for part in sorted(parts, key=lambda p: -sum(result["parts"].get(p, (0.0, 0.0)))):
        this_py = result["parts"].get(part, (0.0, 0.0))[0]
        ref_py = ref["parts"].get(part, (0.0, 0.0))[0] if ref else None
        print(line(f"  Python calls: {part}", this_py, ref_py))
    for name, count in result["top"]:
        print(f"    {count:8.1f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("nvml", "fake"), default="nvml")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--cold", action="store_true", help="evict the caches before each timed poll")
    parser.add_argument("--top", type=int, default=0, help="also list the N functions called most")
    parser.add_argument("--reference", type=Path, help="another checkout's tree, measured in a subprocess")
    parser.add_argument("--pairs", type=int, default=3, help="runs of each tree, alternately (CPU: the median)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="20 polls (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.polls, args.pairs = 20, 1
    if args.json:
        print(json.dumps(measure(args.backend, args.gpus, args.polls, args.top, args.cold)))
        return
    print(f"## one poll of {args.gpus} GPU(s), backend {args.backend}, in process ({args.polls} polls)")
    if args.reference is None:
        report(measure(args.backend, args.gpus, args.polls, args.top, args.cold), None)
        return
    theirs, mine = [], []
    for _ in range(args.pairs):  # alternately: a shared box's speed drifts
        theirs.append(in_subprocess(args.reference.resolve(), args))
        mine.append(in_subprocess(HERE, args))
    for runs in (theirs, mine):
        runs[0]["cpu_us"] = statistics.median(r["cpu_us"] for r in runs)  # the counts are the same every run
    report(mine[0], theirs[0])


if __name__ == "__main__":
    main()
