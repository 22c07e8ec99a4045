"""gpumon under systemd: the sd_notify protocol (exact datagrams on the socket in NOTIFY_SOCKET)
and the shipped unit (systemd-analyze verify and security)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.systemd_notify import SystemdNotifier


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket playing systemd's role (short path: AF_UNIX paths stop at 108 bytes)."""
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="sdn") as tmp:
        path = str(Path(tmp) / "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(5)
        try:
            yield sock, path
        finally:
            sock.close()


def received(sock: socket.socket) -> str:
    return sock.recv(4096).decode()


def test_ready_sends_ready_and_status(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("serving 2 GPUs on :10480")
    assert received(sock) == "READY=1\nSTATUS=serving 2 GPUs on :10480"


def test_each_message_is_one_exact_datagram(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path}, monotonic_usec=lambda: 123456789)
    notifier.watchdog()
    notifier.status("polling\n2 GPUs")
    notifier.reloading()
    notifier.ready()
    notifier.stopping("SIGTERM")
    assert [received(sock) for _ in range(5)] == [
        "WATCHDOG=1",
        "STATUS=polling 2 GPUs",
        "RELOADING=1\nMONOTONIC_USEC=123456789",
        "READY=1",
        "STOPPING=1\nSTATUS=SIGTERM",
    ]


def test_reloading_carries_the_real_monotonic_clock(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    before = time_usec()
    SystemdNotifier({"NOTIFY_SOCKET": path}).reloading("re-reading /etc/gpumon/gpumon.yaml")
    after = time_usec()
    lines = received(sock).split("\n")
    assert lines[0] == "RELOADING=1"
    assert before <= int(lines[1].removeprefix("MONOTONIC_USEC=")) <= after
    assert lines[2] == "STATUS=re-reading /etc/gpumon/gpumon.yaml"


def time_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def test_abstract_socket_address_starting_with_at() -> None:
    name = f"gpumon-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(5)
        notifier = SystemdNotifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.address() == b"\0" + name.encode()
        assert notifier.ready()
        assert received(sock) == "READY=1"


def test_without_notify_socket_every_call_is_a_no_op() -> None:
    notifier = SystemdNotifier({})
    assert not notifier.enabled
    assert notifier.ready() is False
    assert notifier.watchdog() is False
    assert notifier.stopping() is False
    assert notifier.watchdog_interval_seconds() is None


def test_a_vanished_socket_does_not_raise(tmp_path: Path) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert notifier.ready() is False


@pytest.mark.parametrize(
    ("env", "interval", "period"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 30.0, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None, None),
        ({"WATCHDOG_USEC": "0"}, None, None),
        ({"WATCHDOG_USEC": "soon"}, None, None),
        ({}, None, None),
    ],
)
def test_watchdog_interval_from_environment(env: dict[str, str], interval: float | None, period: float | None) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": "/run/systemd/notify", **env})
    assert notifier.watchdog_interval_seconds() == interval
    assert notifier.watchdog_ping_period_seconds() == period


def test_defaults_to_process_environment(
    notify_socket: tuple[socket.socket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    notifier = SystemdNotifier()
    assert notifier.watchdog_interval_seconds() == 10.0
    assert notifier.watchdog()
    assert received(sock) == "WATCHDOG=1"


# --- the unit file -------------------------------------------------------------------------------

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "gpumon.service"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze not installed (Debian package: systemd)"
)


def unit_settings() -> dict[str, list[str]]:
    """Key -> values of every assignment in the unit (all sections; keys are unique across them here)."""
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if line.startswith(("#", "[")) or "=" not in line:
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


INSTALL_DOCS = (UNIT.parent.parent / "docs" / "install.md", UNIT.parent.parent / "README.md")
GUIDE_VENV = "/opt/gpumon"
"""The virtual environment the install guide creates (``python3 -m venv /opt/gpumon``)."""


@pytest.fixture
def unit_with_stub_binary(tmp_path: Path) -> Path:
    """The unit as shipped, on a host that followed the install guide: /opt/gpumon/bin/gpumon exists.

    systemd-analyze verify wants the binary to exist, and this machine has no /opt/gpumon: the
    guide's venv is played by a stub at the same place under tmp_path. Nothing else changes.
    """
    stub = tmp_path / GUIDE_VENV.lstrip("/") / "bin" / "gpumon"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    unit = tmp_path / "gpumon.service"
    shipped = UNIT.read_text()
    unit.write_text(shipped.replace(f"ExecStart={GUIDE_VENV}/bin/gpumon ", f"ExecStart={stub} "))
    assert unit.read_text().count(str(stub)) == 1, "the unit must start the guide's /opt/gpumon/bin/gpumon"
    return unit


def test_execstart_is_the_binary_the_install_guide_creates() -> None:
    """The shipped unit starts what the documented steps install: no drop-in needed to make it run."""
    [exec_start] = unit_settings()["ExecStart"]
    binary = exec_start.split()[0]
    for doc in INSTALL_DOCS:
        text = doc.read_text()
        venvs = set(re.findall(r"python3 -m venv (/\S+)", text))
        assert venvs == {GUIDE_VENV}, f"{doc.name} creates {venvs}"
        assert f"{GUIDE_VENV}/bin/pip install" in text, doc.name
    assert binary == f"{GUIDE_VENV}/bin/gpumon"


def test_unit_is_notify_with_watchdog_reload_and_config_from_etc() -> None:
    s = unit_settings()
    assert s["Type"] == ["notify"]
    assert s["NotifyAccess"] == ["main"]
    assert s["WatchdogSec"] == ["30s"]
    assert s["ExecStart"] == ["/opt/gpumon/bin/gpumon run --config /etc/gpumon/gpumon.yaml"]
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["ConfigurationDirectory"] == ["gpumon"]
    assert s["StateDirectory"] == ["gpumon"]


def test_unit_runs_unprivileged_and_sees_only_the_gpus() -> None:
    s = unit_settings()
    assert s["DynamicUser"] == ["yes"]
    assert s["CapabilityBoundingSet"] == [""]
    assert s["DevicePolicy"] == ["closed"]
    assert s["DeviceAllow"] == ["char-nvidia* rw"]
    assert "PrivateDevices" not in s, "PrivateDevices=yes hides /dev/nvidia*"
    assert "ProcSubset" not in s, "NVML reads /proc/driver/nvidia"


@needs_systemd_analyze
def test_systemd_analyze_verify_is_clean(unit_with_stub_binary: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(unit_with_stub_binary)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@needs_systemd_analyze
def test_security_exposure_is_at_most_2_5(unit_with_stub_binary: Path) -> None:
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--no-pager", str(unit_with_stub_binary)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 2.5, result.stdout


# --- MemoryDenyWriteExecute=yes: gpumon must not need writable+executable memory ----------------

PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
_UNDER_MDWE = f"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl({PR_SET_MDWE}, {PR_MDWE_REFUSE_EXEC_GAIN}, 0, 0, 0) != 0:
    sys.exit(77)  # kernel without PR_SET_MDWE (Linux < 6.3)
from gpumon.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_under_mdwe(*args: str) -> subprocess.CompletedProcess[str]:
    """gpumon with the kernel's W^X policy (what MemoryDenyWriteExecute=yes enforces through seccomp)."""
    result = subprocess.run([sys.executable, "-c", _UNDER_MDWE, *args], capture_output=True, text=True, timeout=120)
    if result.returncode == 77:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux >= 6.3 needed)")
    return result


def test_gpumon_runs_under_memory_deny_write_execute() -> None:
    result = run_under_mdwe("once", "--backend", "fake", "--fake-gpus", "2", "--json")
    assert result.returncode == 0, result.stderr
    assert '"nvml_up": true' in result.stdout


@pytest.mark.gpu
def test_nvml_works_under_memory_deny_write_execute() -> None:
    """On a GPU host: loading libnvidia-ml through ctypes needs no W+X memory."""
    result = run_under_mdwe("once", "--backend", "nvml", "--json")
    assert result.returncode == 0, result.stderr
    assert '"nvml_up": true' in result.stdout
