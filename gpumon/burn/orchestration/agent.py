"""The agent: spawns one worker per local GPU, watches their heartbeats, collects their results.

One agent per host (or per torchrun process). Agents of a multi-node run share a TCPStore
(``agent_exchange``): each publishes its ranks' progress every second, so every agent's watchdog
sees the whole run, and the first agent to find a hang or a dead rank tells the others to stop.
The workers start from the fork server of ``worker_server``; ``rank_state`` holds what is known of each.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue as queue_mod
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpumon.burn.orchestration import watchdog
from gpumon.burn.orchestration.agent_exchange import BEAT_PUBLISH_SECONDS, AgentExchange
from gpumon.burn.orchestration.interrupts import signals_deferred
from gpumon.burn.orchestration.protocol import NO_MULTICAST_ENV, WorkerSpec
from gpumon.burn.orchestration.rank_state import Abort, RankState

KILL_GRACE_SECONDS = 2.0
DEATH_GRACE_SECONDS = 2.5
"""After a local worker dies in a multi-node run, every other agent gets this long to speak: one that stays
silent since before the death is the likelier cause (a lost node), and is named once past its limit."""


class Agent:
    """Runs the local workers to the end, or until the watchdog or another agent stops them (the other agents
    are reached through its ``exchange``)."""

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
        self.mp_context = mp_context
        """Where the workers start from (``start_worker_server()``); None: spawned, each importing torch."""
        self.node = node
        self.agent_index = agent_index
        self.agent_count = agent_count
        self.heartbeat_timeout_seconds = heartbeat_timeout_seconds
        self.startup_timeout_seconds = startup_timeout_seconds
        self.on_tick = on_tick
        self.on_test = on_test
        self.states = {s.rank: RankState(rank=s.rank, gpu=s.gpu, node=node) for s in specs}
        self.abort: Abort | None = None
        self._procs: dict[int, Any] = {}
        self.exchange = AgentExchange(
            agent_index, agent_count, store, heartbeat_timeout_seconds, startup_timeout_seconds, node_names or {}
        )

    # ------------------------------------------------------------------
    def run(self) -> None:
        for key, value in NO_MULTICAST_ENV.items():
            os.environ[key] = value  # inherited by the spawned workers
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        from gpumon.burn.orchestration import worker

        ctx = self.mp_context or multiprocessing.get_context("spawn")
        q = ctx.Queue()
        next_beat = 0.0
        self.exchange.started = time.monotonic()
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
                    self.abort = self.exchange.exchange_beats(self.states, self.abort)
                    self._check_watchdog()
                self.on_tick(self.states)
                pending = any(st.died_at is not None for st in self.states.values())  # a death not yet judged
                if self.abort is not None or (all(not p.is_alive() for p in self._procs.values()) and not pending):
                    break
        except KeyboardInterrupt:
            self._stop(Abort("interrupted", "interrupted (Ctrl-C)"))
            raise
        finally:
            self._drain(q, timeout=0.0)
            self._stop_workers()
            self._drain(q, timeout=0.0)
            q.close()
            q.cancel_join_thread()
            with contextlib.suppress(Exception):  # the others see this agent's ranks done, not a silent node
                self.abort = self.exchange.exchange_beats(self.states, self.abort)

    def _stop(self, abort: Abort) -> None:
        """Stop the run for ``abort``, and tell the other agents."""
        self.abort = abort
        self.exchange.publish_abort(abort)

    def _adopt_remote_abort(self) -> None:
        """Take over another agent's abort, if one is in the store (multi-node runs only)."""
        if self.abort is None:
            self.abort = self.exchange.remote_abort()

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
                self._stop(Abort("cannot_run", str(msg.get("message")), (st.rank,)))
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
        ``exchange.lost_agents`` once past their limit.
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
                exchange = self.exchange
                if any(exchange.last_heard(a) < st.died_at and not exchange.finished(a) for a in exchange.others()):
                    return
            code = self._procs[rank].exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            last = st.errors[-1]["message"] if st.errors else ""
            self._stop(
                Abort(
                    "dead",
                    f"rank {rank} (GPU {st.gpu}) died ({how}) during {st.test}" + (f": {last}" if last else ""),
                    (rank,),
                )
            )
            return

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
        views += self.exchange.remote_views(now)
        return views

    def _check_watchdog(self) -> None:
        if self.abort is None:
            lost = self.exchange.lost_agents(self.states)
            if lost is not None:
                self._stop(lost)
        self._judge_deaths()
        if self.abort is not None:
            return
        hang = watchdog.decide(self._views(), self.heartbeat_timeout_seconds, self.startup_timeout_seconds)
        if hang is not None:
            self._stop(Abort("hang", hang.message, hang.ranks))

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
