"""The alert engine: rules applied to snapshots and XID events, with Prometheus' semantics.

An alert is one rule on one target (a GPU, a GPU's NVLink, a GPU's XID code, or the host).
Its life: inactive -> pending (condition holds, ``for`` not yet over) -> firing -> resolved
(condition no longer holds, after ``keep_firing_for`` / ``clear_threshold`` hysteresis).
A pending alert whose condition stops holding goes back to inactive without ever firing.
XID alerts fire at once and resolve ``hold`` after the last repeat. Finding alerts follow the
health findings the caller passes to ``on_findings``.

The engine is pure: it never sleeps, reads no clock and does no I/O. Callers pass ``now``
(Unix seconds) to every call; tests drive it with fake snapshots and fake times. It is not
thread-safe: AlertService serialises calls.

What each snapshot rule kind observes is ``snapshot_observer``'s; one alert's state, the Alert
it shows and its spool form are ``alert_state``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpumon.alerts.alert import Alert, AlertChange, AlertCount, Target
from gpumon.alerts.alert_state import AlertState, severity_of, state_from_json, state_json, to_alert
from gpumon.alerts.observation import Observation, finding_observations, xid_matches
from gpumon.alerts.quiet_gpus import PER_GPU_KINDS, QuietGpus
from gpumon.alerts.rule_config import normalize_action
from gpumon.alerts.rules import Rule
from gpumon.alerts.snapshot_observer import SnapshotObserver
from gpumon.model.findings import Finding
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid import XidEvent
from gpumon.state.burn_marker import BurnHoldBack

_NO_RULES: frozenset[str] = frozenset()
"""The rules with an open alert when none is open (most polls): no set made for it."""


class AlertEngine:
    """Applies rules to snapshots and XID events; keeps one state per rule and target."""

    def __init__(
        self,
        rules: Sequence[Rule],
        host: str,
        host_label: str = "host",
        xid_action: Callable[[int], str] = lambda code: "unknown",
        started_at: float = 0.0,
        pass_over_quiet: bool = True,
    ) -> None:
        """``pass_over_quiet``: a rule passes over the GPUs where it observed nothing last time and reads
        the same values now (``quiet_gpus``), and the host rules over a snapshot with nothing to start,
        keep or resolve; False: every rule observes every GPU at every snapshot (what the first must equal)."""
        self._rules: dict[str, Rule] = {}
        self.host = host
        self.host_label = host_label
        self._xid_action = xid_action
        self._active: dict[tuple[str, Target], AlertState] = {}
        self._observer = SnapshotObserver(started_at)
        """What the snapshot rules see, and what it remembers of the GPUs (ECC baselines, links seen up)."""
        self._quiet = QuietGpus() if pass_over_quiet else None
        self._burn: BurnHoldBack | None = None
        self._revision = 0
        """Bumped whenever an alert state changes (the observer counts its own memory's changes)."""
        self.set_rules(rules)

    # ---- configuration ---------------------------------------------------
    @property
    def revision(self) -> int:
        """Changes whenever durable state changes (what the spool must save)."""
        return self._revision + self._observer.revision

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(self._rules.values())

    def set_rules(self, rules: Sequence[Rule], now: float | None = None) -> list[AlertChange]:
        """Replace the rules (SIGHUP). Alerts of rules that still exist keep their state;
        those of removed rules resolve (firing) or vanish (pending)."""
        old, self._rules = self._rules, {r.name: r for r in rules}
        if self._quiet is not None:
            self._quiet.set_rules(self._rules.values())
        changes: list[AlertChange] = []
        for key, st in list(self._active.items()):
            if st.rule not in self._rules:
                when = now if now is not None else st.last_true_at
                changes.append(self._close(key, st, when, rule=old.get(st.rule)))
        return changes

    # ---- evaluation ------------------------------------------------------
    def evaluate(
        self, snapshot: Snapshot, now: float, burn: BurnHoldBack | None = None, taken_at: float | None = None
    ) -> list[AlertChange]:
        """Apply every snapshot rule to ``snapshot`` at time ``now``; expire XID alerts. ``taken_at``: when
        the snapshot was taken on the engine's clock (None: its ``timestamp_seconds``), what its age counts from."""
        self._observer.last_snapshot_at = snapshot.timestamp_seconds if taken_at is None else taken_at
        self._burn = burn
        changes: list[AlertChange] = []
        active = self._active
        open_rules = {st.rule for st in active.values()} if active else _NO_RULES
        quiet = self._quiet.begin(snapshot.gpus) if self._quiet is not None else set()
        for rule in self._rules.values():
            if rule.kind in ("xid", "finding"):
                continue
            is_open = rule.name in open_rules
            if rule.name in quiet:
                observations = []  # observed nothing last time, reads the same values now: most rules, most polls
            elif self._quiet is None:
                observations = self._observer.observe(rule, snapshot, now, self._active)
            else:
                observations = self._observe_changed(rule, snapshot, now, is_open)
            if observations or is_open:  # else nothing to start, keep or resolve (most polls)
                changes.extend(self._apply(rule, observations, now))
        if active:  # both go over the open alerts alone: none, most polls of a healthy host
            changes.extend(self._expire_xids(now))
            self._update_held_back()
        return changes

    def _observe_changed(self, rule: Rule, snapshot: Snapshot, now: float, is_open: bool) -> list[Observation]:
        """What ``rule`` observes of ``snapshot`` that can start, keep or resolve an alert (``is_open``: one of
        the rule's is pending or firing): the same alerts as observing everything (``observe``)."""
        assert self._quiet is not None
        observer, active = self._observer, self._active
        if rule.kind in PER_GPU_KINDS:
            return self._quiet.observe(rule, lambda gpu: observer.observe_gpu(rule, gpu, active, is_open))
        if is_open:
            return observer.observe(rule, snapshot, now, active)
        if rule.kind == "nvml_down" and snapshot.nvml_up:
            return []  # NVML up, no alert of the rule open: the observation would start nothing
        if rule.kind == "stale_snapshot" and not (rule.threshold is not None and observer.age(now) > rule.threshold):
            return []  # fresh, no alert of the rule open: likewise
        return observer.observe(rule, snapshot, now, active)

    @property
    def has_open_alerts(self) -> bool:
        """Whether any alert is pending or firing: the only ones a burn can hold back."""
        return bool(self._active)

    def hold_back(self, burn: BurnHoldBack | None) -> None:
        """Take ``burn`` as the running burn now: each open alert held back or not as it covers its GPU."""
        self._burn = burn
        self._update_held_back()

    def tick(self, now: float, burn: BurnHoldBack | None = None) -> list[AlertChange]:
        """Timer work between polls: the stale-snapshot rules and XID expiry.

        A hung poll publishes no snapshot, so staleness must be judged here too."""
        self._burn = burn
        changes: list[AlertChange] = []
        for rule in self._rules.values():
            if rule.kind == "stale_snapshot":
                changes.extend(self._apply(rule, [self._observer.stale(rule, now)], now))
        changes.extend(self._expire_xids(now))
        self._update_held_back()
        return changes

    def on_xid(self, event: XidEvent, now: float) -> list[AlertChange]:
        """Fire (or refresh) the XID rules that match ``event``; old events (older than hold) are ignored."""
        action = normalize_action(self._xid_action(event.xid)) or "unknown"
        changes: list[AlertChange] = []
        for rule in self._rules.values():
            if rule.kind != "xid" or not xid_matches(rule, event.xid, action):
                continue
            happened = min(event.timestamp_seconds, now)
            if now - happened >= rule.hold_seconds:
                continue
            target: Target = (
                ("gpu", "" if event.gpu_index is None else str(event.gpu_index)),
                ("uuid", event.uuid or ""),
                ("xid", str(event.xid)),
            )
            key = (rule.name, target)
            context = {"action": action, "pci_bus_id": event.pci_bus_id or "", "detail": event.message or ""}
            st = self._active.get(key)
            if st is None:
                st = AlertState(rule.name, target, "firing", active_since=happened, fired_at=happened)
                self._active[key] = st
                previous = "inactive"
            else:
                previous = ""
            self._revision += 1
            st.count += 1
            st.value = float(st.count)
            st.last_event_at = max(st.last_event_at, happened)
            st.last_true_at = now
            st.context = context
            if previous:
                changes.append(AlertChange(self._alert(key, st), previous))
        self._update_held_back()
        return changes

    def on_findings(self, findings: Sequence[Finding], now: float) -> list[AlertChange]:
        """Apply the finding rules to the health findings present at ``now`` (all of them, every call)."""
        changes: list[AlertChange] = []
        for rule in self._rules.values():
            if rule.kind == "finding":
                changes.extend(self._apply(rule, finding_observations(rule, findings), now))
        self._update_held_back()
        return changes

    # ---- reading -----------------------------------------------------------
    def alerts(self) -> list[Alert]:
        """Every pending and firing alert, firing first, then by name and GPU."""
        out = [self._alert(key, st) for key, st in self._active.items() if st.rule in self._rules]
        return sorted(out, key=lambda a: (a.state != "firing", a.alertname, a.gpu, sorted(a.labels.items())))

    def counts(self) -> dict[AlertCount, int]:
        """How many pending, firing and held-back alerts there are per name, severity, state and GPU.

        What ``alerts()`` gives, counted, without making an Alert (annotations, fingerprint) of each:
        gpumon_alerts asks on every scrape (300 alerts of 256 simulated GPUs took 11 ms that way)."""
        out: dict[AlertCount, int] = {}
        for st in self._active.values():
            rule = self._rules.get(st.rule)
            if rule is None:
                continue
            severity = severity_of(st, rule)
            target = dict(st.target)  # gpu and uuid: rules cannot set them (rule_config)
            key = AlertCount(
                st.rule, severity, st.state, target.get("gpu", ""), target.get("uuid", ""), bool(st.held_back)
            )
            out[key] = out.get(key, 0) + 1
        return out

    def notifiable(self) -> list[Alert]:
        """The firing alerts a burn does not hold back, in ``alerts()`` order: what receivers are told of.

        Built every poll, so pending and held-back alerts are passed over before their Alert is made."""
        out = [
            self._alert(key, st)
            for key, st in self._active.items()
            if st.state == "firing" and st.held_back is None and st.rule in self._rules
        ]
        return sorted(out, key=lambda a: (a.alertname, a.gpu, sorted(a.labels.items())))

    # ---- persistence (the spool) ------------------------------------------------
    def export_state(self) -> dict[str, Any]:
        """Everything needed to continue after a restart, as JSON-ready data."""
        return {"active": [state_json(st) for st in self._active.values()], **self._observer.export_state()}

    def restore_state(self, data: Mapping[str, Any]) -> int:
        """Continue from ``export_state`` output: firing alerts keep their startsAt. Returns how many
        saved alerts were dropped as damaged (a field missing, a time that is NaN or Infinity).
        Raises TypeError or ValueError, having changed nothing, for a section not of that shape."""
        items = data.get("active", [])
        if not isinstance(items, list):
            raise TypeError(f"'active' is {type(items).__name__}, not a list")
        dropped = 0
        restored: dict[tuple[str, Target], AlertState] = {}
        for item in items:
            st = state_from_json(item)
            if st is None:
                dropped += 1
                continue
            if st.rule in self._rules and st.state in ("pending", "firing"):
                restored[(st.rule, st.target)] = st
        self._observer.restore_state(data)
        self._active.update(restored)
        if self._quiet is not None:
            self._quiet.forget()
        return dropped

    # ---- internals ---------------------------------------------------------
    def _apply(self, rule: Rule, observations: Iterable[Observation], now: float) -> list[AlertChange]:
        changes: list[AlertChange] = []
        seen: set[tuple[str, Target]] = set()
        for obs in observations:
            key = (rule.name, obs.target)
            seen.add(key)
            st = self._active.get(key)
            holds = obs.keep if st is not None and st.state == "firing" else obs.fire
            if holds:
                if st is None:
                    st = AlertState(rule=rule.name, target=obs.target, state="pending", active_since=now)
                    self._active[key] = st
                    previous = "inactive"
                else:
                    previous = st.state
                st.last_true_at = now
                st.value = obs.value
                st.context = dict(obs.context)
                if st.state == "pending" and now - st.active_since >= rule.for_seconds:
                    st.state = "firing"
                    st.fired_at = now
                if st.state != previous:
                    self._revision += 1
                    changes.append(AlertChange(self._alert(key, st), previous))
            elif st is not None:
                st.value = obs.value
                changes.extend(self._falsify(rule, key, st, now))
        for key, st in list(self._active.items()):
            if st.rule == rule.name and key not in seen:
                changes.extend(self._falsify(rule, key, st, now))
        return changes

    def _falsify(self, rule: Rule, key: tuple[str, Target], st: AlertState, now: float) -> list[AlertChange]:
        if st.state == "firing" and now - st.last_true_at < rule.keep_firing_for_seconds:
            return []
        return [self._close(key, st, now, rule)]

    def _close(self, key: tuple[str, Target], st: AlertState, now: float, rule: Rule | None) -> AlertChange:
        del self._active[key]
        self._revision += 1
        previous = st.state
        st.state = "resolved" if previous == "firing" else "inactive"
        return AlertChange(self._alert(key, st, rule=rule, ended_at=now), previous)

    def _expire_xids(self, now: float) -> list[AlertChange]:
        changes = []
        for key, st in list(self._active.items()):
            rule = self._rules.get(st.rule)
            if rule is not None and rule.kind == "xid" and now >= st.last_event_at + rule.hold_seconds:
                changes.append(self._close(key, st, now, rule))
        return changes

    def _update_held_back(self) -> None:
        for st in self._active.values():
            rule = self._rules.get(st.rule)
            target = dict(st.target)
            covered = (
                self._burn is not None
                and rule is not None
                and rule.burn_hold_back
                and self._burn.covers(target.get("gpu", ""), target.get("uuid", ""))
            )
            st.held_back = self._burn.note() if covered and self._burn is not None else None

    def _alert(
        self, key: tuple[str, Target], st: AlertState, rule: Rule | None = None, ended_at: float | None = None
    ) -> Alert:
        return to_alert(st, rule or self._rules.get(st.rule), self.host, self.host_label, ended_at)
