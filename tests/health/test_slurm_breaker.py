"""The circuit breaker's limits (docs/health.md, "The circuit breaker"): a share and an absolute cap
(the lower wins); never zero nodes left drained when the node that gave way reads NOT_RESPONDING for
a moment; a resume is never held back by a tripped breaker; a refused drain is judged again from the
verdict of the next check, never replayed; a bring-up counts only drains.

The cluster-wide round with a real controller is tests/health/test_slurm_breaker_fleet.py."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpumon.health.config import SlurmConfig, parse_slurm
from gpumon.health.slurm import OwnDrain, allowed_unusable, decide, keeps_drain
from gpumon.health.slurm_nodes import NodeState
from tests.health.test_slurm_unit import FAULT, OK, REASON, FakeSlurm, _act, _critical


def _node(name: str, state: str = "IDLE", reason: str = "", at: float | None = None) -> NodeState:
    return NodeState(name, state, reason, ("gpu",), at)


def test_the_lower_of_share_and_absolute_cap_wins() -> None:
    assert allowed_unusable(100, SlurmConfig(max_drained_share=0.25)) == 25
    assert allowed_unusable(100, SlurmConfig(max_drained_share=0.25, max_drained_nodes=2)) == 2
    assert allowed_unusable(4, SlurmConfig(max_drained_share=0.25, max_drained_nodes=10)) == 1
    config = SlurmConfig(max_drained_share=0.25, max_drained_nodes=2)
    me = _node("n0")
    peers = [_node(f"n{i}") for i in range(1, 100)]
    assert decide(FAULT, me, [me, *peers], config).step == "drain"
    two_drained = [_node("n1", "IDLE+DRAIN", "ops", 5), _node("n2", "DOWN"), *peers[2:]]
    refused = decide(FAULT, me, [me, *two_drained], config)
    assert refused.step == "refused"
    assert "max_drained_nodes 2" in refused.message and "2 of 100" in refused.message


def test_the_cap_is_a_positive_whole_number_and_bring_up_a_boolean() -> None:
    config, problems = parse_slurm({"max_drained_nodes": 3, "bring_up": True})
    assert (config.max_drained_nodes, config.bring_up, problems) == (3, True, [])
    for bad in ({"max_drained_nodes": 0}, {"max_drained_nodes": 2.5}, {"max_drained_nodes": "3"}, {"bring_up": "y"}):
        _, problems = parse_slurm(bad)
        assert len(problems) == 1 and next(iter(bad)) in problems[0], (bad, problems)


def test_a_node_that_just_gave_way_and_reads_not_responding_does_not_take_the_kept_drains_place() -> None:
    """Issue 41 item 4: after ``undrain`` Slurm shows the node NOT_RESPONDING for about a second. The node
    that ranks first by drain time keeps its drain; one that only reads NOT_RESPONDING is not ranked."""
    config = SlurmConfig(max_drained_share=0.34)  # 1 of 3
    after = [_node("g1", "IDLE+DRAIN", REASON, 100), _node("g2", "IDLE+NOT_RESPONDING"), _node("g3", "IDLE")]
    keep, why = keeps_drain(after[0], after, config)
    assert keep, why
    still_draining = [after[0], after[1], _node("g3", "IDLE+DRAIN", REASON, 100)]
    assert [keeps_drain(n, still_draining, config)[0] for n in (still_draining[0], still_draining[2])] == [True, False]
    # DOWN (Slurm gave up on it) still ranks first: it cannot give way
    down = [after[0], _node("g2", "DOWN+NOT_RESPONDING", "Not responding", 5), after[2]]
    assert keeps_drain(down[0], down, config)[0] is False


class SlowSlurm(FakeSlurm):
    """A controller that answers each call after a random 0-``most_seconds`` and, like Slurm, shows a node
    NOT_RESPONDING for ``not_responding_seconds`` after it undrains it."""

    def __init__(self, *args: Any, most_seconds: float, not_responding_seconds: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.most_seconds = most_seconds
        self.not_responding_seconds = not_responding_seconds
        self.undrained_at: dict[str, float] = {}
        self.rng = random.Random(41)
        self.delays: list[float] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        with self.lock:
            delay = self.rng.uniform(0, self.most_seconds)
            self.delays.append(delay)
        time.sleep(delay)
        with self.lock:
            now = time.time()
            for name, at in self.undrained_at.items():
                flags = [f for f in self.nodes[name]["flags"] if f != "NOT_RESPONDING"]
                self.nodes[name]["flags"] = flags + (
                    ["NOT_RESPONDING"] if now - at < self.not_responding_seconds else []
                )
        done = super().__call__(cmd, **kwargs)
        if cmd[1] == "update" and "state=undrain" in cmd:
            with self.lock:
                self.undrained_at[cmd[2].split("=", 1)[1]] = time.time()
        return done


@pytest.mark.slow
def test_with_random_controller_latency_exactly_the_allowed_node_stays_drained_every_round(tmp_path: Path) -> None:
    """Three CRITICAL nodes checked at the same instant, every call delayed 0-1 s, share 0.34: one drained."""
    outcomes = []
    for trial in range(4):
        fake = SlowSlurm.of("g1", "g2", "g3", clock=time.time, most_seconds=1.0, not_responding_seconds=1.0)
        fake.rng.seed(trial)
        here = tmp_path / str(trial)
        threads = [
            threading.Thread(target=_act, args=(FAULT, fake, here / n), kwargs={"node": n, "max_drained_share": 0.34})
            for n in ("g1", "g2", "g3")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        outcomes.append(sorted(fake.drained()))
    assert [len(o) for o in outcomes] == [1, 1, 1, 1], outcomes


def test_a_tripped_breaker_never_holds_back_a_resume(tmp_path: Path) -> None:
    """gpumon's own drain, every other node down (tripped): once the verdict is OK (repaired, or cleared
    with ``gpumon health clear``) the node is resumed all the same."""
    fake = FakeSlurm.of("g1", "g2", "g3", "g4")
    assert _act(FAULT, fake, tmp_path, max_drained_share=0.25).step == "drain"
    for name in ("g2", "g3", "g4"):
        fake.set(name, state="DOWN", reason="power", time=5)
    assert _act(FAULT, fake, tmp_path, max_drained_share=0.25).step == "none"  # still bad: stays drained
    resumed = _act(OK, fake, tmp_path, max_drained_share=0.25)
    assert resumed.step == "resume" and fake.drained() == set()
    ours = _node("g1", "IDLE+DRAIN", REASON, 7)
    tripped = [ours, *(_node(f"g{i}", "DOWN") for i in range(2, 9))]
    assert decide(OK, ours, tripped, SlurmConfig(max_drained_nodes=1), OwnDrain("g1", REASON, 7)).step == "resume"


def test_a_refused_drain_is_judged_again_from_the_next_verdict_never_replayed(tmp_path: Path) -> None:
    fake = FakeSlurm.of("g1", "g2")
    fake.admin_drain("g2", "memtest")
    assert _act(FAULT, fake, tmp_path, max_drained_share=0.5).step == "refused"
    fake.set("g2", flags=[], reason="", time=0)  # room again
    # the GPU recovered meanwhile: nothing is drained for the fault that was refused
    assert _act(OK, fake, tmp_path, max_drained_share=0.5).step == "none"
    assert fake.drained() == set()
    # a new fault: drained with the reason of now, not the refused one
    ecc = _critical((0, "xid 48 double bit ECC error", "reset_gpu"))
    assert _act(ecc, fake, tmp_path, max_drained_share=0.5).step == "drain"
    assert fake.drained() == {"g1"} and "GPU 0 xid 48" in fake.nodes["g1"]["reason"]
    assert "xid 79" not in fake.nodes["g1"]["reason"]


def test_during_a_bring_up_only_drains_count_against_the_breaker(tmp_path: Path) -> None:
    """Ten nodes joining at once: six still DOWN / NOT_RESPONDING / FUTURE while their slurmd registers.
    Without ``bring_up`` the breaker counts them (6 of 10 > 30 %) and a node with a dead GPU is not
    drained; with it the joining nodes do not count, and drains stay bounded by the share."""
    names = [f"g{i}" for i in range(1, 11)]
    joining = {"g5": "DOWN", "g6": "DOWN", "g7": "IDLE+NOT_RESPONDING", "g8": "FUTURE", "g9": "DOWN", "g10": "DOWN"}

    def cluster() -> FakeSlurm:
        fake = FakeSlurm.of(*names)
        for name, state in joining.items():
            fake.set(name, state=state.split("+")[0], flags=state.split("+")[1:])
        return fake

    fake = cluster()
    assert _act(FAULT, fake, tmp_path / "a", max_drained_share=0.3).step == "refused"
    fake = cluster()
    assert _act(FAULT, fake, tmp_path / "b", max_drained_share=0.3, bring_up=True).step == "drain"
    assert fake.drained() == {"g1"}
    fake.admin_drain("g2", "ops")
    fake.admin_drain("g3", "ops")
    refused = _act(FAULT, fake, tmp_path / "c", node="g4", max_drained_share=0.3, bring_up=True)
    assert refused.step == "refused" and fake.drained() == {"g1", "g2", "g3"}
