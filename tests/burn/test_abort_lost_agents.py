"""A multi-node abort names the lost agents for every agent, also those that learn of it from another
agent: the merge then waits only the short grace for them, never the whole merge timeout."""

from __future__ import annotations

import datetime
import json
import time
from typing import Any

import pytest

from gpumon.burn.orchestration import merge
from gpumon.burn.orchestration.agent import Agent
from gpumon.burn.orchestration.options import BurnOptions, Launch
from gpumon.burn.verdict.thresholds import Thresholds

LOST_ABORT = '{"kind": "lost", "message": "node 2 lost: its agent sent nothing for 9 s (limit 5 s)", '
WAITED_TOO_LONG_SECONDS = 5.0


class _Store:
    """The TCPStore calls agents make, on a dict; a call later than WAITED_TOO_LONG_SECONDS after the
    first fails the test (the merge waited for an agent the abort names lost)."""

    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self._first: float | None = None

    def _called(self) -> None:
        now = time.monotonic()
        self._first = now if self._first is None else self._first
        assert now - self._first < WAITED_TOO_LONG_SECONDS, "the merge waited for an agent named lost"

    def set(self, key: str, value: str) -> None:
        self._called()
        self.data[key] = value

    def get(self, key: str) -> bytes:
        self._called()
        return self.data[key].encode()

    def check(self, keys: list[str]) -> bool:
        self._called()
        return all(k in self.data for k in keys)

    def wait(self, keys: list[str], timeout: datetime.timedelta) -> None:
        """Block until ``keys`` are set, as TCPStore.wait does (TimeoutError after ``timeout``)."""
        deadline = time.monotonic() + timeout.total_seconds()
        while not self.check(keys):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{keys} not set")
            time.sleep(0.05)


def _agent(store: _Store, index: int) -> Agent:
    return Agent(
        [],
        node=index,
        agent_index=index,
        agent_count=3,
        store=store,
        heartbeat_timeout_seconds=5,
        startup_timeout_seconds=60,
    )


def _opts(index: int) -> BurnOptions:
    return BurnOptions(
        gpus=(0,),
        tests=("matmul",),
        duration_seconds=1.0,
        quick=True,
        dtype="bf16",
        json_path=None,
        force=False,
        device="cpu",
        backend_spec="fake",
        state_dir="/nonexistent",
        heartbeat_timeout_seconds=5.0,
        startup_timeout_seconds=60.0,
        launch=Launch("flags", agent_index=index, agent_count=3, node_index=index, node_count=3),
        gpus_per_agent=1,
    )


@pytest.fixture(autouse=True)
def _short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(merge, "LOST_MERGE_GRACE_SECONDS", 0.2)


def _merge(store: _Store, index: int, agent: Agent) -> dict[str, Any]:
    return merge.merge_results(store, _opts(index), agent.node_result(), Thresholds(), _NoInjection(), 0.0)


class _NoInjection:
    def describe(self) -> str:
        return ""


def test_an_abort_taken_from_another_agent_keeps_the_lost_agents() -> None:
    store = _Store()
    store.set("abort", LOST_ABORT + '"ranks": [2], "agents": [2]}')  # agent 1 found node 2 lost
    leader = _agent(store, 0)
    leader._adopt_remote_abort()
    assert leader.abort is not None and leader.abort.kind == "lost"
    assert leader.node_result()["abort"]["agents"] == [2]


def test_the_leader_merges_without_waiting_for_an_agent_another_agent_named_lost() -> None:
    store = _Store()
    store.set("abort", LOST_ABORT + '"ranks": [2], "agents": [2]}')
    other = _agent(store, 1)
    other._adopt_remote_abort()
    store.set("node/1", json.dumps({**other.node_result(), "gpus_info": {}, "telemetry": {}}))
    store.set("fetched/1", "1")
    leader = _agent(store, 0)
    leader._adopt_remote_abort()
    started = time.monotonic()
    final = _merge(store, 0, leader)
    assert time.monotonic() - started < WAITED_TOO_LONG_SECONDS
    assert not any("sent no result" in f for f in final["faults"]), final["faults"]
    assert any("node 2 lost" in f for f in final["faults"]), final["faults"]


def test_an_agent_told_that_agent_0_is_lost_reports_its_own_share_at_once() -> None:
    store = _Store()
    store.set("abort", '{"kind": "lost", "message": "node 0 lost", "ranks": [0], "agents": [0]}')
    agent = _agent(store, 1)
    agent._adopt_remote_abort()
    started = time.monotonic()
    final = _merge(store, 1, agent)
    assert time.monotonic() - started < WAITED_TOO_LONG_SECONDS
    assert final["exit_code"] == 1 and any("node 0 lost" in f for f in final["faults"])
