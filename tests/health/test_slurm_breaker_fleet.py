"""The circuit breaker on the real three-node Slurm cluster (tests/health/slurm_nodes.py) with a
controller whose every answer comes after a random 0-1 s: every node CRITICAL at once, checks
started by Slurm at the same instant, ``max_drained_share`` 0.34 (1 of 3 may be drained). In every
round exactly one node stays drained: never zero (a node that gave way is NOT_RESPONDING for a
moment after its undrain and must not take the kept drain's place), never two.

``FLEET_BREAKER_ROUNDS`` sets the rounds (the suite runs a few; issue 41 asked for 100 of 100,
measured with ``FLEET_BREAKER_ROUNDS=100 pytest -s`` on this file, which prints the figures).
"""

from __future__ import annotations

import os
import statistics

import pytest

from tests.health import slurm_nodes
from tests.health.slurm_nodes import Fleet
from tests.helpers import wait_for

fleet = pytest.fixture(scope="module")(slurm_nodes.fleet_fixture)

XID79_GPU1 = """
count: 2
gpus:
  - {}
  - xid_events: [{tick: 0, xid: 79}]
"""
ROUNDS = int(os.environ.get("FLEET_BREAKER_ROUNDS", "4"))  # not GPUMON_*: gpumon reads those as its config


@pytest.mark.slow
@pytest.mark.timeout(60 + 40 * ROUNDS)
def test_with_random_controller_latency_every_round_leaves_exactly_the_allowed_node_drained(fleet: Fleet) -> None:
    fleet.reset()
    xid = fleet.scenario_file("xid79", XID79_GPU1)
    fleet.prepare(dict.fromkeys(fleet.nodes, xid), max_drained_share=0.34)
    for name in fleet.nodes:
        wait_for(lambda n=name: fleet.verdict(n)["status"] == "CRITICAL", 30, 0.2, f"{name}'s daemon to say CRITICAL")
    outcomes: list[list[str]] = []
    delays: list[float] = []
    for number in range(ROUNDS):
        _reset(fleet)
        (fleet.base / "bin" / "delays").unlink(missing_ok=True)
        fleet.set_delay(0.0, 1.0)
        fleet.round()
        fleet.set_delay(0)  # read the outcome without waiting
        outcomes.append(sorted(fleet.drained()))
        delays += fleet.delays()
        print(f"round {number + 1}: drained {outcomes[-1]}", flush=True)
    counts = [len(o) for o in outcomes]
    print(
        f"\nbreaker: {ROUNDS} rounds, {len(delays)} Slurm calls delayed "
        f"{min(delays, default=0):.3f}-{max(delays, default=0):.3f} s (mean {statistics.fmean(delays or [0]):.3f}); "
        f"drained per round: {dict((c, counts.count(c)) for c in sorted(set(counts)))}"
    )
    assert counts == [1] * ROUNDS, f"drained per round: {outcomes}"
    assert max(delays) - min(delays) > 0.3  # the latency really varied


def _reset(fleet: Fleet) -> None:
    """Every node in service before a round; on a loaded machine a slurmd may take longer than the
    harness's 30 s to answer the controller again after the last round (that is no round of the breaker)."""
    for attempt in range(3):
        try:
            fleet.reset()
            return
        except AssertionError:
            if attempt == 2:
                raise
            print(f"reset: nodes not back in service yet ({fleet.unusable()}); again", flush=True)
