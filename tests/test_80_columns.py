"""Every table gpumon prints (but burn's, which tests/burn checks), as a user sees it in a real
80-column terminal (tmux): no identifying column dropped or cut, no word broken across lines,
no line the terminal itself has to wrap (issue 46, item 1)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COLUMNS = 80
DONE = "__gpumon_exited__"
WIDE_HEADERS = ("GPU", "Name", "Bus-Id", "Temp", "Power / Cap", "Util", "Memory", "SM clock", "Perf", "Throttle",
                "ECC", "NVLink", "Procs")  # fmt: skip

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (Debian package tmux)")


class Screen:
    """What an 80-column terminal shows: ``rows`` as the terminal drew them, ``lines`` as the
    program wrote them (tmux joins the rows it wrapped itself)."""

    def __init__(self, rows: list[str], lines: list[str]) -> None:
        self.rows = rows
        self.lines = lines
        self.text = "\n".join(rows)

    def words(self) -> set[str]:
        return set(self.text.split())


def in_terminal(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Screen:
    """Run ``gpumon ARGS`` in a fresh tmux server with one 80-column window; wait until it exits."""
    socket = f"gpumon-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", socket, "-f", "/dev/null"]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_") and k not in ("COLUMNS", "LINES")}
    environment.update({"PYTHONPATH": str(REPO), "TERM": "xterm-256color", **(env or {})})
    command = " ".join(f"'{a}'" for a in (sys.executable, "-m", "gpumon", *args))
    subprocess.run(
        [*tmux, "new-session", "-d", "-x", str(COLUMNS), "-y", "300", "-c", str(cwd or REPO),
         f"{command}; echo {DONE}; sleep 600"],
        check=True, env=environment, timeout=30,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            rows = capture(tmux, joined=False)
            if any(DONE in row for row in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        lines = capture(tmux, joined=True)
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, timeout=30)
    assert any(DONE in row for row in rows), "\n".join(rows)
    cut = lambda text: [r.rstrip() for r in text[: [DONE in r for r in text].index(True)]]  # noqa: E731
    return Screen(cut(rows), cut(lines))


def capture(tmux: list[str], joined: bool) -> list[str]:
    flags = "-pJ" if joined else "-p"
    out = subprocess.run([*tmux, "capture-pane", flags, "-S", "-", "-E", "-"], capture_output=True, text=True,
                         timeout=30, check=True)  # fmt: skip
    return out.stdout.splitlines()


def assert_fits(screen: Screen) -> None:
    """No line wider than the terminal (the terminal would cut it wherever it falls, mid-word too)
    and no cell cut short with an ellipsis."""
    wrapped = [line for line in screen.lines if len(line) > COLUMNS]
    assert not wrapped, "the terminal wrapped these lines:\n" + "\n".join(wrapped)
    assert "…" not in screen.text, screen.text


def assert_whole(screen: Screen, *texts: str) -> None:
    """Every word of ``texts`` is on the screen whole (not broken between two lines, not cut)."""
    missing = {w for text in texts for w in text.split()} - screen.words()
    assert not missing, f"not whole on the screen: {sorted(missing)}\n{screen.text}"


def gpu_json(*args: str) -> dict[str, object]:
    env = {"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]}
    out = subprocess.run([sys.executable, "-m", "gpumon", *args, "--json"], capture_output=True, text=True,
                         timeout=120, env=env)  # fmt: skip
    data: dict[str, object] = json.loads(out.stdout)
    return data


# ---- gpumon once ------------------------------------------------------------------------------------------
def test_once_wide_in_80_columns_keeps_every_column_and_identifies_each_gpu_in_every_part() -> None:
    screen = in_terminal("once", "--backend", "fake", "--fake-gpus", "8", "--wide")
    assert_fits(screen)
    assert_whole(screen, *WIDE_HEADERS)
    parts = [i for i, row in enumerate(screen.rows) if re.match(r"┃ GPU\s+┃ Name", row)]
    assert len(parts) >= 2, "the wide table is cut into parts one under the other:\n" + screen.text
    for start in parts:  # every part has a row for each GPU, led by its index and name
        body = [row for row in screen.rows[start:] if row.startswith("│")][:8]
        assert [int(row.split("│")[1]) for row in body] == list(range(8)), screen.text
        assert all("NVIDIA H200" in row for row in body), screen.text


def test_once_narrow_and_its_processes_in_80_columns() -> None:
    screen = in_terminal("once", "--backend", "fake", "--fake-gpus", "8")
    assert_fits(screen)
    assert_whole(screen, "GPU Temp Util Procs", "Compute processes", "PID User Name")
    assert [int(m.group(1)) for row in screen.rows if (m := re.match(r"\s*(\d)\s+\d+°C", row))] == list(range(8))


# ---- gpumon health -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", ["overheating", "xid-storm", "nvlink-degraded", "straggler"])
def test_health_rows_wrap_between_words_under_their_column(scenario: str, tmp_path: Path) -> None:
    args = ("health", "--backend", f"fake:{scenario}", "--state-dir", str(tmp_path / "state"))
    report = gpu_json(*args[:3], "--state-dir", str(tmp_path / "json-state"))
    screen = in_terminal(*args)
    assert_fits(screen)
    reasons = [str(g["reason"]) for g in report["gpus"]]  # type: ignore[attr-defined]
    node = [str(f["summary"]) for f in report["findings"] if f["gpu"] is None]  # type: ignore[attr-defined]
    assert_whole(screen, "GPU STATUS ACTION REASON", *reasons, *node)
    indexes = [int(row.split()[0]) for row in screen.rows if re.match(r"\d+\s+(OK|WARNING|CRITICAL|UNKNOWN)\s", row)]
    assert indexes == [int(g["gpu"]) for g in report["gpus"]], screen.text  # type: ignore[attr-defined]


# ---- gpumon alerts ---------------------------------------------------------------------------------------------
ALERTS = {
    "host": "gpu-node-017.cluster.example.org",
    "alerts": [
        {"state": "firing", "severity": "critical", "alertname": "GpuHwPowerBrakeSlowdown", "gpu": "7",
         "labels": {}, "starts_at": 0, "annotations": {"summary": "GPU 7 is held back by the power brake "
         "(an external signal: the chassis power supply or the BMC) and runs at reduced clocks"}},
        {"state": "pending", "severity": "warning", "alertname": "GpuTemperatureNearSlowdown", "gpu": "12",
         "labels": {"link": "3"}, "starts_at": 0, "annotations": {"summary": "temperature within 5 °C of "
         "slowdown"}, "held_back": "a burn runs"},
    ],
    "receivers": [
        {"name": "alertmanager-primary", "queue_length": 12, "sender": "down",
         "sender_problem": "no delivery for 10 min", "last_error": "Alertmanager at http://alertmanager-1."
         "cluster.example.org:9093/api/v2/alerts: connection refused (3 tries, next in 8 s)"},
    ],
}  # fmt: skip


@pytest.fixture
def alerts_url() -> Iterator[str]:
    body = json.dumps(ALERTS).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_alerts_table_and_receiver_lines_in_80_columns(alerts_url: str) -> None:
    screen = in_terminal("alerts", "--url", alerts_url)
    assert_fits(screen)
    assert_whole(screen, "STATE SEVERITY ALERT GPU SINCE SUMMARY", ALERTS["host"])  # type: ignore[arg-type]
    for alert in ALERTS["alerts"]:
        assert_whole(screen, alert["alertname"], alert["annotations"]["summary"])  # type: ignore[index]
    assert_whole(screen, ALERTS["receivers"][0]["last_error"])  # type: ignore[index]


def test_alerts_that_cannot_reach_the_daemon_say_so_in_80_columns() -> None:
    screen = in_terminal("alerts", "--url", "http://127.0.0.1:1")
    assert_fits(screen)


# ---- lists -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [("scenarios",), ("assets", "list")])
def test_lists_in_80_columns(args: tuple[str, ...]) -> None:
    assert_fits(in_terminal(*args))


# ---- problem lists ----------------------------------------------------------------------------------------------
def test_check_config_problems_wrap_between_words_in_80_columns(tmp_path: Path) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text("health:\n  slurm:\n    enable: true\n  stragglers:\n    windows_seconds: 5\n")
    screen = in_terminal("check-config", config.name, cwd=tmp_path)  # a path of its own is longer than a line
    assert_fits(screen)
    assert_whole(screen, "unknown key 'enable'", "did you mean 'enabled'?", "prolog_timeout_seconds,")
