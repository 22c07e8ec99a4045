"""Issue 42 item 6, adversarial: SIGHUPs at a given rate (or as fast as a loop sends them) against several
``gpumon run --backend fake`` daemons while /metrics is scraped, then SIGTERM. Prints, per daemon, whether
it survived the storm, the scrapes answered, and how long SIGTERM took (or that it was ignored).

    PYTHONPATH=$PWD python scripts/adversary_signal_storm.py --daemons 8 --rate 1500 --seconds 10
    PYTHONPATH=$PWD python scripts/adversary_signal_storm.py --daemons 2 --rate 0 --seconds 5   # flat out
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import DaemonProcess


def storm(pid: int, rate: float, seconds: float, sent: list[int]) -> None:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            break
        n += 1
        if rate > 0 and n % 15 == 0:  # paced in bursts of 15
            time.sleep(max(0.0, n / rate - (seconds - (end - time.monotonic()))))
    sent.append(n)


def scrape(url: str, seconds: float, out: list[bool]) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            out.append(requests.get(url + "/metrics", timeout=5).status_code == 200)
        except requests.RequestException:
            out.append(False)
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--daemons", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1500.0, help="SIGHUPs a second per daemon; 0: flat out")
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="storm-"))
    daemons = []
    for i in range(args.daemons):
        d = tmp / f"d{i}"
        d.mkdir()
        daemons.append(DaemonProcess(["--backend", "fake"], d))
    for daemon in daemons:
        daemon.wait_ready(timeout=60)
    sent: list[list[int]] = [[] for _ in daemons]
    scrapes: list[list[bool]] = [[] for _ in daemons]
    threads = []
    for i, daemon in enumerate(daemons):
        threads.append(threading.Thread(target=storm, args=(daemon.proc.pid, args.rate, args.seconds, sent[i])))
        threads.append(threading.Thread(target=scrape, args=(daemon.url, args.seconds, scrapes[i])))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failures = 0
    for i, daemon in enumerate(daemons):
        alive = daemon.proc.poll() is None
        answered = f"{sum(scrapes[i])}/{len(scrapes[i])}"
        took = "-"
        if alive:
            start = time.monotonic()
            daemon.proc.send_signal(signal.SIGTERM)
            try:
                daemon.proc.wait(10)
                took = f"{time.monotonic() - start:.2f} s, exit {daemon.proc.returncode}"
            except subprocess.TimeoutExpired:
                took = "IGNORED (killed after 10 s)"
                daemon.proc.kill()
                daemon.proc.wait()
        ok = alive and "IGNORED" not in took and daemon.proc.returncode == 0
        failures += not ok
        print(
            f"daemon {i}: {sent[i][0] if sent[i] else 0} SIGHUPs ({(sent[i][0] if sent[i] else 0) / args.seconds:.0f}/s), "
            f"survived {alive}, scrapes answered {answered}, SIGTERM: {took}"
            + ("" if alive else f"; exit {daemon.proc.returncode}: {daemon.log()[-400:]}")
        )
        daemon.stop()
    print(f"{args.daemons - failures}/{args.daemons} daemons survived the storm and stopped on SIGTERM")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
