"""Fixtures for the health tests: a real Slurm cluster on loopback, fake GPU scenarios."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.health import slurm_cluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_cluster.SlurmCluster]:
    """slurmctld + slurmd (node g1) + munge, started once; each test gets g1 undrained."""
    reason = slurm_cluster.missing_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        slurm_cluster.stop(cluster)


@pytest.fixture()
def cluster(slurm: slurm_cluster.SlurmCluster) -> Iterator[slurm_cluster.SlurmCluster]:
    slurm.reset()
    yield slurm
    slurm.reset()


XID79_ON_GPU1 = """
count: 2
gpus:
  - {}
  - xid_events: [{tick: 0, xid: 79}]
"""


@pytest.fixture()
def xid79_scenario(tmp_path: Path) -> Path:
    """Two simulated GPUs; GPU 1 reports XID 79 (fallen off the bus) at the first poll."""
    path = tmp_path / "xid79.yaml"
    path.write_text(XID79_ON_GPU1)
    return path
