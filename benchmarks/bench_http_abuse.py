"""gpumon's HTTP endpoint under abuse: does a normal scraper still get its metrics?

    python benchmarks/bench_http_abuse.py [--seconds 20] [--idle 1030] [--slowloris 200] [--concurrent 500]
                                          [--auth-attackers 50]

Measured in one run, all on loopback:
1. A ``gpumon run --backend fake`` subprocess, started with the usual soft limit of 1,024
   open files. A normal scraper (keep-alive, like Prometheus) scrapes /metrics 4 times a
   second: first unloaded (the reference p50/p99), then for ``--seconds`` while an attacker
   process holds ``--idle`` idle connections and ``--slowloris`` connections that send one
   header byte per second each (both re-opened when the server closes them), and sends
   waves of ``--concurrent`` simultaneous GETs, one wave after the other. Printed: the
   scraper's p50/p99 and failures in both phases and their ratio, the waves' completion
   times, and the daemon's most threads and open files.
2. Basic auth under a password flood: a daemon with a bcrypt (cost 10) user;
   ``--auth-attackers`` clients from 127.0.0.2 send wrong passwords without pause; after
   2 s a new client with the correct password (not yet cached) from 127.0.0.1 is timed,
   5 times, against one bcrypt check measured in the same run.
Attackers run in their own process (asyncio) so that they do not share the scraper's GIL.
Bounded: everything stops after ``--seconds`` (and at most 10 minutes) by itself.
Nothing is asserted; the printed table is the result.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import resource
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bcrypt
import requests

REPO = Path(__file__).resolve().parent.parent
ATTACKER = "127.0.0.2"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int) -> tuple[int, int]:
    threads = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("Threads:")
    )
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def soft_nofile_1024() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


def start_daemon(tmp: Path, *extra: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    log = (tmp / f"gpumon-{port}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "run", "--backend", "fake", "--fake-gpus", "2",
         "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp / f"state-{port}"), *extra],
        stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), preexec_fn=soft_nofile_1024,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code in (200, 401):
                return proc, port
        except requests.RequestException:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"gpumon did not start; see {log.name}")


# --- the attacker process ------------------------------------------------------------------------------


async def _hold_idle(port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))
        except OSError:
            await asyncio.sleep(0.5)
            continue
        with contextlib.suppress(Exception):
            await reader.read(1)  # returns when the server closes it: open another
        writer.close()
        await asyncio.sleep(0.1)


async def _slowloris(port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            while not stop.is_set():
                await asyncio.sleep(1.0)
                writer.write(b"X")
                await writer.drain()
        except OSError:
            await asyncio.sleep(0.5)


async def _get(port: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body = await asyncio.wait_for(reader.read(), 60)
        writer.close()
        return body.startswith(b"HTTP/1.1 200")
    except (OSError, TimeoutError):
        return False


async def _waves(port: int, concurrent: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.monotonic()
        results = await asyncio.gather(*(_get(port) for _ in range(concurrent)))
        print(f"wave {time.monotonic() - start:.3f} {sum(results)}", flush=True)
        await asyncio.sleep(0.5)


async def _password_flood(port: int, stop: asyncio.Event) -> None:
    while not stop.is_set():
        auth = base64.b64encode(f"prometheus:{secrets.token_hex(8)}".encode()).decode()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(ATTACKER, 0))
            writer.write(f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n\r\n".encode())
            await asyncio.wait_for(reader.read(), 60)
            writer.close()
        except (OSError, TimeoutError):
            await asyncio.sleep(0.1)


async def attack(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_hold_idle(args.port, stop)) for _ in range(args.idle)]
    tasks += [asyncio.create_task(_slowloris(args.port, stop)) for _ in range(args.slowloris)]
    if args.concurrent:
        tasks.append(asyncio.create_task(_waves(args.port, args.concurrent, stop)))
    tasks += [asyncio.create_task(_password_flood(args.port, stop)) for _ in range(args.auth_attackers)]
    await asyncio.sleep(min(args.seconds, 600))
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def run_attacker(port: int, seconds: float, **counts: int) -> subprocess.Popen[str]:
    argv = [sys.executable, __file__, "--attacker", "--port", str(port), "--seconds", str(seconds)]
    for name, value in counts.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


# --- the measurements ------------------------------------------------------------------------------------


class Scrapes:
    """Latencies (s) and failures of one kind of scrape."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.failures = 0

    def line(self) -> str:
        total = len(self.latencies) + self.failures
        return (f"p50 {pct(self.latencies, 0.5) * 1e3:8.2f} ms  p99 {pct(self.latencies, 0.99) * 1e3:8.2f} ms  "
                f"failed {self.failures}/{total}")  # fmt: skip


def scrape_for(session: requests.Session, url: str, seconds: float, pid: int) -> tuple[Scrapes, Scrapes, int, int]:
    """Scrape 4 times a second for ``seconds``, alternately on a kept-alive connection (as
    Prometheus does) and on a new one (as after the server closed it): both kinds of
    scrapes, the most threads and the most open files of the daemon."""
    kept, fresh = Scrapes(), Scrapes()
    threads = fds = 0
    end = time.monotonic() + seconds
    turn = 0
    while time.monotonic() < end:
        turn += 1
        kind = kept if turn % 2 else fresh
        start = time.monotonic()
        try:
            get = session.get if kind is kept else requests.get
            ok = get(url, timeout=10).status_code == 200
        except requests.RequestException:
            ok = False
        if ok:
            kind.latencies.append(time.monotonic() - start)
        else:
            kind.failures += 1
        t, f = proc_status(pid)
        threads, fds = max(threads, t), max(fds, f)
        time.sleep(max(0.0, 0.25 - (time.monotonic() - start)))
    return kept, fresh, threads, fds


def abuse(args: argparse.Namespace, tmp: Path) -> None:
    proc, port = start_daemon(tmp)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with requests.Session() as session:
            ref, ref_fresh, ref_threads, ref_fds = scrape_for(session, url, 6.0, proc.pid)
            attacker = run_attacker(
                port,
                args.seconds + 2,
                idle=args.idle,
                slowloris=args.slowloris,
                concurrent=args.concurrent,
                auth_attackers=0,
            )
            time.sleep(2.0)  # let the attack build up
            load, load_fresh, threads, fds = scrape_for(session, url, args.seconds, proc.pid)
            out, _ = attacker.communicate(timeout=60)
    finally:
        proc.terminate()
        proc.wait(10)
    waves = [line.split() for line in out.splitlines() if line.startswith("wave ")]
    wave_times = [float(w[1]) for w in waves]
    wave_ok = sum(int(w[2]) for w in waves)
    print(f"daemon unloaded: {ref_threads} threads, {ref_fds} open files")
    print(f"scrape, kept-alive, unloaded:  {ref.line()}")
    print(f"scrape, kept-alive, attacked:  {load.line()}")
    print(f"scrape, new conn.,  unloaded:  {ref_fresh.line()}")
    print(f"scrape, new conn.,  attacked:  {load_fresh.line()}")
    for name, unloaded, attacked in (("kept-alive", ref, load), ("new conn.", ref_fresh, load_fresh)):
        p50 = pct(attacked.latencies, 0.5) / pct(unloaded.latencies, 0.5)
        p99 = pct(attacked.latencies, 0.99) / pct(unloaded.latencies, 0.99)
        print(f"ratio attacked/unloaded, {name}: p50 {p50:.1f}x  p99 {p99:.1f}x")
    print(f"daemon under attack: at most {threads} threads, {fds} open files")
    if wave_times:
        print(f"waves of {args.concurrent} GETs:         {len(waves)} waves, each done in p50 "
              f"{statistics.median(wave_times):.2f} s / max {max(wave_times):.2f} s; "
              f"{wave_ok}/{len(waves) * args.concurrent} answered 200")  # fmt: skip
    else:
        print(f"waves of {args.concurrent} GETs: not one wave completed")


def auth_flood(args: argparse.Namespace, tmp: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10))
    start = time.monotonic()
    for _ in range(5):
        bcrypt.checkpw(b"wrong", hashed)
    one_check = (time.monotonic() - start) / 5
    web_config = tmp / "web-config.yml"
    web_config.write_text(f"basic_auth_users:\n  prometheus: '{hashed.decode()}'\n")
    proc, port = start_daemon(tmp, "--web-config-file", str(web_config))
    url = f"http://127.0.0.1:{port}/metrics"
    waits = []
    try:
        attacker = run_attacker(port, 2 + 5 * 3, idle=0, slowloris=0, concurrent=0, auth_attackers=args.auth_attackers)
        time.sleep(2.0)
        for _ in range(5):
            # a new client: credentials not yet cached (the hash changes each round)
            hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(10))
            web_config.write_text(f"basic_auth_users:\n  prometheus: '{hashed.decode()}'\n")
            time.sleep(1.2)  # the web config is re-read at most once a second
            start = time.monotonic()
            status = requests.get(url, auth=("prometheus", "s3cret"), timeout=60).status_code
            waits.append(time.monotonic() - start)
            assert status == 200, status
        attacker.communicate(timeout=60)
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"one bcrypt check (cost 10): {one_check * 1e3:.1f} ms")
    print(f"correct password behind {args.auth_attackers} wrong-password clients: "
          f"median {statistics.median(waits):.3f} s, max {max(waits):.3f} s "
          f"({max(waits) / one_check:.1f}x one check)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--idle", type=int, default=1030)
    parser.add_argument("--slowloris", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=500)
    parser.add_argument("--auth-attackers", type=int, default=50)
    parser.add_argument("--attacker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    if args.attacker:
        asyncio.run(attack(args))
        return
    import tempfile

    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; attackers from {ATTACKER}")
    with tempfile.TemporaryDirectory() as tmp:
        abuse(args, Path(tmp))
        if args.auth_attackers:
            auth_flood(args, Path(tmp))


if __name__ == "__main__":
    main()
