"""Start a ``gpumon run`` subprocess for the benchmarks and scrape it the way Prometheus does."""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

ACCEPT_OPENMETRICS = (
    # what Prometheus 2.42 sends
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
VARIANTS = {
    "text": {},
    "text+gzip": {"Accept-Encoding": "gzip"},
    "openmetrics+gzip": {"Accept": ACCEPT_OPENMETRICS, "Accept-Encoding": "gzip"},
}
"""Scrape header sets: plain text, text gzipped, and Prometheus 2.42's own request."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_cpu_seconds(pid: int) -> float:
    """CPU time of every thread of process ``pid``, seconds: the sum of /proc/PID/task/*/schedstat's
    run time (nanoseconds) where the kernel has it, else user + system (10 ms clock ticks: a 30 s
    window of a 0.3 % daemon is only 9 ticks, too coarse to compare two builds)."""
    total_ns = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(FileNotFoundError, ProcessLookupError),
                open(f"/proc/{pid}/task/{tid}/schedstat") as f,
            ):
                total_ns += int(f.read().split()[0])
    except OSError:
        times = psutil.Process(pid).cpu_times()
        return float(times.user + times.system)
    return total_ns / 1e9


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU time of each thread of process ``pid`` (schedstat run time), seconds by thread id; empty
    where the kernel has no schedstat."""
    out: dict[int, float] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with (
                contextlib.suppress(FileNotFoundError, ProcessLookupError),
                open(f"/proc/{pid}/task/{tid}/schedstat") as f,
            ):
                out[int(tid)] = int(f.read().split()[0]) / 1e9
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def daemon(
    fake_gpus: int,
    backend: str = "fake",
    prefix: list[str] | None = None,
    args: list[str] | None = None,
    tree: Path | None = None,
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """A ready ``gpumon run`` on a free port with a scratch state dir (default intervals);
    ``prefix`` replaces ``-m gpumon`` (e.g. the sampling profiler and its output file);
    ``args`` are appended to the command line (e.g. ``--compat dcgm``); ``tree``: the gpumon
    checkout whose modules it runs (default: this one)."""
    port = free_port()
    state = Path(tempfile.mkdtemp(prefix="gpumon-bench-"))
    cmd = [sys.executable, *(prefix or ["-m", "gpumon"]), "run", "--backend", backend, "--fake-gpus", str(fake_gpus)]
    cmd += ["--listen", f"127.0.0.1:{port}", "--state-dir", str(state), "--log-level", "warning"]
    cmd += args or []
    # the checkout first, then what the caller's PYTHONPATH holds (packages installed with --target)
    paths = [str(tree or Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))
    # in the tree's own folder too: ``python -m`` puts the working folder ahead of PYTHONPATH
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tree)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if get(port, "/ready")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit("daemon did not become ready: " + (proc.stderr.read() if proc.stderr else ""))
            time.sleep(0.1)
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(state, ignore_errors=True)


def get(
    port: int, path: str, headers: dict[str, str] | None = None, conn: http.client.HTTPConnection | None = None
) -> tuple[int, bytes]:
    own = conn is None
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path, headers=headers or {})
        response = c.getresponse()
        return response.status, response.read()
    finally:
        if own:
            c.close()


def bytecode_note(tree: Path | None = None) -> str | None:
    """A warning line when gpumon's modules in ``tree`` (default: this checkout) have no compiled
    bytecode, else None. Without it the daemon compiles every module from source at each start
    (a fresh copy, ``PYTHONDONTWRITEBYTECODE``), which can leave its heap 8 MiB larger on a real
    host, depending on the order of allocations; an installed gpumon has its bytecode (pip compiles it)."""
    root = (tree or Path(__file__).resolve().parent.parent) / "gpumon"
    sources = list(root.rglob("*.py"))
    missing = [s for s in sources if not Path(importlib.util.cache_from_source(str(s))).exists()]
    if not missing:
        return None
    return (
        f"# note: {len(missing)} of gpumon's {len(sources)} modules have no compiled bytecode, so the daemon compiles "
        f"them at start and its RSS is not an installed daemon's: python3 -m compileall -q {root}"
    )
