"""How an agent tells a lost node from one that finished or one that is merely slow to start."""

from __future__ import annotations

import time

from gpumon.burn.orchestration.agent import Agent


def _agent(heartbeat: float = 5, startup: float = 60) -> Agent:
    return Agent(
        [],
        node=0,
        agent_index=0,
        agent_count=2,
        store=None,
        heartbeat_timeout_seconds=heartbeat,
        startup_timeout_seconds=startup,
    )


def _beat(done: bool) -> list[dict]:
    return [
        {"rank": 1, "gpu": 0, "node": 1, "test": "matmul", "collective": None, "age": 0.3, "ready": True, "done": done}
    ]


def test_an_agent_silent_past_the_heartbeat_timeout_is_a_lost_node_named_with_its_ranks():
    a = _agent()
    a.exchange.remote[1] = (7, time.monotonic() - 6, _beat(done=False))
    a._check_watchdog()
    assert a.abort is not None and a.abort.kind == "lost" and a.abort.agents == (1,)
    assert a.abort.message.startswith("node 1 lost: its agent sent nothing for 6 s (limit 5 s)")
    assert "rank 1 (GPU 0) went with it" in a.abort.message


def test_an_agent_that_finished_or_spoke_recently_is_not_lost():
    finished, recent = _agent(), _agent()
    finished.exchange.remote[1] = (9, time.monotonic() - 60, _beat(done=True))
    recent.exchange.remote[1] = (9, time.monotonic() - 3, _beat(done=False))
    finished._check_watchdog()
    recent._check_watchdog()
    assert finished.abort is None and recent.abort is None


def test_an_agent_not_heard_from_yet_has_the_start_up_limit():
    a = _agent(heartbeat=5, startup=60)
    a.exchange.started = time.monotonic() - 30
    a._check_watchdog()
    assert a.abort is None
    a.exchange.started = time.monotonic() - 61
    a._check_watchdog()
    assert a.abort is not None and a.abort.message.startswith("agent 1 lost")
