"""Verdicts nothing can fool, on the project's three-node Slurm cluster (tests/health/slurm_nodes.py; Slurm
runs ``gpumon health --slurm`` as HealthCheckProgram every 5 s on every node, each asking its own daemon):
a GPU whose reads hang under a running daemon drains its node within the bound docs/health.md states."""

from __future__ import annotations

import time

import pytest
import requests

from tests.health import slurm_nodes
from tests.health.slurm_nodes import Fleet
from tests.helpers import wait_for

fleet = pytest.fixture(scope="module")(slurm_nodes.fleet_fixture)

HUNG_GPU1 = """
count: 2
gpus:
  - {}
  - hang_at_tick: 12
"""
INTERVAL_SECONDS = 1.0
"""The daemons' poll interval (gpumon's default); stale_after_seconds is 5 × that."""


@pytest.fixture()
def cluster(fleet: Fleet) -> Fleet:
    fleet.reset()
    return fleet


def test_a_gpu_whose_reads_hang_under_a_running_daemon_drains_its_node_within_the_bound(cluster: Fleet) -> None:
    """GPU 1 of n1 stops answering at its 13th poll while Slurm's health check runs every 5 s. The
    bound (docs/health.md): stale_after_seconds (5 s) + one interval (1 s) + HealthCheckInterval (5 s)
    + the check's own run. The time from the hang to the drain is printed (pytest -s)."""
    cluster.prepare({"n1": cluster.scenario_file("hung", HUNG_GPU1)}, max_drained_share=0.5)
    n1 = cluster.nodes["n1"]
    cluster.enable("health")
    try:
        wait_for(lambda: requests.get(f"{n1.url}/ready", timeout=5).status_code == 503, 60, 0.1, "n1 to hang")
        last = requests.get(f"{n1.url}/api/snapshot", timeout=5).json()["timestamp_seconds"]
        hung_at = last + INTERVAL_SECONDS  # the next poll, the one that does not return, starts then
        wait_for(lambda: "n1" in cluster.drained(), 60, 0.1, "Slurm to drain n1")
        drained_at = time.time()
    finally:
        cluster.disable("health")
        wait_for(cluster.idle, 60, 0.1, "the running hooks to finish")
    info = cluster.node_info()
    assert cluster.drained() == {"n1"}, {n: i["reason"] for n, i in info.items()}
    assert info["n1"]["reason"].startswith("gpumon: GPU 1 does not answer"), info["n1"]["reason"]
    bound = 5 * INTERVAL_SECONDS + INTERVAL_SECONDS + slurm_nodes.HEALTH_INTERVAL_SECONDS
    print(f"\nhang to drain: {drained_at - hung_at:.1f} s (bound {bound:g} s + the check's own run)")
