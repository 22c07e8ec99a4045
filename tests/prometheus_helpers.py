"""A real Prometheus server (the Debian ``prometheus`` binary) for integration tests.

Started on a free loopback port with a temporary TSDB; tests poll its HTTP API rather
than sleeping (Prometheus 2.42 hands new targets to the scrape loop ~5 s after start).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.helpers import free_port, wait_for

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (Debian package: prometheus)"
)


class PrometheusServer:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
        self.url = url
        self.proc = proc
        self.log_path = log_path

    def api(self, path: str, **params: Any) -> Any:
        response = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, **params: Any) -> list[Any]:
        return list(self.api("query", query=expr, **params)["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])

    def wait_target_health(self, job: str, health: str, timeout: float = 30.0) -> dict[str, Any]:
        def target() -> dict[str, Any] | None:
            for t in self.targets():
                if t["labels"].get("job") == job and t["health"] == health:
                    return t
            return None

        found: dict[str, Any] = wait_for(target, timeout, 0.2, f"target {job} {health}; log:\n{self.log()}")
        return found

    def wait_query(self, expr: str, timeout: float = 30.0) -> list[Any]:
        found: list[Any] = wait_for(lambda: self.query(expr), timeout, 0.2, f"data for {expr}")
        return found

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@contextmanager
def run_prometheus(
    tmp_path: Path, scrape_configs: list[dict[str, Any]], **global_config: Any
) -> Iterator[PrometheusServer]:
    """Prometheus scraping ``scrape_configs`` every second (unless global_config says otherwise)."""
    assert PROMETHEUS is not None
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s", **global_config},
        "scrape_configs": scrape_configs,
    }
    config_path = tmp_path / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = tmp_path / "prometheus.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = PrometheusServer(f"http://127.0.0.1:{port}", proc, log_path)
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {proc.returncode}:\n{server.log()}")
            return requests.get(f"{server.url}/-/ready", timeout=1).status_code == 200

        wait_for(ready, 30, 0.1, "prometheus /-/ready")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
