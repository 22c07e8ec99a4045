"""Issue 42 item 12, adversarial: SIGKILL inside alert spool writes, deliveries counted.

``gpumon run`` on simulated GPUs whose temperatures cross a threshold every few polls, a webhook
receiver here counting every notification it gets, and a fault injected into the daemon (a
sitecustomize written to a temporary folder first on its PYTHONPATH): each fsync, chmod or rename of
the alert spool's files SIGKILLs the daemon with probability ``--p``. The daemon is started again
after each kill until ``--kills`` kills, then runs clean until every queue is empty. Prints the
notifications delivered, distinct ones (by fingerprint, status, startsAt, endsAt: webhooks'
``notificationID``), the duplicates, and the most any one restart sent again against the size of the
batch that was in flight at its kill.

    PYTHONPATH=$PWD python scripts/adversary_spool_kills.py --kills 50
    PYTHONPATH=$PWD python scripts/adversary_spool_kills.py --kills 50 --fsync-delay 0.05   # a slow disk
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.alerts.helpers import TestReceiver
from tests.helpers import DaemonProcess, wait_for

INJECT = """
import os, random, signal
_P = float(os.environ.get("KILL_SPOOL_WRITE_P", "0"))
def _spool(x):
    try:
        name = os.readlink(f"/proc/self/fd/{x}") if isinstance(x, int) else os.fspath(x)
    except OSError:
        return False
    return "/alerts" in str(name)
_DELAY = float(os.environ.get("SPOOL_FSYNC_DELAY", "0"))
def _wrap(real):
    def call(*args, **kwargs):
        if args and _spool(args[0]) and real.__name__ == "fsync" and _DELAY:
            import time
            time.sleep(_DELAY)  # a disk whose fsync takes this long
        if args and _spool(args[0]) and random.random() < _P:
            with open(os.environ["KILL_LOG"], "a") as f:
                f.write(real.__name__ + "\\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return call
if _P:
    os.fsync, os.chmod, os.replace = _wrap(os.fsync), _wrap(os.chmod), _wrap(os.replace)
"""


def key(alert: dict[str, Any]) -> tuple[str, ...]:
    return alert["fingerprint"], alert["status"], alert["startsAt"], alert["endsAt"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--p", type=float, default=0.05, help="chance that one spool fsync/chmod/rename kills")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--fsync-delay", type=float, default=0.0, help="seconds each spool fsync takes (a slow disk)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="spool-kills-"))
    (tmp / "inject").mkdir()
    (tmp / "inject" / "sitecustomize.py").write_text(INJECT)
    incarnation = [0]
    posts: list[tuple[int, list[tuple[str, ...]]]] = []
    lock = threading.Lock()
    receiver = TestReceiver().start()

    class Recording(list):  # type: ignore[type-arg]
        def append(self, item: Any) -> None:  # every POST, with the incarnation that sent it
            with lock:
                posts.append((incarnation[0], [key(a) for a in item.body["alerts"]]))
            super().append(item)

    receiver.received = Recording()
    ticks = 6000
    scenario = {
        "gpus": [
            {"values": {"temperature_celsius": [90 if (t // (2 + g)) % 2 else 40 for t in range(ticks)]}}
            for g in range(args.gpus)
        ]
    }
    (tmp / "scenario.json").write_text(json.dumps(scenario))
    rule = {"name": "Hot", "field": "temperature_celsius", "op": ">", "threshold": 85, "for": 0}
    config = {
        "interval_seconds": 0.2,
        "alerting": {
            "builtin_rules": False,
            "rules": [rule],
            "webhooks": [receiver.url],
            "retry": {"initial_backoff": "100ms", "max_backoff": "1s", "timeout": "5s"},
        },
    }
    (tmp / "gpumon.yaml").write_text(json.dumps(config))
    env = {"PYTHONPATH": f"{tmp / 'inject'}:{Path.cwd()}", "KILL_LOG": str(tmp / "kills.log")}
    kills = 0
    while kills < args.kills:
        daemon = DaemonProcess(
            ["--backend", f"fake:{tmp / 'scenario.json'}", "--config", str(tmp / "gpumon.yaml")],
            tmp,
            env={**env, "KILL_SPOOL_WRITE_P": str(args.p), "SPOOL_FSYNC_DELAY": str(args.fsync_delay)},
        )
        daemon.state_dir = tmp / "state"
        try:
            daemon.proc.wait(60)
        except subprocess.TimeoutExpired:
            daemon.stop()
            continue
        finally:
            with lock:
                incarnation[0] += 1
        if daemon.proc.returncode == -signal.SIGKILL:
            kills += 1
        else:
            print(daemon.log()[-2000:])
            return 1
    daemon = DaemonProcess(
        ["--backend", "fake", "--fake-gpus", "0", "--config", str(tmp / "gpumon.yaml")], tmp, env=env
    )
    try:  # a clean run with no GPUs resolves nothing new: it only delivers what the spool holds
        wait_for(
            lambda: requests.get(daemon.url + "/api/alerts", timeout=5).json()["receivers"][0]["queue_length"] == 0, 60
        )
    finally:
        daemon.stop()
    seen: Counter[tuple[str, ...]] = Counter()
    sent_by: dict[int, set[tuple[str, ...]]] = {}
    last_before: dict[int, set[tuple[str, ...]]] = {}
    """Per incarnation: the last batch received before it started (the one in flight at the kill)."""
    previous: set[tuple[str, ...]] = set()
    for inc, alerts in posts:
        last_before.setdefault(inc, previous)
        sent_by.setdefault(inc, set()).update(alerts)
        seen.update(alerts)
        previous = set(alerts)
    worst_again = worst_in_flight = outside = 0
    for inc in sorted(sent_by):
        earlier = set().union(*(sent_by[i] for i in sent_by if i < inc))
        again = sent_by[inc] & earlier
        outside += len(again - last_before[inc])
        if len(again) > worst_again:
            worst_again, worst_in_flight = len(again), len(last_before[inc])
    total = sum(seen.values())
    duplicates = total - len(seen)
    kill_points = Counter((tmp / "kills.log").read_text().split())
    print(
        f"{kills} SIGKILLs inside spool writes ({dict(kill_points)}); {len(posts)} POSTs, {total} notifications "
        f"delivered, {len(seen)} distinct, {duplicates} duplicate deliveries "
        f"({sum(1 for n in seen.values() if n > 1)} notifications more than once, at most {max(seen.values())} times); "
        f"the most one restart sent again: {worst_again} (the batch in flight at that kill: {worst_in_flight}); "
        f"sent again though not in the batch in flight at the kill: {outside}"
    )
    receiver.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
