"""gpumon run under faults, as an operator meets them: a backend read that hangs, SIGHUP and
SIGTERM in every order, broken configuration files on reload, a restart with an old alert spool.

Every test runs the real daemon (``python -m gpumon run --backend fake:SCENARIO``) in a
subprocess, plays systemd's part on a notification socket (READY, RELOADING, WATCHDOG), and
judges what a user sees: the exit code and how long SIGTERM took, /metrics, /ready, /healthz,
the log, and the datagrams systemd would get.
"""

from __future__ import annotations

import json
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, value, wait_for

pytestmark = pytest.mark.faults  # the daemon under faults, as a user meets them: make test-faults


class Systemd:
    """The notification socket systemd would hold: every datagram with the time it arrived."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(path)
        self._sock.settimeout(0.2)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def env(self) -> dict[str, str]:
        # a 2 s watchdog: gpumon must ping at least every second
        return {"NOTIFY_SOCKET": self.path, "WATCHDOG_USEC": "2000000"}

    def _receive(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._sock.recv(4096)
            except OSError:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def count(self, assignment: str) -> int:
        return sum(1 for _, m in self.messages if assignment in m.splitlines())

    def last(self, assignment: str) -> float:
        return max((t for t, m in self.messages if assignment in m.splitlines()), default=0.0)

    def wait_for_a_fresh_ping(self) -> None:
        """The main loop lives: a new WATCHDOG=1 arrives. gpumon pings every second for this 2 s
        watchdog (the period itself is tested in tests/test_systemd.py); 5 s allows a loaded box."""
        pings = self.count("WATCHDOG=1")
        wait_for(lambda: self.count("WATCHDOG=1") > pings, timeout=5, what="a fresh WATCHDOG=1 ping")

    def close(self) -> None:
        self._closed.set()
        self._thread.join(1)
        self._sock.close()


@pytest.fixture
def systemd() -> Iterator[Systemd]:
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="sdn") as tmp:  # AF_UNIX paths stop at 108 bytes
        sd = Systemd(str(Path(tmp) / "notify"))
        try:
            yield sd
        finally:
            sd.close()


# ---- hang, reload and stop in every order ---------------------------------------------------------

FIRST_INTERVAL = 0.5
RELOAD_INTERVALS = (0.25, 0.3)


class Run:
    """One daemon on a scenario whose GPU read hangs at a given tick, driven step by step."""

    def __init__(
        self, start: Callable[..., DaemonProcess], systemd: Systemd, tmp_path: Path, hang_at_tick: int | None
    ) -> None:
        self.systemd = systemd
        self.config = tmp_path / "gpumon.yaml"
        self.interval = FIRST_INTERVAL
        self._write_config()
        scenario = tmp_path / "scenario.yaml"
        gpu = "{}" if hang_at_tick is None else f"{{hang_at_tick: {hang_at_tick}, hang_seconds: 600}}"
        scenario.write_text(f"gpus: [{gpu}, {{}}]\n")
        self.daemon = start("--backend", f"fake:{scenario}", "--config", str(self.config), env=systemd.env(), wait=True)
        self.hanging = False
        self.reloads = 0
        wait_for(lambda: systemd.count("READY=1") >= 1, what="READY=1 on the notification socket")

    def _write_config(self) -> None:
        self.config.write_text(f"interval_seconds: {self.interval}\nslow_interval_seconds: 2\n")

    def hang(self) -> None:
        """Wait until the poll is stuck inside the backend (the served snapshot ages)."""
        wait_for(
            lambda: (value(self.daemon.metrics(), "gpumon_snapshot_age_seconds") or 0) > max(2.0, 4 * self.interval),
            timeout=20,
            what="the backend read to hang",
        )
        self.hanging = True

    def reload(self, signal_only: bool = False) -> None:
        """Change interval_seconds and send SIGHUP; unless ``signal_only``, wait until it is in force."""
        self.interval = RELOAD_INTERVALS[self.reloads % len(RELOAD_INTERVALS)]
        self.reloads += 1
        self._write_config()
        ready_before = self.systemd.count("READY=1")
        self.daemon.signal(signal.SIGHUP)
        if signal_only:
            return
        wait_for(
            lambda: self.daemon.log().count("configuration reloaded") == self.reloads,
            timeout=5,
            what=f"reload {self.reloads} logged",
        )
        wait_for(lambda: self.systemd.count("READY=1") > ready_before, timeout=5, what="READY=1 after RELOADING=1")
        assert self.systemd.count("RELOADING=1") == self.reloads
        self.check_serving()

    def check_serving(self) -> None:
        """/metrics, /ready, /healthz answer at once, with the running interval; systemd is pinged."""
        text = self.daemon.metrics()
        assert f"Refreshed every {self.interval:g}s" in text
        assert value(text, "gpumon_gpu_up", gpu="1") == 1.0, "the last snapshot is served"
        assert self.daemon.get("/healthz", timeout=1).text == "ok\n"
        ready = self.daemon.get("/ready", timeout=1)
        assert ready.status_code == (503 if self.hanging else 200), ready.text
        self.systemd.wait_for_a_fresh_ping()
        if self.hanging:
            wait_for(
                lambda: (value(self.daemon.metrics(), "gpumon_poll_skipped_total") or 0) >= 1,
                timeout=5,
                what="skipped polls counted",
            )

    def stop(self) -> None:
        """SIGTERM: exit 0 within 2 s."""
        start = time.monotonic()
        self.daemon.signal(signal.SIGTERM)
        try:
            code = self.daemon.proc.wait(5)
        except Exception:
            raise AssertionError(f"gpumon still alive 5 s after SIGTERM:\n{self.daemon.log()[-3000:]}") from None
        took = time.monotonic() - start
        assert code == 0, self.daemon.log()[-3000:]
        assert took < 2.0, f"SIGTERM took {took:.2f} s"
        assert "gpumon stopping" in self.daemon.log()
        assert "Traceback" not in self.daemon.log()
        assert self.systemd.count("STOPPING=1") == 1


# "hang, reload, stop" and "reload, hang, stop" are left out: their steps run, in that order, as the
# first steps of "hang, two reloads, stop" and "reload, hang, reload, stop", which check the daemon
# after each step, and "stop" ends them the same way.
STEPS = {
    "stop during a hang": ["hang", "stop"],
    "hang, two reloads, stop": ["hang", "reload", "reload", "stop"],
    "reload, hang, reload, stop": ["reload", "hang", "reload", "stop"],
    "hang, SIGHUP and SIGTERM at once": ["hang", "reload+stop"],
    "SIGHUP and SIGTERM at once, no hang": ["reload+stop"],
    "reload then stop, no hang": ["reload", "stop"],
}


@pytest.mark.parametrize("steps", list(STEPS.values()), ids=list(STEPS))
def test_sigterm_ends_the_daemon_within_2_s_whatever_hangs_and_reloads_came_before(
    start_daemon: Callable[..., DaemonProcess], systemd: Systemd, tmp_path: Path, steps: list[str]
) -> None:
    hang_first = steps[0] == "hang"
    hang_at_tick = None if "hang" not in steps else (3 if hang_first else 14)
    run = Run(start_daemon, systemd, tmp_path, hang_at_tick)
    for step in steps:
        if step == "hang":
            run.hang()
        elif step == "reload":
            run.reload()
        elif step == "reload+stop":
            run.reload(signal_only=True)
            run.stop()
        else:
            run.stop()


def test_after_a_hang_ends_polls_resume_at_the_reloaded_interval(
    start_daemon: Callable[..., DaemonProcess], systemd: Systemd, tmp_path: Path
) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text("interval_seconds: 0.5\n")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("gpus: [{hang_at_tick: 3, hang_seconds: 4}]\n")
    daemon = start_daemon("--backend", f"fake:{scenario}", "--config", str(config), env=systemd.env())
    wait_for(lambda: (value(daemon.metrics(), "gpumon_snapshot_age_seconds") or 0) > 1.5, what="the hang")
    config.write_text("interval_seconds: 0.25\n")
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: "configuration reloaded" in daemon.log(), what="the reload during the hang")
    wait_for(lambda: daemon.get("/ready").status_code == 200, timeout=10, what="fresh snapshots after the hang")
    skipped = value(daemon.metrics(), "gpumon_poll_skipped_total") or 0
    assert skipped >= 4, "the polls that could not start during the ~4 s hang are counted"
    log = daemon.log()
    assert log.count("polls are skipped until it returns") == 1, "one line when a poll overruns, not one per skip"
    assert "poll returned after" in log
    # polls run every 0.25 s now: ticks advance about 4 per second
    before = json.loads(daemon.get("/api/snapshot").text)["timestamp_seconds"]
    wait_for(
        lambda: json.loads(daemon.get("/api/snapshot").text)["timestamp_seconds"] > before,
        timeout=5,
        what="a newer snapshot",
    )
    assert "Refreshed every 0.25s" in daemon.metrics()


# ---- broken configuration files on SIGHUP -----------------------------------------------------------

BROKEN = {
    "a Latin-1 byte": b"interval_seconds: 2\n# caf\xe9\n",
    "nesting 1000 deep": ("interval_seconds: 2\nexporter: " + "[" * 1000 + "]" * 1000 + "\n").encode(),
    "a 400-digit interval": ("interval_seconds: " + "9" * 400 + "\n").encode(),
    "an infinite XID code": b"interval_seconds: 2\nxid_catalog: {.inf: {action: reset_gpu}}\n",
    "infinite intervals": b"interval_seconds: .inf\nslow_interval_seconds: .inf\nstatic_interval_seconds: .inf\n",
    "a NaN interval": b"interval_seconds: .nan\n",
    "an interval too large for a timer": b"interval_seconds: 1e300\nslow_interval_seconds: 1e300\n"
    b"static_interval_seconds: 1e300\n",
}


def test_a_broken_file_on_sighup_keeps_the_running_configuration(
    start_daemon: Callable[..., DaemonProcess], systemd: Systemd, tmp_path: Path
) -> None:
    """One daemon meets every broken file in turn, each followed by a good reload (one start, not seven)."""
    config = tmp_path / "gpumon.yaml"
    interval = 1
    config.write_text(f"interval_seconds: {interval}\n")
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "1", "--config", str(config), env=systemd.env())
    text = daemon.metrics()
    assert value(text, "gpumon_config_last_reload_successful") == 1.0
    last_good = value(text, "gpumon_config_last_reload_success_timestamp_seconds")
    assert last_good is not None and abs(last_good - time.time()) < 60

    for name, content in BROKEN.items():
        log_before = daemon.log().splitlines()
        ready_before = systemd.count("READY=1")
        config.write_bytes(content)
        daemon.signal(signal.SIGHUP)
        wait_for(
            lambda: value(daemon.metrics(), "gpumon_config_last_reload_successful") == 0.0,
            what=f"{name}: the failed reload in the metrics",
        )
        assert daemon.proc.poll() is None, daemon.log()
        new_lines = daemon.log().splitlines()[len(log_before) :]
        assert "Traceback" not in daemon.log(), name
        about_reload = [line for line in new_lines if "reload" in line]
        assert len(about_reload) == 1, (name, new_lines)
        assert "keeping the running configuration" in about_reload[0], name
        text = daemon.metrics()
        assert f"Refreshed every {interval}s" in text, f"{name}: the old interval is kept"
        assert value(text, "gpumon_config_last_reload_success_timestamp_seconds") == last_good, name
        assert daemon.get("/ready").status_code == 200, name
        # systemd hears that the reload is over (and still gets its pings)
        wait_for(
            lambda before=ready_before: systemd.count("READY=1") > before,
            what=f"{name}: READY=1 after the failed reload",
        )
        systemd.wait_for_a_fresh_ping()

        interval = 3 - interval  # 1 <-> 2
        config.write_text(f"interval_seconds: {interval}\n")
        daemon.signal(signal.SIGHUP)
        wait_for(
            lambda: value(daemon.metrics(), "gpumon_config_last_reload_successful") == 1.0,
            what=f"{name}: a good reload after it",
        )
        text = daemon.metrics()
        assert f"Refreshed every {interval}s" in text, name
        reloaded_at = value(text, "gpumon_config_last_reload_success_timestamp_seconds") or 0
        assert reloaded_at > last_good, name
        last_good = reloaded_at


# ---- restart with an old spool and a slow first poll ------------------------------------------------


def test_restart_with_an_hour_old_spool_and_a_slow_first_poll_raises_no_stale_alert(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    spool = tmp_path / "state" / "alerts" / "spool.json"
    spool.parent.mkdir(parents=True)
    spool.write_text(
        json.dumps(
            {
                "version": 1,
                "engine": {"active": [], "last_snapshot_at": time.time() - 3600},
                "delivered": [],
                "queues": {},
            }
        )
    )
    scenario = tmp_path / "slow-start.yaml"
    scenario.write_text("gpus: [{hang_at_tick: 0, hang_seconds: 3}]\n")  # the first poll takes 3 s
    daemon = start_daemon("--backend", f"fake:{scenario}", wait=False)
    seen: list[str] = []

    def first_poll_done() -> bool:
        if daemon.proc.poll() is not None:
            raise AssertionError(daemon.log())
        body = daemon.get("/api/alerts", timeout=1).json()
        seen.extend(a["labels"]["alertname"] for a in body["alerts"])
        return daemon.get("/ready", timeout=1).status_code == 200

    wait_for(first_poll_done, timeout=20, interval=0.2, what="the first poll")
    # two more polls (1 s apart), while the alert timer ticks every second, with alerts collected throughout
    first = daemon.get("/api/snapshot").json()["timestamp_seconds"]

    def two_more_polls() -> bool:
        seen.extend(a["labels"]["alertname"] for a in daemon.get("/api/alerts", timeout=1).json()["alerts"])
        return bool(daemon.get("/api/snapshot", timeout=1).json()["timestamp_seconds"] >= first + 1.5)

    wait_for(two_more_polls, timeout=15, interval=0.2, what="two more polls after the first")
    assert "GpuSnapshotStale" not in seen
    assert value(daemon.metrics(), "gpumon_alerts", alertname="GpuSnapshotStale", state="firing") is None
