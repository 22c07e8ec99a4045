"""The prolog's budget is the budget, however slow the controller, and an UNKNOWN Slurm step never exits 1
(issue 41, item 5); a controller that does not answer sinfo is said as such (item 10)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.health.config import SlurmConfig
from gpumon.health.slurm import act
from gpumon.health.slurm_commands import Scontrol
from gpumon.health.slurm_hooks import act_within
from tests.health.test_slurm_unit import FakeClock, FakeSlurm, _critical
from tests.helpers import run_cli

REPORT = _critical((1, "xid 79 fallen off the bus", "reboot_node"))


class SlowController:
    """FakeSlurm whose every call takes ``seconds`` on the fake clock; past its timeout it is cut off there."""

    def __init__(self, fake: FakeSlurm, seconds: float) -> None:
        self.fake, self.seconds = fake, seconds
        self.timeouts: list[float] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        timeout = float(kwargs["timeout"])
        self.timeouts.append(timeout)
        if self.seconds > timeout:
            self.fake.clock.sleep(timeout)
            raise subprocess.TimeoutExpired(cmd, timeout)
        self.fake.clock.sleep(self.seconds)
        return self.fake(cmd, **kwargs)


@settings(max_examples=60, deadline=None)
@given(
    call_seconds=st.floats(min_value=0.0, max_value=12.0),
    spent_seconds=st.floats(min_value=0.0, max_value=5.0),
    others_drained=st.booleans(),
)
def test_every_call_and_the_breakers_wait_end_within_what_is_left_of_the_budget(
    tmp_path_factory: Any, call_seconds: float, spent_seconds: float, others_drained: bool
) -> None:
    clock = FakeClock()
    fake = FakeSlurm.of("g1", "g2", "g3", clock=clock)
    if others_drained:  # the breaker's check after the drain undoes it: more calls, and a wait
        fake.admin_drain("g2", "memtest")
    slow = SlowController(fake, call_seconds)
    deadline = clock() + 5.0 - spent_seconds  # the prolog's 5 s, some already spent on the verdict
    config = SlurmConfig(enabled=True, node_name="g1", max_drained_share=0.34, timeout_seconds=10)
    decision = act_within(
        REPORT, config, tmp_path_factory.mktemp("s"), lambda: deadline - clock(), run=slow, clock=clock,
        sleep=clock.sleep,
    )  # fmt: skip
    assert clock() <= deadline + 1e-9, (decision, slow.timeouts)
    assert decision.step in ("drain", "refused", "unknown")


def test_a_controller_that_does_not_answer_sinfo_is_said_so_not_an_unknown_node(tmp_path: Path) -> None:
    """slurmctld stopped: sinfo --json exits 0 with ``errors`` and no node."""
    silent = {
        "meta": {},
        "errors": [{"error": "Unable to contact slurm controller (connect failure)", "error_number": 1007}],
        "nodes": [],
    }

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if cmd[1:] == ["--json"]:
            return subprocess.CompletedProcess(cmd, 0, json.dumps(silent), "")
        return subprocess.CompletedProcess(cmd, 1, "", "slurm_load_node error: Unable to contact slurm controller")

    config = SlurmConfig(enabled=True, node_name="n3")
    decision = act(REPORT, config, tmp_path, env={}, client=Scontrol(config, run=run))
    assert decision.step == "unknown"
    assert "controller did not answer" in decision.message and "does not know" not in decision.message


FAKE_SLURM = """#!{python}
# sinfo / scontrol of one node n1, every call DELAY seconds late (a slow controller)
import json, sys, time
from pathlib import Path
time.sleep({delay})
state = Path({state!r})
node = json.loads(state.read_text())
if sys.argv[1:] == ["--json"]:
    print(json.dumps({{"meta": {{}}, "errors": [], "nodes": [node]}}))
elif sys.argv[1] == "update":
    args = dict(a.split("=", 1) for a in sys.argv[2:])
    if args.get("state") == "drain":
        node.update(state_flags=["DRAIN"], reason=args["reason"], reason_changed_at=int(time.time()))
    else:
        node.update(state_flags=[], reason="", reason_changed_at=0)
    state.write_text(json.dumps(node))
else:
    sys.exit(1)
"""


def test_a_critical_prolog_with_a_slow_controller_answers_in_its_budget_and_does_not_exit_1(tmp_path: Path) -> None:
    """Every sinfo / scontrol call takes 2 s: sinfo, the drain, then no time is left to check the drain
    against the breaker. The Slurm step is UNKNOWN (the drain stays recorded unchecked, the next check
    completes it) and the prolog exits 0: with 1, slurmd would drain the node itself, past the breaker."""
    node = {
        "name": "n1",
        "state": "idle",
        "state_flags": [],
        "reason": "",
        "reason_changed_at": 0,
        "partitions": ["gpu"],
    }
    (tmp_path / "node.json").write_text(json.dumps(node))
    fake = tmp_path / "slurm"
    fake.write_text(FAKE_SLURM.format(python=sys.executable, delay=2.0, state=str(tmp_path / "node.json")))
    fake.chmod(0o755)
    config = tmp_path / "gpumon.yaml"
    config.write_text(
        f"kernel_log: false\nhealth:\n  slurm:\n    enabled: true\n    node_name: n1\n    partition: gpu\n"
        f"    max_drained_share: 1.0\n    sinfo: {fake}\n    scontrol: {fake}\n    prolog_timeout_seconds: 5\n"
    )
    started = time.monotonic()
    done = run_cli(
        "health", "--slurm-prolog", "--local", "--backend", "fake:gpu-lost", "--config", str(config),
        "--state-dir", str(tmp_path / "state"),
    )  # fmt: skip
    took = time.monotonic() - started
    print(f"\nprolog with a 2 s controller: {took:.1f} s (budget 5 s + Python's start)")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "slurm: unknown: " in done.stdout and "prolog_timeout_seconds" in done.stdout, done.stdout
