"""The cross-node half of an agent: beats and aborts through the run's shared store, lost nodes.

Agents of a multi-node run share a TCPStore: each publishes its ranks' progress every second
(``beat/<agent>``), so every agent's watchdog sees the whole run, and the first agent to find a hang
or a dead rank puts its ``abort`` there for the others. An agent silent past its limit is a lost node.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from gpumon.burn.orchestration import watchdog
from gpumon.burn.orchestration.rank_state import Abort, RankState

BEAT_PUBLISH_SECONDS = 1.0
REMOTE_EXTRAPOLATE_SECONDS = 2.0
"""A remote rank's age is what its agent last said plus at most this; longer silence is the agent's (a lost node)."""


class AgentExchange:
    """What an agent shares with the other agents of its run; ``Agent`` holds the attributes it reads."""

    agent_index: int
    agent_count: int
    store: Any
    heartbeat_timeout_seconds: float
    startup_timeout_seconds: float
    node_names: dict[int, str]
    states: dict[int, RankState]
    abort: Abort | None
    _beat_seq: int
    _remote: dict[int, tuple[int, float, list[dict[str, Any]]]]
    """agent -> (beat sequence, when this agent saw it change, its ranks)."""
    _started: float

    def _others(self) -> list[int]:
        return [a for a in range(self.agent_count) if a != self.agent_index]

    def _finished(self, agent: int) -> bool:
        """Whether ``agent``'s last beat says all its ranks are done (it stops beating on purpose)."""
        seen = self._remote.get(agent)
        return seen is not None and bool(seen[2]) and all(r["done"] for r in seen[2])

    def _last_heard(self, agent: int) -> float:
        """When this agent last saw ``agent``'s beat change (the start of the run before its first beat)."""
        seen = self._remote.get(agent)
        return seen[1] if seen is not None else self._started

    def _node_name(self, node: int) -> str:
        return f"{node} ({self.node_names[node]})" if node in self.node_names else str(node)

    def _check_lost_agents(self) -> None:
        """Agents silent past the heartbeat limit (start-up limit before their first beat) are lost nodes."""
        if self.abort is not None or self.agent_count <= 1:
            return
        now = time.monotonic()
        lost, parts, ranks = [], [], []
        for agent in self._others():
            if self._finished(agent):
                continue  # it stopped beating on purpose
            seen = self._remote.get(agent)
            limit = self.heartbeat_timeout_seconds if seen is not None else self.startup_timeout_seconds
            silent = now - self._last_heard(agent)
            if silent <= limit:
                continue
            lost.append(agent)
            theirs = seen[2] if seen is not None else []
            ranks += [r["rank"] for r in theirs]
            nodes = sorted({r["node"] for r in theirs})
            where = f"node {', '.join(self._node_name(n) for n in nodes)}" if nodes else f"agent {agent}"
            named = ", ".join(f"rank {r['rank']} (GPU {r['gpu']})" for r in theirs)
            parts.append(
                f"{where} lost: its agent sent nothing for {silent:.0f} s (limit {limit:.0f} s)"
                + (f"; {named} went with it" if named else "")
            )
        if not lost:
            return
        since = min(self._last_heard(a) for a in lost)
        for st in self.states.values():
            for err in st.errors:
                if err.get("at", 0.0) >= since - BEAT_PUBLISH_SECONDS:
                    err["after_abort"] = True  # a collective that failed because the node vanished
        self.abort = Abort("lost", "; ".join(parts), tuple(ranks), tuple(lost))
        self._publish_abort()

    def _exchange_beats(self) -> None:
        if self.agent_count <= 1:
            return
        now = time.monotonic()
        self._beat_seq += 1
        mine = [
            {
                "rank": s.rank,
                "gpu": s.gpu,
                "node": s.node,
                "test": s.test,
                "collective": s.collective,
                "age": now - s.last_progress,
                "ready": s.ready,
                "done": s.done or s.exit_code is not None,
            }
            for s in self.states.values()
        ]
        try:
            self.store.set(f"beat/{self.agent_index}", json.dumps({"seq": self._beat_seq, "ranks": mine}))
            for agent in range(self.agent_count):
                if agent == self.agent_index or not self.store.check([f"beat/{agent}"]):
                    continue
                data = json.loads(self.store.get(f"beat/{agent}"))
                old = self._remote.get(agent)
                if old is None or old[0] != data["seq"]:
                    self._remote[agent] = (data["seq"], now, data["ranks"])
            if self.abort is None:
                self.abort = self._stored_abort()
        except Exception as exc:  # the store (rank 0's host) went away
            if self.abort is None:
                self.abort = Abort("dead", f"lost contact with the other nodes' agents: {exc}")

    def _stored_abort(self) -> Abort | None:
        """The abort another agent put in the store, if any; raises when the store is unreachable."""
        if not self.store.check(["abort"]):
            return None
        data = json.loads(self.store.get("abort"))
        return Abort(data["kind"], data["message"], tuple(data["ranks"]), tuple(data.get("agents") or ()))

    def _adopt_remote_abort(self) -> None:
        """Take over another agent's abort, if one is in the store (multi-node runs only)."""
        if self.agent_count <= 1 or self.abort is not None:
            return
        with contextlib.suppress(Exception):  # the store is gone; the next beat exchange says so
            self.abort = self._stored_abort()

    def _publish_abort(self) -> None:
        if self.agent_count <= 1 or self.abort is None:
            return
        try:
            if not self.store.check(["abort"]):
                self.store.set("abort", json.dumps(self.abort.to_jsonable()))
        except Exception:
            pass

    def _remote_views(self, now: float) -> list[watchdog.RankView]:
        """The other agents' ranks as their last beats describe them, aged by at most REMOTE_EXTRAPOLATE_SECONDS."""
        views = []
        for _agent, (_seq, seen_at, ranks) in self._remote.items():
            silent = min(now - seen_at, REMOTE_EXTRAPOLATE_SECONDS)
            for r in ranks:
                views.append(
                    watchdog.RankView(
                        rank=r["rank"],
                        gpu=r["gpu"],
                        node=r["node"],
                        test=r["test"],
                        collective=r["collective"],
                        age_seconds=r["age"] + silent,
                        ready=r["ready"],
                        done=r["done"],
                    )
                )
        return views
