"""A simulated burn keeps its results apart from the node's, whatever --state-dir says (issue 41, item 2):
``gpumon burn --device cpu --backend fake:gpu-lost --state-dir <the node's>`` wrote the node's real burn
verdict (CRITICAL "GPU 1 failed gpumon burn", a drain), and a passing one resumed it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumon.burn.command import burn_state_dir
from gpumon.health.config import HealthConfig
from gpumon.health.service import HealthService
from gpumon.model.xid_catalog import XidCatalog
from gpumon.util.state.files import health_dir
from tests.helpers import run_cli


def _burn_failed(state: Path, simulated: str | None = None) -> list[int | None]:
    service = HealthService(
        state, XidCatalog.load(None), HealthConfig(sysfs_root=state / "nosys"), simulated=simulated or False
    )
    return [f.gpu for f in service.report().findings if f.kind == "burn_failed"]


LOST_AT_ONCE = 'count: 2\ngpus:\n  - {}\n  - lost_at_tick: 1\n    lost_reason: "fallen off the bus (simulated)"\n'
"""GPU 1 is lost at the burn's second telemetry read, however short the burn (fake:gpu-lost loses it later)."""


def test_a_simulated_burn_that_fails_leaves_the_nodes_verdict_untouched(tmp_path: Path) -> None:
    state = tmp_path / "state"
    scenario = tmp_path / "lost.yaml"
    scenario.write_text(LOST_AT_ONCE)
    backend = f"fake:{scenario}"
    node_burn = {"exit_code": 0, "finished_at": 1.0, "gpus": []}  # the node's own last burn passed
    (state / "burn").mkdir(parents=True)
    (state / "burn" / "last.json").write_text(json.dumps(node_burn))

    done = run_cli("burn", "--quick", "--device", "cpu", "--backend", backend, "--state-dir", str(state), timeout=180)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]  # GPU 1 is lost: the burn fails

    assert json.loads((state / "burn" / "last.json").read_text()) == node_burn
    assert _burn_failed(state) == []  # the node's verdict (a real backend's) knows nothing of the demo
    assert _burn_failed(state, backend) == [1]  # the simulated node's verdict has it
    assert (health_dir(state, backend).parent / "burn" / "last.json").exists()


@pytest.mark.parametrize(
    ("backend", "device", "apart"),
    [
        ("fake", "cpu", True),
        ("fake:xid-storm", "cuda", True),
        ("nvml", "cpu", True),  # real telemetry, a CPU load: not a burn of the node's GPUs
        ("nvml", "cuda", False),
    ],
)
def test_only_a_burn_of_the_nodes_gpus_writes_the_nodes_burn_results(backend: str, device: str, apart: bool) -> None:
    where = Path(burn_state_dir("/var/lib/gpumon", backend, device))
    assert (where != Path("/var/lib/gpumon")) == apart
    assert where.is_relative_to("/var/lib/gpumon")
