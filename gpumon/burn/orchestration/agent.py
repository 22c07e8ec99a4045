"""The agent: spawns one worker per local GPU, watches their heartbeats, collects their results.

One agent per host (or per torchrun process). Agents of a multi-node run share a TCPStore:
each publishes its ranks' progress every second, so every agent's watchdog sees the whole
run, and the first agent to find a hang or a dead rank tells the others to stop.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue as queue_mod
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing import forkserver
from typing import Any

from gpumon.burn.orchestration import watchdog
from gpumon.burn.orchestration.interrupts import signals_deferred
from gpumon.burn.orchestration.protocol import NO_MULTICAST_ENV, WorkerSpec

BEAT_PUBLISH_SECONDS = 1.0
KILL_GRACE_SECONDS = 2.0
REMOTE_EXTRAPOLATE_SECONDS = 2.0
"""A remote rank's age is what its agent last said plus at most this; longer silence is the agent's (a lost node)."""
DEATH_GRACE_SECONDS = 2.5
"""After a local worker dies in a multi-node run, every other agent gets this long to speak: one that stays
silent since before the death is the likelier cause (a lost node), and is named once past its limit."""


@dataclass
class RankState:
    """The agent's view of one local worker."""

    rank: int
    gpu: int
    node: int
    test: str = "start"
    collective: str | None = "spawn"
    last_progress: float = field(default_factory=time.monotonic)
    ready: bool = False
    done: bool = False
    exit_code: int | None = None
    model: str | None = None
    startup_seconds: dict[str, float] = field(default_factory=dict)
    """How long the worker took to import torch, open its device and join the process group."""
    metrics: dict[str, float] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)
    """TFLOP/s of every round reported so far, by test: kept when the run is stopped before the result."""
    died_at: float | None = None
    results: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Abort:
    kind: str
    """hang | dead | lost (another node's agent went silent) | cannot_run | interrupted"""
    message: str
    ranks: tuple[int, ...] = ()
    agents: tuple[int, ...] = ()
    """For ``lost``: the agents that went silent (the merge does not wait for them)."""

    def to_jsonable(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "ranks": list(self.ranks), "agents": list(self.agents)}


TORCH_NUMPY_WARNING = "ignore:Failed to initialize NumPy:UserWarning"
"""The warning filter (PYTHONWARNINGS syntax) for torch's import-time warning when NumPy is missing."""


def start_worker_server() -> Any:
    """The multiprocessing context the workers start from, its fork server already importing torch.

    Spawned workers each imported torch themselves, all at once (3.4-5.4 s on 4 x H100); the fork
    server imports it once, while the agent does its own start-up, and forks every worker from there
    with torch loaded. The server never initialises CUDA, so each worker opens its GPU as before. It
    starts with SIGINT and SIGTERM blocked, as spawned workers did: each worker unblocks them first.
    """
    for key, value in NO_MULTICAST_ENV.items():
        os.environ[key] = value  # the server's environment is the workers'
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "gpumon.burn.orchestration.worker"])
    before = os.environ.get("PYTHONWARNINGS")
    # torch built without NumPy warns at import; the server imports it before any filter of ours runs
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [before, TORCH_NUMPY_WARNING]))
    try:
        with signals_deferred():
            forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before
    return ctx


class Agent:
    """Runs the local workers to the end, or until the watchdog or another agent stops them."""

    def __init__(
        self,
        specs: list[WorkerSpec],
        node: int,
        agent_index: int,
        agent_count: int,
        store: Any,
        heartbeat_timeout_seconds: float,
        startup_timeout_seconds: float,
        on_tick: Callable[[dict[int, RankState]], None] = lambda _s: None,
        on_test: Callable[[int, str], None] = lambda _g, _t: None,
        mp_context: Any = None,
        node_names: Mapping[int, str] | None = None,
    ) -> None:
        self.specs = specs
        self.node_names = dict(node_names or {})
        """Node index -> its name (Slurm's node name), for the faults; empty: indices only."""
        self.mp_context = mp_context
        """Where the workers start from (``start_worker_server()``); None: spawned, each importing torch."""
        self.node = node
        self.agent_index = agent_index
        self.agent_count = agent_count
        self.store = store
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds
        self.startup_timeout_seconds = startup_timeout_seconds
        self.on_tick = on_tick
        self.on_test = on_test
        self.states = {s.rank: RankState(rank=s.rank, gpu=s.gpu, node=node) for s in specs}
        self.abort: Abort | None = None
        self._procs: dict[int, Any] = {}
        self._beat_seq = 0
        self._remote: dict[int, tuple[int, float, list[dict[str, Any]]]] = {}
        """agent -> (beat sequence, when this agent saw it change, its ranks)."""
        self._started = time.monotonic()

    # ------------------------------------------------------------------
    def run(self) -> None:
        for key, value in NO_MULTICAST_ENV.items():
            os.environ[key] = value  # inherited by the spawned workers
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        from gpumon.burn.orchestration import worker

        ctx = self.mp_context or multiprocessing.get_context("spawn")
        q = ctx.Queue()
        next_beat = 0.0
        self._started = time.monotonic()
        try:
            # Ctrl-C / SIGTERM wait until every worker has its start-up data: an interrupt in the
            # middle of that handover left a worker printing a traceback (EOFError).
            with signals_deferred():
                for spec in self.specs:
                    proc = ctx.Process(
                        target=worker.main, args=(spec, q), name=f"gpumon-burn-rank{spec.rank}", daemon=True
                    )
                    proc.start()
                    self._procs[spec.rank] = proc
                    self.states[spec.rank].last_progress = time.monotonic()
            while True:
                self._drain(q, timeout=0.2)
                self._reap()
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + BEAT_PUBLISH_SECONDS
                    self._exchange_beats()
                    self._check_watchdog()
                self.on_tick(self.states)
                pending = any(st.died_at is not None for st in self.states.values())  # a death not yet judged
                if self.abort is not None or (all(not p.is_alive() for p in self._procs.values()) and not pending):
                    break
        except KeyboardInterrupt:
            self.abort = Abort("interrupted", "interrupted (Ctrl-C)")
            self._publish_abort()
            raise
        finally:
            self._drain(q, timeout=0.0)
            self._stop_workers()
            self._drain(q, timeout=0.0)
            q.close()
            q.cancel_join_thread()
            with contextlib.suppress(Exception):  # the others see this agent's ranks done, not a silent node
                self._exchange_beats()

    # ------------------------------------------------------------------
    def _drain(self, q: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                msg = q.get(timeout=left) if left > 0 else q.get_nowait()
            except (queue_mod.Empty, OSError, EOFError, ValueError):
                return
            self._handle(msg)
            timeout = 0.0

    def _handle(self, msg: dict[str, Any]) -> None:
        st = self.states.get(int(msg.get("rank", -1)))
        if st is None:
            return
        st.last_progress = time.monotonic()
        kind = msg.get("type")
        if kind == "beat":
            test = str(msg.get("test"))
            if test != st.test:
                self.on_test(st.gpu, test)
                st.metrics = {}
            st.test = test
            st.collective = msg.get("collective")
            if msg.get("metrics"):
                st.metrics = dict(msg["metrics"])
                if "tflops" in st.metrics:
                    st.rates.setdefault(test, []).append(float(st.metrics["tflops"]))
        elif kind == "ready":
            st.ready = True
            st.collective = None
            st.model = msg.get("model")
            st.startup_seconds = dict(msg.get("startup_seconds") or {})
        elif kind == "result":
            st.results[str(msg["test"])] = msg["data"]
        elif kind == "error":
            # A peer's agent may already have stopped the run (its abort is in the store before
            # it kills its workers): then this error is fallout, not a finding of its own.
            self._adopt_remote_abort()
            err = {k: msg.get(k) for k in ("test", "kind", "message", "traceback")}
            err["after_abort"] = self.abort is not None
            err["at"] = time.monotonic()
            st.errors.append(err)
            if msg.get("kind") == "cannot_run" and self.abort is None:
                self.abort = Abort("cannot_run", str(msg.get("message")), (st.rank,))
                self._publish_abort()
        elif kind == "done":
            st.done = True
            st.collective = None

    def _reap(self) -> None:
        for rank, proc in self._procs.items():
            st = self.states[rank]
            if st.exit_code is None and not proc.is_alive():
                st.exit_code = proc.exitcode
                if not st.done and self.abort is None:
                    self._adopt_remote_abort()
                if not st.done and self.abort is None:
                    if any(e.get("kind") == "cannot_run" for e in st.errors):
                        continue
                    st.died_at = time.monotonic()
                    self._judge_deaths()

    def _judge_deaths(self) -> None:
        """A local worker that died is the fault, unless another node went silent before it died.

        In a multi-node run a worker also dies because a peer node vanished (its collective fails):
        the agents that stay silent since before the death are then named as lost instead, by
        ``_check_lost_agents`` once past their limit.
        """
        if self.abort is not None:
            return
        now = time.monotonic()
        for rank, st in self.states.items():
            if st.died_at is None:
                continue
            if self.agent_count > 1:
                if now - st.died_at < DEATH_GRACE_SECONDS:
                    return
                if any(self._last_heard(a) < st.died_at and not self._finished(a) for a in self._others()):
                    return
            code = self._procs[rank].exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            last = st.errors[-1]["message"] if st.errors else ""
            self.abort = Abort(
                "dead",
                f"rank {rank} (GPU {st.gpu}) died ({how}) during {st.test}" + (f": {last}" if last else ""),
                (rank,),
            )
            self._publish_abort()
            return

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

    def _views(self) -> list[watchdog.RankView]:
        now = time.monotonic()
        views = [
            watchdog.RankView(
                rank=s.rank,
                gpu=s.gpu,
                node=s.node,
                test=s.test,
                collective=s.collective,
                age_seconds=now - s.last_progress,
                ready=s.ready,
                done=s.done or s.exit_code is not None,
            )
            for s in self.states.values()
        ]
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

    def _check_watchdog(self) -> None:
        self._check_lost_agents()
        self._judge_deaths()
        if self.abort is not None:
            return
        hang = watchdog.decide(self._views(), self.heartbeat_timeout_seconds, self.startup_timeout_seconds)
        if hang is not None:
            self.abort = Abort("hang", hang.message, hang.ranks)
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

    def _stop_workers(self) -> None:
        alive = [p for p in self._procs.values() if p.is_alive()]
        for p in alive:
            p.terminate()
        deadline = time.monotonic() + KILL_GRACE_SECONDS
        for p in alive:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in alive:
            if p.is_alive():
                p.kill()
                p.join(5)
        for rank, p in self._procs.items():
            if self.states[rank].exit_code is None:
                self.states[rank].exit_code = p.exitcode

    # ------------------------------------------------------------------
    def node_result(self) -> dict[str, Any]:
        """This agent's share of the report (merged by agent 0)."""
        return {
            "agent": self.agent_index,
            "node": self.node,
            "hostname": socket.gethostname(),
            "ranks": [
                {
                    "rank": s.rank,
                    "gpu": s.gpu,
                    "node": s.node,
                    "model": s.model,
                    "startup_seconds": s.startup_seconds,
                    "results": s.results,
                    "errors": s.errors,
                    "ready": s.ready,
                    "done": s.done,
                    "exit_code": s.exit_code,
                    "last_test": s.test,
                    "partial": {
                        test: {"tflops_rounds": rates}
                        for test, rates in s.rates.items()
                        if rates and test not in s.results
                    },
                }
                for s in self.states.values()
            ],
            "abort": self.abort.to_jsonable() if self.abort else None,
        }
