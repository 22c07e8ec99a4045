"""A one-shot ``gpumon health --local`` on a scenario, run again over the same state directory, counts the
scenario's scripted XIDs once, not again each run (issue 41, item 10: it escalated to "2, then 3 in 7 days")."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_cli


def test_the_same_scenario_played_three_times_counts_its_xid_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    verdicts = []
    for _ in range(3):
        done = run_cli("health", "--local", "--backend", "fake:gpu-lost", "--json", "-", "--state-dir", str(state))
        assert done.returncode == 2, done.stdout + done.stderr
        verdicts.append(json.loads(done.stdout))
    xid = [[f for f in v["findings"] if f["kind"] == "xid"] for v in verdicts]
    assert [[(f["gpu"], f["evidence"]["count"]) for f in found] for found in xid] == [[(1, 1)]] * 3
    assert all("escalated" not in f["evidence"] for found in xid for f in found)
