"""A real Prometheus server (the Debian ``prometheus`` binary) for integration tests.

Started on a free loopback port with a temporary TSDB; tests poll its HTTP API rather
than sleeping (Prometheus 2.42 hands new targets to the scrape loop ~5 s after start).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.helpers import ServerProcess, free_port, run_server, wait_for

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (Debian package: prometheus)"
)


class PrometheusServer(ServerProcess):
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
    argv = [
        PROMETHEUS,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with run_server("prometheus", argv, port, tmp_path / "prometheus.log") as server:
        yield PrometheusServer(server.url, server.proc, server.log_path)


class SharedPrometheus(PrometheusServer):
    """One Prometheus for a whole session (tests/conftest.py ``shared_prometheus``), scraping every
    second whatever targets the tests add: each ``scrape`` call writes a file_sd file (one per job)."""

    targets_dir: Path

    def scrape(self, job: str, instance: str) -> None:
        """Scrape ``instance`` (host:port, plain HTTP) under ``job`` from now on; returns at once
        (Prometheus hands new targets to its scrape loop within about 5 s: wait for the target)."""
        path = self.targets_dir / f"{job}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [instance], "labels": {"job": job}}]))
        tmp.rename(path)

    def wait_instance_up(self, job: str, instance: str, timeout: float = 30.0) -> None:
        def up() -> bool:
            return any(
                t["labels"].get("job") == job and t["labels"].get("instance") == instance and t["health"] == "up"
                for t in self.targets()
            )

        wait_for(up, timeout, 0.2, f"target {job} {instance} up; log:\n{self.log()}")


@contextmanager
def run_shared_prometheus(tmp_path: Path) -> Iterator[SharedPrometheus]:
    """Prometheus scraping every second the targets of the ``*.json`` files in ``tmp_path/targets``."""
    targets_dir = tmp_path / "targets"
    targets_dir.mkdir()
    scrape = [
        {"job_name": "shared", "file_sd_configs": [{"files": [f"{targets_dir}/*.json"], "refresh_interval": "1s"}]}
    ]
    with run_prometheus(tmp_path, scrape) as server:
        shared = SharedPrometheus(server.url, server.proc, server.log_path)
        shared.targets_dir = targets_dir
        yield shared
