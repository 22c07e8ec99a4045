"""The cross-node half of an agent: beats and aborts through the run's shared store, lost nodes.

Agents of a multi-node run share a TCPStore: each publishes its ranks' progress every second
(``beat/<agent>``), so every agent's watchdog sees the whole run, and the first agent to find a hang
or a dead rank puts its ``abort`` there for the others. An agent silent past its limit is a lost node.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any

from gpumon.burn.orchestration import watchdog
from gpumon.burn.orchestration.rank_state import Abort, RankState

BEAT_PUBLISH_SECONDS = 1.0
REMOTE_EXTRAPOLATE_SECONDS = 2.0
"""A remote rank's age is what its agent last said plus at most this; longer silence is the agent's (a lost node)."""


class AgentExchange:
    """What an agent shares with the other agents of its run, through the store: its beats out, theirs in
    (``remote``), an abort published or taken over. The agent keeps its ranks and its abort; it hands them
    in and takes back the abort to hold."""

    def __init__(
        self,
        agent_index: int,
        agent_count: int,
        store: Any,
        heartbeat_timeout_seconds: float,
        startup_timeout_seconds: float,
        node_names: Mapping[int, str],
    ) -> None:
        self.agent_index = agent_index
        self.agent_count = agent_count
        self.store = store
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds
        self.startup_timeout_seconds = startup_timeout_seconds
        self.node_names = dict(node_names)
        """Node index -> its name (Slurm's node name), for the faults; empty: indices only."""
        self.beat_seq = 0
        self.remote: dict[int, tuple[int, float, list[dict[str, Any]]]] = {}
        """agent -> (beat sequence, when this agent saw it change, its ranks)."""
        self.started = time.monotonic()
        """When the run started (time.monotonic): an agent not heard from yet is silent since then."""

    def others(self) -> list[int]:
        return [a for a in range(self.agent_count) if a != self.agent_index]

    def finished(self, agent: int) -> bool:
        """Whether ``agent``'s last beat says all its ranks are done (it stops beating on purpose)."""
        seen = self.remote.get(agent)
        return seen is not None and bool(seen[2]) and all(r["done"] for r in seen[2])

    def last_heard(self, agent: int) -> float:
        """When this agent last saw ``agent``'s beat change (the start of the run before its first beat)."""
        seen = self.remote.get(agent)
        return seen[1] if seen is not None else self.started

    def _node_name(self, node: int) -> str:
        return f"{node} ({self.node_names[node]})" if node in self.node_names else str(node)

    def lost_agents(self, states: Mapping[int, RankState]) -> Abort | None:
        """The abort for the agents silent past the heartbeat limit (start-up limit before their first beat):
        lost nodes, named with their ranks; None when none is. The errors of ``states`` since the first of
        them went silent are marked as after the abort (a collective that failed because the node vanished)."""
        if self.agent_count <= 1:
            return None
        now = time.monotonic()
        lost, parts, ranks = [], [], []
        for agent in self.others():
            if self.finished(agent):
                continue  # it stopped beating on purpose
            seen = self.remote.get(agent)
            limit = self.heartbeat_timeout_seconds if seen is not None else self.startup_timeout_seconds
            silent = now - self.last_heard(agent)
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
            return None
        since = min(self.last_heard(a) for a in lost)
        for st in states.values():
            for err in st.errors:
                if err.get("at", 0.0) >= since - BEAT_PUBLISH_SECONDS:
                    err["after_abort"] = True  # a collective that failed because the node vanished
        return Abort("lost", "; ".join(parts), tuple(ranks), tuple(lost))

    def exchange_beats(self, states: Mapping[int, RankState], abort: Abort | None) -> Abort | None:
        """Publish this agent's ranks and read the others' beats; the abort to hold after it: ``abort`` when
        one is held, else one another agent stored, or ``dead`` when the store went away."""
        if self.agent_count <= 1:
            return abort
        now = time.monotonic()
        self.beat_seq += 1
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
            for s in states.values()
        ]
        try:
            self.store.set(f"beat/{self.agent_index}", json.dumps({"seq": self.beat_seq, "ranks": mine}))
            for agent in range(self.agent_count):
                if agent == self.agent_index or not self.store.check([f"beat/{agent}"]):
                    continue
                data = json.loads(self.store.get(f"beat/{agent}"))
                old = self.remote.get(agent)
                if old is None or old[0] != data["seq"]:
                    self.remote[agent] = (data["seq"], now, data["ranks"])
            if abort is None:
                abort = self._stored_abort()
        except Exception as exc:  # the store (rank 0's host) went away
            if abort is None:
                abort = Abort("dead", f"lost contact with the other nodes' agents: {exc}")
        return abort

    def _stored_abort(self) -> Abort | None:
        """The abort another agent put in the store, if any; raises when the store is unreachable."""
        if not self.store.check(["abort"]):
            return None
        data = json.loads(self.store.get("abort"))
        return Abort(data["kind"], data["message"], tuple(data["ranks"]), tuple(data.get("agents") or ()))

    def remote_abort(self) -> Abort | None:
        """Another agent's abort, if one is in the store (multi-node runs only; None when the store is gone:
        the next beat exchange says so)."""
        if self.agent_count <= 1:
            return None
        with contextlib.suppress(Exception):
            return self._stored_abort()
        return None

    def publish_abort(self, abort: Abort) -> None:
        """Put ``abort`` in the store for the other agents, unless one is there already."""
        if self.agent_count <= 1:
            return
        try:
            if not self.store.check(["abort"]):
                self.store.set("abort", json.dumps(abort.to_jsonable()))
        except Exception:
            pass

    def remote_views(self, now: float) -> list[watchdog.RankView]:
        """The other agents' ranks as their last beats describe them, aged by at most REMOTE_EXTRAPOLATE_SECONDS."""
        views = []
        for _agent, (_seq, seen_at, ranks) in self.remote.items():
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
