"""Slurm: drain a node whose verdict is CRITICAL, resume one gpumon drained once it is OK.

Only through ``scontrol`` and only when ``health.slurm.enabled`` is true. Rules:

* the drain reason starts with ``reason_prefix`` (``gpumon:``) and names the GPU, the finding and
  the action: ``gpumon: GPU 1 xid 79 GPU has fallen off the bus: reboot node``;
* a node drained by anyone else (a reason without the prefix) is never touched;
* circuit breaker: no drain when the share of the partition's nodes already drained by gpumon is
  at or above ``max_drained_share`` (a fleet-wide driver problem must not empty the cluster);
* a controller that does not answer makes the Slurm step UNKNOWN; nothing raises;
* every action (and every refusal) is logged with its reason and appended to
  ``STATE_DIR/health/actions.jsonl``.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.findings.config import SlurmConfig
from gpumon.findings.model import CRITICAL, OK, HealthReport
from gpumon.state.files import append_line, health_dir

log = logging.getLogger("gpumon.slurm")

MAX_REASON_CHARS = 200

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class SlurmError(Exception):
    """scontrol failed or did not answer."""


@dataclass(frozen=True)
class NodeState:
    """One node as ``scontrol show node -o`` reports it."""

    name: str
    state: str
    """e.g. IDLE, MIXED+DRAIN, DOWN+DRAIN+NOT_RESPONDING."""
    reason: str
    """The reason without Slurm's ``[user@time]`` suffix; empty when none."""
    partitions: tuple[str, ...]

    @property
    def drained(self) -> bool:
        """Draining or drained (``DRAIN`` flag), whoever set it."""
        return "DRAIN" in self.state.upper().split("+")


@dataclass(frozen=True)
class Decision:
    """What the Slurm step did (or would do) and why."""

    step: str
    """drain, resume, none, refused (circuit breaker) or unknown (controller did not answer)."""
    node: str
    message: str
    reason: str | None = None
    """The drain reason, for drains."""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "node": self.node, "message": self.message, "reason": self.reason}


def node_name(config: SlurmConfig, env: Mapping[str, str]) -> str:
    """``node_name`` from the config, else $SLURMD_NODENAME (set in prolog/epilog), else the short host name."""
    return config.node_name or env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def parse_nodes(text: str) -> list[NodeState]:
    """Nodes from ``scontrol show node -o`` (one node per line, ``Key=Value`` pairs, Reason last)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("NodeName="):
            continue
        reason = ""
        head = line
        if " Reason=" in line:
            head, _, reason = line.partition(" Reason=")
            if reason.endswith("]") and " [" in reason:
                reason = reason[: reason.rindex(" [")]
        fields = dict(tok.split("=", 1) for tok in head.split() if "=" in tok)
        partitions = tuple(p for p in fields.get("Partitions", "").split(",") if p)
        out.append(
            NodeState(
                name=fields["NodeName"], state=fields.get("State", ""), reason=reason.strip(), partitions=partitions
            )
        )
    return out


class Scontrol:
    """The few scontrol calls gpumon makes; each one bounded by ``timeout_seconds``."""

    def __init__(self, config: SlurmConfig, run: Runner = subprocess.run) -> None:
        self.config = config
        self._run = run

    def _call(self, args: Sequence[str]) -> str:
        cmd = [self.config.scontrol, *args]
        try:
            done = self._run(cmd, capture_output=True, text=True, timeout=self.config.timeout_seconds, check=False)
        except FileNotFoundError as exc:
            raise SlurmError(f"{self.config.scontrol} not found") from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"scontrol did not answer within {self.config.timeout_seconds:g} s") from exc
        except OSError as exc:
            raise SlurmError(f"cannot run scontrol: {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout or "").strip().splitlines()
            raise SlurmError(f"scontrol {' '.join(args[:2])} failed: {detail[-1] if detail else done.returncode}")
        return str(done.stdout)

    def nodes(self) -> list[NodeState]:
        return parse_nodes(self._call(["show", "node", "-o"]))

    def drain(self, node: str, reason: str) -> None:
        self._call(["update", f"nodename={node}", "state=drain", f"reason={reason}"])

    def resume(self, node: str) -> None:
        self._call(["update", f"nodename={node}", "state=resume"])


def decide(report: HealthReport, me: NodeState, nodes: Sequence[NodeState], config: SlurmConfig) -> Decision:
    """The Slurm step for this verdict (pure): drain, resume, refuse or nothing."""
    prefix = config.reason_prefix
    ours = me.drained and me.reason.startswith(prefix)
    if report.status == CRITICAL:
        reason = f"{prefix} {report.reason()}"[:MAX_REASON_CHARS]
        if ours:
            if me.reason == reason:
                return Decision("none", me.name, f"already drained by gpumon: {me.reason}")
            return Decision("drain", me.name, f"drained by gpumon; reason updated to: {reason}", reason)
        if me.drained:
            return Decision("none", me.name, f"drained by someone else ({me.reason or 'no reason'}): left alone")
        partitions = [config.partition] if config.partition else list(me.partitions)
        peers = [n for n in nodes if set(n.partitions) & set(partitions)] or [me]
        drained_by_us = [n for n in peers if n.drained and n.reason.startswith(prefix)]
        share = len(drained_by_us) / len(peers)
        if share >= config.max_drained_share:
            return Decision(
                "refused",
                me.name,
                f"circuit breaker: {len(drained_by_us)} of {len(peers)} nodes of {','.join(partitions) or 'the cluster'} "
                f"already drained by gpumon ({share:.0%} >= max_drained_share {config.max_drained_share:.0%}); "
                f"NOT draining {me.name} although: {report.reason()}",
                reason,
            )
        return Decision("drain", me.name, f"draining: {reason}", reason)
    if report.status == OK and ours:
        return Decision("resume", me.name, f"healthy again; resuming (was: {me.reason})")
    if ours:
        return Decision("none", me.name, f"stays drained by gpumon while {report.status}: {me.reason}")
    return Decision("none", me.name, f"{report.status}: nothing to do")


def act(
    report: HealthReport,
    config: SlurmConfig,
    state_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    client: Scontrol | None = None,
    clock: Callable[[], float] = time.time,
) -> Decision:
    """Decide and carry out the Slurm step; never raises. Logged and recorded in actions.jsonl."""
    env = os.environ if env is None else env
    name = node_name(config, env)
    client = client or Scontrol(config)
    try:
        nodes = client.nodes()
        me = next((n for n in nodes if n.name == name), None)
        if me is None:
            decision = Decision("unknown", name, f"Slurm does not know node {name!r} (set health.slurm.node_name)")
        else:
            decision = decide(report, me, nodes, config)
            if decision.step == "drain" and decision.reason:
                client.drain(name, decision.reason)
            elif decision.step == "resume":
                client.resume(name)
    except SlurmError as exc:
        decision = Decision("unknown", name, f"Slurm step UNKNOWN: {exc}")
    level = {"drain": logging.WARNING, "resume": logging.WARNING, "refused": logging.ERROR}.get(
        decision.step, logging.ERROR if decision.step == "unknown" else logging.INFO
    )
    log.log(level, "slurm %s %s: %s", decision.step, name, decision.message)
    if decision.step != "none":
        record = {"time_seconds": clock(), "status": report.status, "source": report.source, **decision.to_json()}
        try:
            append_line(health_dir(state_dir) / "actions.jsonl", record)
        except OSError as exc:
            log.error("cannot record the Slurm action: %s", exc)
    return decision
