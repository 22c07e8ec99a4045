"""End to end: ``gpumon run`` on a fake scenario whose temperature crosses a rule's threshold, and a
real Alertmanager that receives the alert; the daemon shows it in /api/alerts and /metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpumon.backends.fake import FakeBackend
from tests.alerts.helpers import needs_alertmanager, run_alertmanager, wait_for
from tests.helpers import DaemonProcess

pytestmark = [needs_alertmanager, pytest.mark.integration]


def test_gpumon_run_sends_a_threshold_alert_to_a_real_alertmanager(
    tmp_path: Path, start_daemon: Callable[..., DaemonProcess]
) -> None:
    scenario = tmp_path / "hot.yaml"
    scenario.write_text(yaml.safe_dump({"gpus": [{"values": {"temperature_celsius": [60, 60, 60, 95]}}, {}]}))
    with run_alertmanager(tmp_path) as am:
        config = tmp_path / "gpumon.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "interval_seconds": 0.5,
                    "alerting": {
                        "builtin_rules": False,
                        "host": "e2e-node",
                        "rules": [
                            {
                                "name": "GpuHot",
                                "field": "temperature_celsius",
                                "op": ">",
                                "threshold": 85,
                                "severity": "critical",
                                "annotations": {"summary": "GPU {{ gpu }} at {{ value }} °C"},
                            }
                        ],
                        "alertmanagers": [am.url],
                        "retry": {"initial_backoff": "100ms", "max_backoff": "1s"},
                    },
                }
            )
        )
        daemon = start_daemon("--backend", f"fake:{scenario}", "--config", str(config))
        [alert] = wait_for(am.alerts, 20, what=f"the alert in Alertmanager; daemon log:\n{daemon.log()}")
        uuid0 = FakeBackend.from_mapping({"count": 1}).uuid(0)
        assert alert["labels"] == {
            "alertname": "GpuHot",
            "severity": "critical",
            "gpu": "0",
            "uuid": uuid0,
            "host": "e2e-node",
        }
        assert alert["annotations"]["summary"] == "GPU 0 at 95 °C"

        data: dict[str, Any] = daemon.get("/api/alerts").json()
        assert [(a["alertname"], a["state"], a["gpu"]) for a in data["alerts"]] == [("GpuHot", "firing", "0")]
        metrics = daemon.metrics()
        assert (
            f'gpumon_alerts{{alertname="GpuHot",gpu="0",severity="critical",state="firing",uuid="{uuid0}"}} 1'
            in metrics
        )
        assert "gpumon_alert_queue_length" in metrics
        assert daemon.stop() == 0
        spool = yaml.safe_load((daemon.state_dir / "alerts" / "spool.json").read_text())
        assert len(spool["delivered"]) == 1, "the firing alert is remembered for the next start"
