"""What the snapshot rules see: one observation per target for each rule kind, and the memory behind them.

A snapshot rule (every kind but ``xid`` and ``finding``) observes each GPU of a snapshot (or the
host). Most polls nothing crosses and no alert is open, so a GPU is observed only when it starts,
keeps or resolves an alert (``active``: the engine's open alerts by rule name and target).

Some kinds remember GPUs between snapshots: the uncorrected ECC count first seen (only growth
counts) and the NVLinks seen up at least once (a link never up is not "down"). That memory is
saved in the spool with the engine's states; ``revision`` says when it changed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from gpumon.alerts.alert import Target
from gpumon.alerts.observation import Observation, gpu_context, gpu_target
from gpumon.alerts.rules import OPS, Rule, field_reader, format_value
from gpumon.model.snapshot import GpuSnapshot, Snapshot

GIB = 1024**3

Active = Collection[tuple[str, Target]]
"""The open (pending or firing) alerts, as (rule name, target)."""


class SnapshotObserver:
    """Observations of the snapshot rules, per kind; remembers ECC baselines, links seen up, the last snapshot."""

    def __init__(self, started_at: float) -> None:
        """``started_at``: when gpumon started (seconds): staleness counts from it until the first snapshot."""
        self.ecc_baseline: dict[str, int] = {}
        """uuid -> aggregate uncorrected ECC count when gpumon first saw the GPU."""
        self.links_seen_up: dict[str, set[str]] = {}
        """uuid -> NVLink indices seen up at least once."""
        self.last_snapshot_at: float | None = None
        self.revision = 0
        """Bumped whenever the memory the spool must save changes (an ECC baseline, a link seen up)."""
        self._started_at = started_at
        self._readers: dict[str, Callable[[GpuSnapshot], float | None]] = {}
        """Threshold fields' readers by field name (``field_reader``), made on first use."""

    # ---- persistence (the spool) ------------------------------------------------
    def export_state(self) -> dict[str, Any]:
        """The memory as JSON-ready data: ecc_baseline, links_seen_up, last_snapshot_at."""
        return {
            "ecc_baseline": dict(self.ecc_baseline),
            "links_seen_up": {uuid: sorted(links) for uuid, links in self.links_seen_up.items()},
            "last_snapshot_at": self.last_snapshot_at,
        }

    def restore_state(self, data: Mapping[str, Any]) -> None:
        """Continue from ``export_state`` output (a missing key leaves its part as it is); raises
        TypeError or ValueError, having changed nothing, for a part not of that shape."""
        baseline = {str(k): int(v) for k, v in dict(data.get("ecc_baseline") or {}).items()}
        links_seen = {
            str(uuid): {str(x) for x in links} for uuid, links in dict(data.get("links_seen_up") or {}).items()
        }
        self.ecc_baseline.update(baseline)  # all read first: a part not of that shape changes nothing
        for uuid, links in links_seen.items():
            self.links_seen_up.setdefault(uuid, set()).update(links)
        last = data.get("last_snapshot_at")
        if isinstance(last, (int, float)):
            self.last_snapshot_at = float(last)

    # ---- observations per rule kind -------------------------------------------
    def observe(self, rule: Rule, snapshot: Snapshot, now: float, active: Active) -> list[Observation]:
        """What snapshot ``rule`` sees in ``snapshot`` at ``now`` (seconds), every GPU observed."""
        if rule.kind == "nvml_down":
            return [self.nvml(snapshot)]
        if rule.kind == "stale_snapshot":
            return [self.stale(rule, now)]
        watching = any(key[0] == rule.name for key in active)
        out: list[Observation] = []
        for gpu in snapshot.gpus:
            out.extend(self.observe_gpu(rule, gpu, active, watching))
        return out

    def observe_gpu(self, rule: Rule, gpu: GpuSnapshot, active: Active, watching: bool) -> list[Observation]:
        """What per-GPU ``rule`` sees on ``gpu`` (``watching``: an alert of the rule is open on some GPU).
        Most polls nothing crosses and no alert is open: an empty list."""
        kind = rule.kind
        if kind == "threshold":
            return self._threshold(rule, gpu, active, watching)
        if kind == "ecc_uncorrectable":
            return self._ecc(rule, gpu, active)
        if kind == "nvlink_down":
            return self._nvlink(rule, gpu, active, watching)
        if kind == "pcie_degraded":
            return self._pcie(rule, gpu, active)
        if kind == "idle_with_memory":
            return self._idle(rule, gpu, active)
        return []

    def nvml(self, snapshot: Snapshot) -> Observation:
        """The nvml_down rules' observation of ``snapshot``: fires while NVML cannot be used."""
        down = not snapshot.nvml_up
        return Observation((), None, down, down, {"detail": snapshot.nvml_error or ""})

    def age(self, now: float) -> float:
        """Seconds since the last snapshot (since gpumon started, before the first) at ``now``."""
        last = self.last_snapshot_at if self.last_snapshot_at is not None else self._started_at
        return max(0.0, now - last)

    def stale(self, rule: Rule, now: float) -> Observation:
        """The stale-snapshot ``rule``'s observation at ``now``: the last snapshot's age in seconds."""
        age = self.age(now)
        stale = rule.threshold is not None and age > rule.threshold
        detail = f"last snapshot {format_value(round(age, 1))} s ago" if self.last_snapshot_at else "no snapshot yet"
        return Observation((), round(age, 1), stale, stale, {"detail": detail})

    def _threshold(self, rule: Rule, gpu: GpuSnapshot, active: Active, watching: bool) -> list[Observation]:
        """``gpu``'s observation for threshold ``rule``: its field compared with the threshold."""
        assert rule.field is not None and rule.op is not None and rule.threshold is not None
        up_rule = rule.field == "up"
        if not (gpu.up or up_rule) or (value := self._reader(rule.field)(gpu)) is None:
            return []  # a lost GPU (but for the ``up`` rule) or an unknown value: nothing observed
        fire = OPS[rule.op](value, rule.threshold)
        if not (fire or watching):
            return []  # most polls: nothing to keep or resolve, so only a crossing GPU is observed
        target = gpu_target(gpu)
        if not fire and (rule.name, target) not in active:
            return []  # nothing to start and nothing to keep or resolve
        keep = OPS[rule.op](value, rule.clear_threshold) if rule.clear_threshold is not None else fire
        context = gpu_context(gpu)
        if up_rule and not gpu.up:
            context["detail"] = gpu.lost_reason or "GPU is lost"
        else:
            context["detail"] = f"{rule.field} = {format_value(value, rule.field)}"
        return [Observation(target, value, fire, keep, context)]

    def _reader(self, field_name: str) -> Callable[[GpuSnapshot], float | None]:
        return self._readers.get(field_name) or self._readers.setdefault(field_name, field_reader(field_name))

    def _ecc(self, rule: Rule, gpu: GpuSnapshot, active: Active) -> list[Observation]:
        counts = gpu.ecc_errors_total
        if not gpu.up or counts is None:
            return []
        volatile = counts.get("uncorrected_volatile")
        aggregate = counts.get("uncorrected_aggregate")
        grown = 0
        if aggregate is not None:
            baseline = self.ecc_baseline.get(gpu.uuid)
            if baseline is None or aggregate < baseline:
                self.ecc_baseline[gpu.uuid] = baseline = aggregate
                self.revision += 1
            grown = aggregate - baseline
        if volatile is None and aggregate is None:
            return []
        fire = (volatile or 0) > 0 or grown > 0
        target = gpu_target(gpu)
        if not fire and (rule.name, target) not in active:
            return []  # nothing to start, keep or resolve (the usual case, every poll)
        detail = f"{volatile or 0} uncorrectable ECC errors since the driver loaded, {grown} new in the lifetime count"
        context = {**gpu_context(gpu), "detail": detail}
        return [Observation(target, float(max(volatile or 0, grown)), fire, fire, context)]

    def _nvlink(self, rule: Rule, gpu: GpuSnapshot, active: Active, watching: bool) -> list[Observation]:
        links = gpu.nvlink_up
        if not gpu.up or links is None:
            return []
        seen = self.links_seen_up.setdefault(gpu.uuid, set())
        if all(links.values()) and seen.issuperset(links) and not watching:
            return []  # every link up and known, no alert to resolve (the usual case, every poll)
        out = []
        for link, up in sorted(links.items(), key=lambda kv: (len(kv[0]), kv[0])):
            if up and link not in seen:
                seen.add(link)
                self.revision += 1
            if link not in seen:
                continue
            target = gpu_target(gpu, ("link", link))
            if up and (rule.name, target) not in active:
                continue  # up, and no alert to resolve
            context = {**gpu_context(gpu), "link": link, "detail": f"NVLink {link} {'up' if up else 'down'}"}
            out.append(Observation(target, 1.0 if up else 0.0, not up, not up, context))
        return out

    def _pcie(self, rule: Rule, gpu: GpuSnapshot, active: Active) -> list[Observation]:
        gen, gen_max = gpu.pcie_link_generation, gpu.pcie_link_generation_max
        width, width_max = gpu.pcie_link_width, gpu.pcie_link_width_max
        util = gpu.utilization_ratio
        if not gpu.up or util is None or gen is None or gen_max is None:
            return []
        degraded = gen < gen_max or (width is not None and width_max is not None and width < width_max)
        busy = util >= rule.min_utilization_ratio
        target = gpu_target(gpu)
        if not (busy and degraded) and (rule.name, target) not in active:
            return []  # nothing to start, keep or resolve (the usual case, every poll)
        detail = f"Gen{gen} x{width if width is not None else '?'} of Gen{gen_max} x{width_max if width_max else '?'}"
        context = {**gpu_context(gpu), "detail": detail}
        # Idle GPUs lower their link speed on purpose: judge only under load. Once firing, an idle
        # spell neither clears nor confirms the alert; only a busy GPU at full speed clears it.
        return [Observation(target, float(gen), busy and degraded, degraded or not busy, context)]

    def _idle(self, rule: Rule, gpu: GpuSnapshot, active: Active) -> list[Observation]:
        util = gpu.utilization_ratio
        if not gpu.up or util is None or gpu.processes is None or rule.threshold is None:
            return []
        held = sum(p.used_memory_bytes or 0 for p in gpu.processes)
        holding = bool(gpu.processes) and (held > 0 or gpu.memory_used_bytes is None or gpu.memory_used_bytes > 0)
        fire = util < rule.threshold and holding
        target = gpu_target(gpu)
        if not fire and (rule.name, target) not in active:
            return []  # nothing to start, keep or resolve (the usual case, every poll)
        detail = f"{len(gpu.processes)} process(es) hold {held / GIB:.1f} GiB"
        return [Observation(target, util, fire, fire, {**gpu_context(gpu), "detail": detail})]
