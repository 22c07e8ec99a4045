"""Shared test helpers: free ports, a gpumon daemon in a subprocess, polling waits.

Import from tests.helpers; the ``start_daemon`` fixture is exported by tests/conftest.py."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from gpumon.exposition import gzip_parts
from gpumon.exposition.dcgm_table import dcgm_fields
from gpumon.exposition.openmetrics import render as render_openmetrics
from gpumon.exposition.text import Family
from gpumon.model.snapshot import GpuSnapshot

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


FULL_EXAMPLES_FACTOR = 10
"""HYPOTHESIS_PROFILE=full draws this many times the examples of a plain run (see tests/conftest.py)."""


def examples(full: int) -> int:
    """How many examples a property test draws: ``full`` under HYPOTHESIS_PROFILE=full, a tenth of it
    (at least 10, at most ``full``) otherwise."""
    if os.environ.get("HYPOTHESIS_PROFILE") == "full":
        return full
    return min(full, max(10, full // FULL_EXAMPLES_FACTOR))


TEST_PORTS = range(15000, 32000)
"""Where tests take ports: below Linux's ephemeral range (32768-60999), from which the kernel hands out
the local ports of every outgoing connection. A port the kernel chose free (bind to 0) could be taken by
another test's connection before the server under test binds it, which the parallel suite saw happen."""


def _free_in_test_ports(family: socket.AddressFamily, host: str) -> int:
    for _ in range(200):
        port = random.randrange(TEST_PORTS.start, TEST_PORTS.stop)
        with socket.socket(family) as s:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port in {TEST_PORTS.start}-{TEST_PORTS.stop - 1} after 200 tries")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` (an IPv4 address), from TEST_PORTS."""
    return _free_in_test_ports(socket.AF_INET, host)


def free_port_ipv6() -> int:
    """A port free on every IPv6 and IPv4 address, as ``--listen [::]:PORT`` (dual-stack) needs it: a port
    ``free_port`` finds free on 127.0.0.1 may be in use on an IPv6 address (CI once failed on that)."""
    return _free_in_test_ports(socket.AF_INET6, "::")


def wait_for(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
        except Exception as exc:
            last_exc = exc
            value = None
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f": {last_exc!r}" if last_exc else ""))


class DaemonProcess:
    """``gpumon run`` in a subprocess on a free loopback port."""

    def __init__(self, args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / f"gpumon-{self.port}.log"
        self.state_dir = tmp_path / "state"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
        full_env.update(env or {})
        full_env["PYTHONUNBUFFERED"] = "1"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpumon",
                "run",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--state-dir",
                str(self.state_dir),
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=str(REPO),
        )

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return requests.get(self.url + path, timeout=kwargs.pop("timeout", 5), **kwargs)

    def wait_ready(self, timeout: float = 15.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"gpumon exited with {self.proc.returncode}:\n{self.log()}")
            return self.get("/ready", timeout=1).status_code == 200

        wait_for(ready, timeout, what=f"gpumon /ready on {self.url}")

    def metrics(self) -> str:
        return self.get("/metrics").text

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    started: list[DaemonProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, wait: bool = True) -> DaemonProcess:
        daemon = DaemonProcess(list(args), tmp_path, env)
        started.append(daemon)
        if wait:
            daemon.wait_ready()
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m gpumon ARGS`` with a clean GPUMON_* environment."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=str(REPO),
    )


class ServerProcess:
    """A server binary (Prometheus, Alertmanager) started by a test on loopback."""

    def __init__(
        self, url: str, proc: subprocess.Popen[bytes], log_path: Path, client: dict[str, Any] | None = None
    ) -> None:
        self.url = url
        self.proc = proc
        self.log_path = log_path
        self.client: dict[str, Any] = client or {}
        """requests keyword arguments for talking to it (verify, auth) when it serves TLS or auth."""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def run_server(
    name: str, argv: list[str], port: int, log_path: Path, client: dict[str, Any] | None = None
) -> Iterator[ServerProcess]:
    """Start ``argv``, wait until ``/-/ready`` answers 200 on ``port``, stop it afterwards.

    ``client``: requests keyword arguments (``verify``, ``auth``) for a server on TLS, which is
    then reached over https."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    scheme = "https" if client and "verify" in client else "http"
    server = ServerProcess(f"{scheme}://127.0.0.1:{port}", proc, log_path, client)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{server.log()}")
            return requests.get(f"{server.url}/-/ready", timeout=1, **server.client).status_code == 200

        wait_for(ready, 30, 0.1, f"{name} /-/ready")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def value(text: str, name: str, **labels: str) -> float | None:
    """The sample ``name`` with these labels in a Prometheus text exposition, or None."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def dcgm_values(gpu: GpuSnapshot) -> dict[str, float]:
    """Every DCGM_FI_* value ``--compat dcgm`` serves for ``gpu``, by name (left out where None)."""
    values = {f.name: f.value(gpu) for f in dcgm_fields()}
    return {name: v for name, v in values.items() if v is not None}


@dataclass(frozen=True)
class RenderedBytes:
    """An Exposition made by a function that renders Prometheus text 0.0.4, and for OpenMetrics
    the same metrics as families (``collect``; None: the classic text only); gzip at level 1.
    For test servers of plain bytes; the daemon serves its GpumonCollector."""

    render: Callable[[], bytes]
    collect: Callable[[], Iterable[Family]] | None = None

    @property
    def serves_openmetrics(self) -> bool:
        return self.collect is not None

    def body(self, *, openmetrics: bool = False, gzip: bool = False) -> list[bytes]:
        data = render_openmetrics(self.collect()) if openmetrics and self.collect is not None else self.render()
        return gzip_parts.member([gzip_parts.deflate(data)]) if gzip else [data]

    def ready_body(self, *, openmetrics: bool = False, gzip: bool = False) -> None:
        return None
