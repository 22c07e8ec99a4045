"""Slurm: drain a node whose verdict is CRITICAL, resume one gpumon drained once it is OK.

Only through Slurm's own commands and only when ``health.slurm.enabled`` is true. Rules:

* the drain reason starts with ``reason_prefix`` (``gpumon:``) and names every CRITICAL GPU with
  its finding and action: ``gpumon: GPU 1 xid 79 GPU has fallen off the bus: reboot node``; two bad
  GPUs are both named (``...; GPU 0 ...``), and when all of them do not fit in ``MAX_REASON_CHARS``
  the first keeps its words and the others are listed by number;
* gpumon knows its own drain by what it recorded when it issued it
  (``STATE_DIR/health/slurm-drain.json``: node, exact reason, Slurm's time of it), never by the
  prefix alone. A drain gpumon did not record (an admin's, even one starting with ``gpumon:``) or
  one whose reason someone changed since (a ticket number appended) is someone else's: never
  drained again, never resumed, its reason never overwritten;
* nodes are read with ``sinfo --json`` (Slurm 21.08 and later; 22.05 has no ``scontrol --json``),
  else ``scontrol show node -o``, whose ``Reason=`` is followed by ``Comment=``,
  ``ReservationName=`` and more: the reason ends at Slurm's ``[user@time]`` suffix;
* circuit breaker: the share of the partition's nodes that cannot take work (drained by anyone,
  DOWN, FAILED or not responding) may never exceed ``max_drained_share``. Checked before the
  drain (no drain when one more would exceed it) and again after it, because Slurm runs the
  HealthCheckProgram on every node at once and each node read the partition before the others
  drained. After the drain gpumon waits until the controller's clock has passed the second of
  its drain (Slurm stamps drains in whole seconds; ``CLOCK_SKEW_SECONDS`` allows for the clocks
  of node and controller differing), reads again and ranks the unusable nodes: first those that
  are unusable for any other reason than a drain by gpumon (they cannot give way), then gpumon's
  drains by Slurm's drain time, then node name. A node whose rank is not within the allowed
  number undoes its own drain (resumes) and reports ``refused``. Why this holds: every drain that
  ranks before mine was applied no later than my drain's second, so it is in my second reading;
  the last-ranked of any set of kept drains therefore saw all the others and would have given
  way. The first-ranked drains never see anything before them, so exactly the allowed number
  stays drained, not zero. Until the slower nodes give way (about ``CLOCK_SKEW_SECONDS`` + 1 s
  plus one read) more nodes than allowed carry the drain flag: a drain stops new jobs only, so
  for those seconds no job is lost. A drain whose check the controller did not answer is recorded
  unchecked and checked on the next run. A drain whose reason gpumon only updates is not ranked again;
  a node that goes DOWN during the check is counted from the next check on;
* a controller that does not answer makes the Slurm step UNKNOWN; nothing raises;
* every action (and every refusal) is logged with its reason and appended to
  ``STATE_DIR/health/actions.jsonl``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.health.config import SlurmConfig
from gpumon.health.slurm_commands import Scontrol
from gpumon.health.slurm_nodes import UNUSABLE, NodeState, SlurmError
from gpumon.model.findings import CRITICAL, OK, HealthReport
from gpumon.util.state.files import append_line, health_dir, read_json, write_json

log = logging.getLogger("gpumon.slurm")

MAX_REASON_CHARS = 200
CLOCK_SKEW_SECONDS = 1.0
"""How far the node's clock may be from the controller's when gpumon waits out its drain's second."""
OWN_DRAIN_FILE = "slurm-drain.json"


@dataclass(frozen=True)
class OwnDrain:
    """The drain gpumon issued on this node, as recorded in the state directory."""

    node: str
    reason: str
    time_seconds: float | None
    """Slurm's time of the drain once gpumon read it back; None before."""
    verified: bool = False
    """The circuit breaker's check after the drain completed and let it stay."""

    def matches(self, me: NodeState) -> bool:
        """``me`` is still exactly this drain: same node, drained, same reason, same time."""
        if me.name != self.node or not me.drained or me.reason != self.reason:
            return False
        return (
            self.time_seconds is None or me.reason_time_seconds is None or me.reason_time_seconds == self.time_seconds
        )


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


# ---- what gpumon recorded ------------------------------------------------------------------------------
def load_own_drain(state_dir: Path) -> OwnDrain | None:
    try:
        raw = read_json(health_dir(state_dir) / OWN_DRAIN_FILE)
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("node"), str) or not isinstance(raw.get("reason"), str):
        return None
    at = raw.get("time_seconds")
    return OwnDrain(
        node=raw["node"],
        reason=raw["reason"],
        time_seconds=float(at) if isinstance(at, (int, float)) else None,
        verified=raw.get("verified") is True,
    )


def save_own_drain(state_dir: Path, drain: OwnDrain) -> None:
    write_json(
        health_dir(state_dir) / OWN_DRAIN_FILE,
        {"node": drain.node, "reason": drain.reason, "time_seconds": drain.time_seconds, "verified": drain.verified},
    )


def forget_own_drain(state_dir: Path) -> None:
    (health_dir(state_dir) / OWN_DRAIN_FILE).unlink(missing_ok=True)


# ---- deciding ---------------------------------------------------------------------------------------------
def drain_reason(report: HealthReport, prefix: str, limit: int = MAX_REASON_CHARS) -> str:
    """``PREFIX`` and every CRITICAL GPU (or the node) with its worst finding and action, worst first;
    within ``limit`` characters the others are named by number when their words do not fit."""
    firsts: dict[str, str] = {}
    for finding in report.findings:  # worst first
        if finding.severity == CRITICAL and finding.subject not in firsts:
            firsts[finding.subject] = finding.reason()
    if not firsts:
        return f"{prefix} {report.reason()}"[:limit]
    full = f"{prefix} {'; '.join(firsts.values())}"
    if len(full) <= limit:
        return full
    subjects = list(firsts)
    gpus = [s.removeprefix("GPU ") for s in subjects[1:] if s.startswith("GPU ")]
    others = [s for s in subjects[1:] if not s.startswith("GPU ")]
    also = ", ".join([*others, *([f"GPU {','.join(gpus)}"] if gpus else [])])
    tail = f"; also {also}"
    head = f"{prefix} {firsts[subjects[0]]}"
    room = limit - len(tail)
    if room < len(prefix) + 10:  # too many to list: the count
        tail = f"; and {len(subjects) - 1} more"
        room = limit - len(tail)
    if len(head) > room:
        head = head[: room - 3] + "..."
    return (head + tail)[:limit]


def _peers(me: NodeState, nodes: Sequence[NodeState], config: SlurmConfig) -> tuple[list[NodeState], str]:
    partitions = [config.partition] if config.partition else list(me.partitions)
    peers = [n for n in nodes if set(n.partitions) & set(partitions)]
    if me.name not in {n.name for n in peers}:
        peers.append(me)
    return peers, ",".join(partitions) or "the cluster"


def allowed_unusable(total: int, config: SlurmConfig) -> int:
    """How many of ``total`` nodes may be unable to take work before gpumon stops draining: the share
    ``max_drained_share`` of them, and never more than ``max_drained_nodes`` (the lower wins)."""
    by_share = math.floor(total * config.max_drained_share + 1e-9)
    return by_share if config.max_drained_nodes is None else min(by_share, config.max_drained_nodes)


def limit_words(config: SlurmConfig) -> str:
    """The breaker's limits as configured, for messages: ``max_drained_share 25%`` (and the cap)."""
    cap = "" if config.max_drained_nodes is None else f", max_drained_nodes {config.max_drained_nodes}"
    return f"max_drained_share {config.max_drained_share:.0%}{cap}"


def counts_against_breaker(node: NodeState, config: SlurmConfig) -> bool:
    """``node`` takes a place of the breaker's allowance: it cannot take work; during a bring-up
    (``health.slurm.bring_up``) only a drain does, since nodes that are joining read DOWN, NOT_RESPONDING
    or FUTURE until their slurmd registers, which is no failure."""
    return node.drained if config.bring_up else node.unusable


def only_not_responding(node: NodeState) -> bool:
    """Unusable only because Slurm has not heard from it (no drain, not DOWN): what Slurm shows for about
    a second after it undrains a node, and what a node that really stopped answering shows until Slurm
    marks it DOWN (``SlurmdTimeout``)."""
    return node.words & UNUSABLE == {"NOT_RESPONDING"}


def decide(
    report: HealthReport,
    me: NodeState,
    nodes: Sequence[NodeState],
    config: SlurmConfig,
    own: OwnDrain | None = None,
) -> Decision:
    """The Slurm step for this verdict (pure): drain, resume, refuse or nothing. ``own``: the drain
    gpumon recorded on this node (only a drain that still matches it is gpumon's)."""
    ours = own is not None and own.matches(me)
    if report.status == CRITICAL:
        reason = drain_reason(report, config.reason_prefix)
        if ours:
            if me.reason == reason:
                return Decision("none", me.name, f"already drained by gpumon: {me.reason}")
            return Decision("drain", me.name, f"drained by gpumon; reason updated to: {reason}", reason)
        if me.drained:
            return Decision("none", me.name, f"drained by someone else ({me.reason or 'no reason'}): left alone")
        peers, where = _peers(me, nodes, config)
        others = [n for n in peers if n.name != me.name and counts_against_breaker(n, config)]
        allowed = allowed_unusable(len(peers), config)
        if len(others) + 1 > allowed:
            return Decision(
                "refused",
                me.name,
                f"circuit breaker: {len(others)} of {len(peers)} nodes of {where} cannot take work "
                f"(drained or down); draining {me.name} would exceed {limit_words(config)} "
                f"({allowed} of {len(peers)}); "
                f"NOT draining {me.name} although: {report.reason()}",
                reason,
            )
        return Decision("drain", me.name, f"draining: {reason}", reason)
    if report.status == OK and ours:
        return Decision("resume", me.name, f"healthy again; resuming (was: {me.reason})")
    if ours:
        return Decision("none", me.name, f"stays drained by gpumon while {report.status}: {me.reason}")
    return Decision("none", me.name, f"{report.status}: nothing to do")


def keeps_drain(me: NodeState, nodes: Sequence[NodeState], config: SlurmConfig) -> tuple[bool, str]:
    """After a drain: may ``me`` stay drained, given every node as read after the drain's second?

    Rank: nodes unusable for another reason than a gpumon drain first, then gpumon drains (reason
    with ``reason_prefix``, ``me`` included) by (drain time, node name). ``me`` keeps its drain when
    its rank is within the allowed number. Returns (keep, explanation).

    A node that is only NOT_RESPONDING is not ranked: Slurm shows a node so for about a second after
    it undrains it, so a node that just gave way would rank first and make the drain that should stay
    give way too (zero drained). It counts before a drain (``decide``), and once Slurm marks it DOWN."""
    peers, where = _peers(me, nodes, config)
    allowed = allowed_unusable(len(peers), config)
    unusable = [
        n for n in peers if n.name == me.name or (counts_against_breaker(n, config) and not only_not_responding(n))
    ]
    if len(unusable) <= allowed:
        return True, f"{len(unusable)} of {len(peers)} nodes of {where} cannot take work (allowed {allowed})"

    def contest(n: NodeState) -> bool:
        return n.name == me.name or (
            n.drained and n.reason.startswith(config.reason_prefix) and n.reason_time_seconds is not None
        )

    fixed = [n for n in unusable if not contest(n)]
    ranked = sorted((n for n in unusable if contest(n)), key=lambda n: (n.reason_time_seconds or math.inf, n.name))
    rank = len(fixed) + [n.name for n in ranked].index(me.name)
    order = ", ".join(n.name for n in [*fixed, *ranked])
    return rank < allowed, (
        f"{len(unusable)} of {len(peers)} nodes of {where} cannot take work after simultaneous drains "
        f"(allowed {allowed} by {limit_words(config)}); "
        f"in order ({order}) {me.name} is number {rank + 1}"
    )


# ---- acting ---------------------------------------------------------------------------------------------------
def act(
    report: HealthReport,
    config: SlurmConfig,
    state_dir: Path,
    *,
    env: Mapping[str, str] | None = None,
    client: Scontrol | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
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
            own = load_own_drain(state_dir)
            if own is not None and not own.matches(me):
                forget_own_drain(state_dir)  # resumed or changed by someone else since: no longer gpumon's
                own = None
            decision = decide(report, me, nodes, config, own)
            if own is not None and not own.verified and decision.step == "none" and report.status != OK:
                at = me.reason_time_seconds if me.reason_time_seconds is not None else clock()
                decision = _verify(client, name, me.reason, at, decision, config, state_dir, clock, sleep)
            elif decision.step == "drain" and decision.reason:
                decision = _drain(client, me, decision, config, state_dir, own, clock, sleep)
            elif decision.step == "resume":
                client.resume(name)
                forget_own_drain(state_dir)
    except SlurmError as exc:
        decision = Decision("unknown", name, f"Slurm step UNKNOWN: {exc}")
    except OSError as exc:
        decision = Decision("unknown", name, f"Slurm step UNKNOWN: cannot record gpumon's drain: {exc}")
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


def _drain(
    client: Scontrol,
    me: NodeState,
    decision: Decision,
    config: SlurmConfig,
    state_dir: Path,
    own: OwnDrain | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Decision:
    """Issue the drain (recorded first, so a drain gpumon issued is always known as its own). A new
    drain is then checked against the breaker (``_verify``); an updated reason keeps its standing."""
    reason = str(decision.reason)
    verified = own is not None and own.verified
    save_own_drain(state_dir, OwnDrain(node=me.name, reason=reason, time_seconds=None, verified=verified))
    issued = clock()
    client.drain(me.name, reason)
    after = _find(client.nodes(), me.name)
    if after is None or not after.drained or after.reason != reason:
        return decision  # changed by someone else at once: the record no longer matches, left to them
    save_own_drain(
        state_dir, OwnDrain(node=me.name, reason=reason, time_seconds=after.reason_time_seconds, verified=verified)
    )
    if verified:
        return decision
    at = after.reason_time_seconds if after.reason_time_seconds is not None else math.floor(issued)
    return _verify(client, me.name, reason, at, decision, config, state_dir, clock, sleep)


def _verify(
    client: Scontrol,
    name: str,
    reason: str,
    drained_at_seconds: float,
    decision: Decision,
    config: SlurmConfig,
    state_dir: Path,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> Decision:
    """Once the controller's clock passed the drain's second, may the drain stay (``keeps_drain``)?
    Undone when not. Until this completed the record says unverified, and the next run completes it
    (a controller that stops answering half way leaves no unchecked drain behind)."""
    wait = drained_at_seconds + 1 + CLOCK_SKEW_SECONDS - clock()
    if wait > 0:
        sleep(wait)
    nodes = client.nodes()
    mine = _find(nodes, name)
    if mine is None or not mine.drained or mine.reason != reason:
        return decision
    keep, why = keeps_drain(mine, nodes, config)
    if keep:
        save_own_drain(
            state_dir, OwnDrain(node=name, reason=reason, time_seconds=mine.reason_time_seconds, verified=True)
        )
        return decision
    client.resume(name)
    forget_own_drain(state_dir)
    return Decision(
        "refused",
        name,
        f"circuit breaker: drained, then undone: {why} (allowed: the earliest drains by drain time, then node name); "
        f"NOT draining {name} although: {reason.removeprefix(config.reason_prefix).strip()}",
        reason,
    )


def _find(nodes: Sequence[NodeState], name: str) -> NodeState | None:
    return next((n for n in nodes if n.name == name), None)
