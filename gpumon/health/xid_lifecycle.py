"""XIDs with a lifecycle: a fatal XID keeps its GPU in "needs reset" / "needs reboot" until repaired.

Pure and clock-free: events, snapshots, boot ids and operator clears come in; findings go out.

* A fatal XID (the catalog's action resets, reboots, inspects or replaces) opens a *fault* on
  its GPU. The fault stays until there is evidence of recovery:

  ==================  ===========================================================
  lifecycle           resolved by
  ==================  ===========================================================
  needs_reset         a GPU reset (the GPU was lost and came back, or its energy
                      counter restarted: reset or driver reload), a driver version
                      change, a reboot (boot id changed), or an operator clear
  needs_reboot        a reboot (boot id changed), or an operator clear
  needs_inspection    an operator clear only (hardware is checked by people)
  needs_replacement   an operator clear only
  ==================  ===========================================================

* Escalation: ``count`` of one code on one GPU within ``window_seconds`` raise the action
  (catalog ``escalate``, overridable per code in ``health.xid_escalation``).
* Relations: an XID whose catalog entry ``follows`` other codes defers to one of them seen on
  the same GPU within ``defer_window_seconds`` before it (it is added to that fault's evidence,
  not counted on its own). XID 45 (``follow_other_xid``) alone is cleanup, not a fault.
* Non-fatal XIDs (restart the job, investigate) are WARNING findings for
  ``transient_window_seconds`` after the last one.
* The same event seen twice (event thread and kernel log, or a re-read of the log) counts once: a
  kernel-log record is named by the boot id and the kernel's own time of the record
  (``XidEvent.identity``), not by when it was read, so a restart that reads the log again, with
  any clock drift, finds it already seen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpumon.health.clears import Clear
from gpumon.health.wording import short_meaning
from gpumon.health.xid_fault_finding import fault_finding
from gpumon.health.xid_recent import PER_CODE, RecentXids, events_of
from gpumon.health.xid_state_checks import entries, finite_number, valid_clear, valid_fault, valid_recent
from gpumon.model.findings import ACTIONS, LIFECYCLE_OF_ACTION, WARNING, Finding, ladder_action
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid import XidEvent
from gpumon.model.xid74 import Xid74, decode_xid74
from gpumon.model.xid_catalog import Escalation, XidCatalog, XidInfo

_MAX_SEEN = 4000
LEGACY_MATCH_SECONDS = 10.0
"""How far apart an XID recorded by a gpumon without identities and its kernel record read again may be
stamped (read time live, boot time + kernel time at start) and still be one."""
_MAX_RESOLVED = 200
_MAX_HISTORY = 200


@dataclass(frozen=True)
class XidPolicy:
    """Knobs of the lifecycle (config ``health:``)."""

    escalations: Mapping[int, Escalation] = field(default_factory=dict)
    """Per-code overrides of the catalog's ``escalate``."""
    defer_window_seconds: float = 60.0
    transient_window_seconds: float = 3600.0


class XidLifecycle:
    """Open XID faults per GPU, their recovery and escalation. Not thread-safe: the owner locks."""

    def __init__(self, catalog: XidCatalog, policy: XidPolicy | None = None) -> None:
        self.catalog = catalog
        self.policy = policy or XidPolicy()
        self.boot_id: str | None = None
        self.driver_version: str | None = None
        self.faults: list[dict[str, Any]] = []
        self.resolved: list[dict[str, Any]] = []
        self.recent = RecentXids(per_code=self._per_code())
        """Every counted event within the defer / transient / escalation windows: {gpu, uuid, xid, ts}, a storm's
        repeats folded (gpumon.health.xid_recent)."""
        self.seen: dict[str, None] = {}
        """The identities of the events taken in (the newest _MAX_SEEN, oldest first): each counts once."""
        self.clears_applied: list[dict[str, Any]] = []
        self._last_up: dict[str, bool] = {}
        self._energy: dict[str, float] = {}
        self._longest_seconds = max(  # the longest window a recent XID counts in (transient, defer, escalations)
            [self.policy.transient_window_seconds, self.policy.defer_window_seconds]
            + [e.window_seconds for e in self.policy.escalations.values()]
            + [i.escalate.window_seconds for i in self.catalog.entries.values() if i.escalate]
        )
        self.changed = False
        self.urgent = False
        """Something the findings show changed since the last save (a fault opened or its action rose, a GPU's
        first XID of a code): the owner writes at once. Repeats of a known fault only set ``changed``."""

    def _per_code(self) -> int:
        """Recent entries kept per GPU and code: enough for every escalation's count."""
        counts = [e.count for e in self.policy.escalations.values()]
        counts += [i.escalate.count for i in self.catalog.entries.values() if i.escalate]
        return max([PER_CODE, *counts])

    # ---- persistence -------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "boot_id": self.boot_id,
            "driver_version": self.driver_version,
            "faults": self.faults,
            "resolved": self.resolved[-_MAX_RESOLVED:],
            "recent": self.recent.entries,
            "seen": list(self.seen),
            "clears_applied": self.clears_applied[-_MAX_RESOLVED:],
            "energy_joules": self._energy,
        }

    def load(self, raw: Any) -> None:
        """Restore from ``to_json`` output (None: nothing saved yet). Raises ValueError, saying what is
        wrong, for anything else: the wrong version, a missing key or a value of the wrong type anywhere
        (a file this gpumon did not write), and then changes nothing."""
        if raw is None:
            return
        if not isinstance(raw, dict) or raw.get("version") != 1:
            raise ValueError("not an XID state of this gpumon (version 1)")
        faults = entries(raw, "faults", valid_fault)
        resolved = entries(raw, "resolved", lambda e: True)
        recent = entries(raw, "recent", valid_recent)
        clears = entries(raw, "clears_applied", valid_clear)
        seen = raw.get("seen") or []
        energy = raw.get("energy_joules") or {}
        if not isinstance(seen, list) or not all(isinstance(k, str) for k in seen):
            raise ValueError("seen: not a list of strings")
        if not isinstance(energy, dict) or not all(finite_number(v) for v in energy.values()):
            raise ValueError("energy_joules: not a mapping of numbers")
        for key in ("boot_id", "driver_version"):
            if not isinstance(raw.get(key), (str, type(None))):
                raise ValueError(f"{key}: not a string")
        self.boot_id = raw.get("boot_id")
        self.driver_version = raw.get("driver_version")
        self.faults, self.resolved, self.clears_applied = faults, resolved, clears
        self.recent.replace(recent)
        self.seen = dict.fromkeys(seen[-_MAX_SEEN:])
        self._energy = {str(k): float(v) for k, v in energy.items()}

    # ---- inputs ------------------------------------------------------------
    def record(self, event: XidEvent, boot_id: str | None = None) -> None:
        """One XID event (GPU index known, or it is ignored: an XID on no known GPU is the tracker's to log).

        ``boot_id``: this boot's (names a kernel-log record with its kernel time: ``XidEvent.identity``),
        so the same record read again, after a restart or from the other source, counts once."""
        if event.gpu_index is None:
            return
        key = event.identity(boot_id)
        if key in self.seen:
            return
        if any(c["gpu"] == event.gpu_index and event.timestamp_seconds <= c["at_seconds"] for c in self.clears_applied):
            return  # from before an operator clear (e.g. the kernel log read again)
        self._remember(key)
        if event.kernel_usec is not None and self.recent.match_legacy(
            event.gpu_index, event.xid, event.timestamp_seconds, LEGACY_MATCH_SECONDS
        ):
            return  # recorded by a gpumon before identities (matched once each: the log read again after an upgrade)
        gpu, ts, code = event.gpu_index, event.timestamp_seconds, event.xid
        info = self.catalog.lookup(code)
        nvlink = decode_xid74(event.message) if code == 74 else None
        if nvlink is not None:  # the NVLink problem the registers name decides the action (gpumon.model.xid74)
            info = dataclasses.replace(info, action=nvlink.action)
        predecessor = (
            None if info.follows == () else self.recent.predecessor(gpu, code, ts, info.follows, self._defer_window)
        )
        entry = {"gpu": gpu, "uuid": event.uuid, "xid": code, "ts": ts, "deferred": predecessor is not None, "id": key}
        first = self.recent.add({**entry, "ignored": True} if info.action == "ignore" and nvlink else entry)
        if first and predecessor is None and info.severity != "info":
            self.urgent = True  # a new WARNING at least
        if info.resolves:
            self._cancel(gpu, info, ts)
        if predecessor is not None:
            self._add_follower(gpu, predecessor, code)
            return
        if info.action == "follow_other_xid":
            return  # cleanup after an error that is no longer in view: not a fault by itself
        self._count_fault(event, gpu, info, nvlink)

    def _add_follower(self, gpu: int, predecessor: int, code: int) -> None:
        """``code`` deferred to ``predecessor``: named in that fault's evidence (``followed_by``), not counted."""
        for open_fault in self.faults:
            if open_fault["gpu"] == gpu and open_fault["xid"] == predecessor:
                open_fault.setdefault("followed_by", [])
                if code not in open_fault["followed_by"]:
                    open_fault["followed_by"].append(code)

    def _cancel(self, gpu: int, info: XidInfo, ts: float) -> None:
        """``info``'s XID came on ``gpu`` at ``ts``: what the codes it ``resolves`` asked for before is void (their
        open fault resolved, their recent XIDs no longer shown), e.g. 162 (PSHC re-engaged) after 163's reset."""
        how = f"resolved by XID {info.code} ({short_meaning(info.meaning)})"
        self._resolve(lambda f: f["gpu"] == gpu and f["xid"] in info.resolves and f["first_seconds"] <= ts, how, at=ts)
        for e in self.recent:
            if e["gpu"] == gpu and e["xid"] in info.resolves and e["ts"] <= ts and not e.get("resolved"):
                e["resolved"] = True
                self.changed = self.urgent = True

    def _count_fault(self, event: XidEvent, gpu: int, info: XidInfo, nvlink: Xid74 | None = None) -> None:
        """A counted XID of ``gpu``: its action on the ladder (escalated when the catalog or the config says so)
        opens or adds to the GPU's fault of that code; a transient one opens none (shown while recent)."""
        ts, code = event.timestamp_seconds, event.xid
        action = ladder_action(info.action)
        escalation = self.policy.escalations.get(code, info.escalate)
        count = self.recent.count(gpu, code, ts, escalation.window_seconds) if escalation is not None else 0
        escalated = escalation is not None and count >= escalation.count
        if escalated and escalation is not None and ACTIONS.index(escalation.action) > ACTIONS.index(action):
            action = escalation.action
        if action not in LIFECYCLE_OF_ACTION:
            return  # transient: shown as a warning while recent
        fault: dict[str, Any] | None = next((f for f in self.faults if f["gpu"] == gpu and f["xid"] == code), None)
        if fault is None:
            fault = {
                "gpu": gpu,
                "uuid": event.uuid,
                "xid": code,
                "meaning": short_meaning(info.meaning),
                "first_seconds": ts,
                "count": 0,
                "boot_id": self.boot_id,
                "energy_joules": self._energy.get(str(gpu)),
                "source": event.source,
            }
            self.faults.append(fault)
            self.urgent = True
        fault["count"] += 1
        fault["last_seconds"] = max(ts, fault.get("last_seconds", ts))
        if ACTIONS.index(action) >= ACTIONS.index(fault.get("action", "none")):
            self.urgent = self.urgent or action != fault.get("action")
            fault["action"] = action
            if nvlink is not None:
                fault["nvlink"] = {"class": nvlink.kind, "link": nvlink.link, "registers": list(nvlink.registers)}
            fault["lifecycle"] = LIFECYCLE_OF_ACTION[action]
        if escalated and escalation is not None:
            self.urgent = self.urgent or "escalated" not in fault
            fault["escalated"] = {
                "count": count,
                "window_seconds": escalation.window_seconds,
                "action": escalation.action,
            }

    def note_seen(self, event: XidEvent, boot_id: str | None = None) -> None:
        """``event`` is the other source's copy of an XID already recorded: its identity is seen too (so the
        kernel-log record of an XID that NVML reported first is not counted when the log is read again)."""
        key = event.identity(boot_id)
        if key not in self.seen:
            self._remember(key)

    def observe(self, snapshot: Snapshot, boot_id: str | None) -> None:
        """Look for evidence of recovery in a snapshot and the host's boot id."""
        if boot_id is not None and boot_id != self.boot_id:
            if self.boot_id is not None:
                self._resolve(
                    lambda f: f["lifecycle"] in ("needs_reset", "needs_reboot"), "node rebooted (boot id changed)"
                )
            self.boot_id = boot_id
            self.changed = True
        driver = snapshot.host.driver_version if snapshot.nvml_up else None
        if driver is not None:
            if self.driver_version is not None and driver != self.driver_version:
                self._resolve(
                    lambda f: f["lifecycle"] == "needs_reset",
                    f"driver reloaded ({self.driver_version} -> {driver})",
                )
            if driver != self.driver_version:
                self.driver_version = driver
                self.changed = True
        for g in snapshot.gpus:
            key = str(g.index)
            was_up = self._last_up.get(key)
            self._last_up[key] = g.up
            if g.up and was_up is False and self.faults:  # no open fault: nothing to resolve (most polls)
                self._resolve(
                    lambda f, i=g.index: f["gpu"] == i and f["lifecycle"] == "needs_reset",
                    "GPU reset (it was lost and came back)",
                )
            energy = g.energy_joules_total if g.up else None
            if energy is not None and self.faults:
                self._resolve(
                    lambda f, i=g.index, e=energy: (
                        f["gpu"] == i
                        and f["lifecycle"] == "needs_reset"
                        and f.get("energy_joules") is not None
                        and e < float(f["energy_joules"]) - 1.0
                    ),
                    "GPU reset or driver reload (its energy counter restarted)",
                )
            if energy is not None:
                self._energy[key] = energy

    def apply_clears(self, clears: Sequence[Clear]) -> None:
        """Operator clears: every fault (and recent XID) of that GPU from before the clear is resolved."""
        done = {(c["gpu"], c["at_seconds"]) for c in self.clears_applied}
        for clear in clears:
            if (clear.gpu, clear.at_seconds) in done:
                continue
            self.clears_applied.append(clear.to_json())

            cleared = [f for f in self.faults if f["gpu"] == clear.gpu and f["first_seconds"] <= clear.at_seconds]
            self._resolve(
                lambda f, c=cleared: any(f is x for x in c),
                f"cleared by operator{' ' + clear.user if clear.user else ''}: {clear.reason}",
                at=clear.at_seconds,
            )
            self.recent.replace([e for e in self.recent if not (e["gpu"] == clear.gpu and e["ts"] <= clear.at_seconds)])
            for fault in cleared:
                self._reopen_after(fault, clear.at_seconds)
            self.changed = self.urgent = True

    def _reopen_after(self, fault: dict[str, Any], clear_seconds: float) -> None:
        """A cleared fault whose XID came again after the clear (recorded before the clear was read: the
        daemon reads clears at its next report) is a fault again, made of those XIDs alone: they are counted
        anew, escalation included, as if the clear had been read before they came."""
        if fault.get("last_seconds", fault["first_seconds"]) <= clear_seconds:
            return
        info = self.catalog.lookup(fault["xid"])
        again = sorted(
            (e for e in self.recent if e["gpu"] == fault["gpu"] and e["xid"] == fault["xid"] and not e["deferred"]),
            key=lambda e: float(e["ts"]),
        )
        for e in again:
            e.pop("resolved", None)  # shown again, as the open fault's
            event = XidEvent(e["xid"], e["ts"], str(fault.get("source", "nvml")), e["gpu"], e.get("uuid"))
            self._count_fault(event, e["gpu"], info)
        for reopened in self.faults:
            if reopened["gpu"] == fault["gpu"] and reopened["xid"] == fault["xid"]:
                reopened["count"] = sum(events_of(e) for e in again)
                if "nvlink" in fault:  # XID 74's decoded registers are the fault's, not the catalog's
                    reopened.setdefault("nvlink", fault["nvlink"])

    # ---- outputs -----------------------------------------------------------
    def findings(self, now_seconds: float) -> list[Finding]:
        """Open faults (CRITICAL) and recent non-fatal XIDs (WARNING); none without either (most reports)."""
        if not self.faults and not self.recent.entries:
            return []
        self._prune(now_seconds)
        out: list[Finding] = [fault_finding(f) for f in self.faults]
        faulted = {(f["gpu"], f["xid"]) for f in self.faults}
        transient: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for e in self.recent:
            if e.get("deferred") or e.get("resolved") or e.get("ignored") or (e["gpu"], e["xid"]) in faulted:
                continue
            if now_seconds - e["ts"] > self.policy.transient_window_seconds:
                continue
            info = self.catalog.lookup(e["xid"])
            if info.severity == "info" or info.action == "follow_other_xid":
                continue
            transient.setdefault((e["gpu"], e["xid"]), []).append(e)
        for (gpu, code), events in sorted(transient.items()):
            info = self.catalog.lookup(code)
            times = sum(events_of(e) for e in events)
            out.append(
                Finding(
                    kind="xid",
                    severity=WARNING,
                    action=ladder_action(info.action),
                    summary=f"xid {code} {short_meaning(info.meaning)}" + (f" ({times} times)" if times > 1 else ""),
                    gpu=gpu,
                    uuid=events[-1].get("uuid"),
                    evidence={"xid": code, "count": times, "last_seconds": events[-1]["ts"]},
                )
            )
        return out

    # ---- helpers -----------------------------------------------------------
    @property
    def _defer_window(self) -> float:
        return self.policy.defer_window_seconds

    def _remember(self, key: str) -> None:
        """``key`` is seen: kept among the newest _MAX_SEEN identities."""
        self.seen[key] = None
        while len(self.seen) > _MAX_SEEN:
            del self.seen[next(iter(self.seen))]
        self.changed = True

    def _resolve(self, match: Any, how: str, at: float | None = None) -> None:
        keep = []
        for f in self.faults:
            if match(f):
                self.urgent = True
                self.resolved.append({**f, "resolved_by": how, **({"resolved_seconds": at} if at else {})})
                for e in self.recent:  # still counted for escalation, no longer shown
                    if e["gpu"] == f["gpu"] and e["xid"] == f["xid"]:
                        e["resolved"] = True
                self.changed = True
            else:
                keep.append(f)
        self.faults = keep
        del self.resolved[:-_MAX_RESOLVED]

    def _prune(self, now_seconds: float) -> None:
        kept = [e for e in self.recent if now_seconds - e["ts"] <= self._longest_seconds][-_MAX_HISTORY * 10 :]
        if len(kept) != len(self.recent.entries):
            self.recent.replace(kept)
            self.changed = True
