"""What ``make cluster`` prints runs as printed (issue 46, item 2): its srun line asks only for the
nodes that stay in service (the box drains some on purpose, and a job asking for a drained node
waits for ever), and says why the others are left out; ``make cluster-down`` leaves no log behind."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.fleet import box as fleet_box


def guide(scenarios: dict[str, str]) -> str:
    nodes = {
        name: SimpleNamespace(url=f"http://10.0.0.{i}:10480", netns=f"ns{i}", dir=Path(f"/tmp/{name}"))
        for i, name in enumerate(scenarios, start=1)
    }
    fleet = SimpleNamespace(nodes=nodes, run_id=1, base=Path("/tmp/base"), conf=Path("/tmp/slurm.conf"))
    return fleet_box.Box(fleet=fleet, scenarios=scenarios).guide()  # type: ignore[arg-type]


def test_the_srun_hint_names_only_the_nodes_in_service_and_says_why() -> None:
    text = guide({"n1": "healthy-job", "n2": "gpu-lost", "n3": "straggler"})
    [srun] = [line for line in text.splitlines() if line.strip().startswith("srun ")]
    match = re.search(r"srun -N(\d+) -w (\S+) ", srun)
    assert match is not None, srun
    assert match.group(1) == "2" and match.group(2).split(",") == ["n1", "n3"], srun
    assert "n2: drained on purpose" in text and "Required node not available" in text


def test_without_a_drained_node_the_srun_hint_takes_every_node() -> None:
    text = guide({"n1": "healthy", "n2": "straggler"})
    assert re.search(r"srun -N2 -w n1,n2 ", text) and "drained on purpose" not in text


def test_cluster_down_removes_the_keepers_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "gpumon-fleet-box.log"
    log.write_text("keeper output\n")
    monkeypatch.setattr(fleet_box, "STATE_FILE", tmp_path / "gpumon-fleet-box.json")
    monkeypatch.setattr(fleet_box, "KEEPER_LOG", log)
    assert fleet_box.down() == 0
    assert not log.exists()
