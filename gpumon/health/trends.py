"""Error trends: how much an error counter rose over a window, not only its total.

Pure: fed snapshots, asked for findings and increases at a time the caller gives.
Counters are read as Prometheus reads counters: a value lower than the previous one is a reset
(a driver reload clears the volatile counters) and counts as an increase by the new value, never
as a negative rate. Only changes are kept, so a 24 h window costs a few entries per counter.
The first value seen is the baseline: errors from before gpumon started are not a rate.
NVLink counters are followed per link, each its own counter, and a GPU's increase is the sum of
its links' increases: a link missing from a read (links come and go from NVML's answer) is
neither a reset nor a rise, and one link's reset is that link's alone.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter, is_

from gpumon.health.wording import duration
from gpumon.model.findings import WARNING, Finding
from gpumon.model.snapshot import GpuSnapshot, Snapshot


@dataclass(frozen=True)
class TrendRule:
    """Warn when the counter rose by more than ``max_increase`` within ``window_seconds``."""

    window_seconds: float
    max_increase: float


DEFAULT_RULES: Mapping[str, TrendRule] = {
    "ecc_corrected": TrendRule(3600.0, 100.0),
    "remapped_rows": TrendRule(86400.0, 0.0),
    "retired_pages": TrendRule(86400.0, 0.0),
    "pcie_replays": TrendRule(60.0, 8.0),
    "nvlink_replay": TrendRule(300.0, 100.0),  # the daemon reads NVLink errors every 300 s (NVLINK_ERRORS_SECONDS)
    "nvlink_recovery": TrendRule(3600.0, 0.0),
    "nvlink_crc": TrendRule(300.0, 100.0),
    "xid": TrendRule(3600.0, 2.0),
}
"""Sources: docs/early-signals.md (PCIe: DCGM's health watch; the others are gpumon's choice)."""

WORDS = {
    "ecc_corrected": ("corrected ECC errors", "replace", "plan a replacement, the memory is degrading"),
    "remapped_rows": ("remapped rows", "replace", "plan a replacement, spare rows are being used up"),
    "retired_pages": ("retired pages", "replace", "plan a replacement, memory pages are being retired"),
    "pcie_replays": ("PCIe replays", "inspect_hardware", "check the PCIe slot, riser and cabling"),
    "nvlink_replay": ("NVLink replays", "inspect_hardware", "check the NVLink connection"),
    "nvlink_recovery": ("NVLink recoveries", "inspect_hardware", "check the NVLink connection"),
    "nvlink_crc": ("NVLink CRC errors", "inspect_hardware", "check the NVLink connection"),
    "xid": ("XIDs", "inspect_hardware", "a repeating XID: look at the GPU"),
}


@dataclass(frozen=True)
class TrendsConfig:
    """``health.trends``."""

    enabled: bool = True
    rules: Mapping[str, TrendRule] = field(default_factory=lambda: dict(DEFAULT_RULES))


def _sum(values: Mapping[str, int] | None, keys: tuple[str, ...] | None = None) -> int | None:
    if not values:
        return None
    picked = [v for k, v in values.items() if keys is None or k in keys]
    return sum(picked) if picked else None


def counters_of(gpu: GpuSnapshot) -> Iterator[tuple[str, str, str, int]]:
    """(counter, label, link, raw value) for each error counter the GPU reports; label is the XID
    code, link the NVLink link index (each link's counter is one of its own; "" for the others)."""
    ecc = gpu.ecc_errors_total or {}
    corrected = ecc.get("corrected_volatile", ecc.get("corrected_aggregate"))
    if corrected is not None:
        yield "ecc_corrected", "", "", corrected
    if (rows := _sum(gpu.remapped_rows)) is not None:
        yield "remapped_rows", "", "", rows
    if (pages := _sum(gpu.retired_pages)) is not None:
        yield "retired_pages", "", "", pages
    if gpu.pcie_replays_total is not None:
        yield "pcie_replays", "", "", gpu.pcie_replays_total
    for link, errors in (gpu.nvlink_errors_total or {}).items():
        for kind in ("replay", "recovery", "crc"):
            if kind in errors:
                yield f"nvlink_{kind}", "", str(link), errors[kind]
    for code, count in sorted((gpu.xid_errors_total or {}).items()):
        yield "xid", str(code), "", count


_counter_inputs: Callable[[GpuSnapshot], tuple[object, ...]] = attrgetter(
    "index",
    "ecc_errors_total",
    "remapped_rows",
    "retired_pages",
    "pcie_replays_total",
    "nvlink_errors_total",
    "xid_errors_total",
    "xid_last_timestamp_seconds",
)
"""What ``counters_of`` reads of a GPU, compared by identity (``_same``): a snapshot carries the slow tier's
objects from one slow read to the next and the XID tracker's until an event, so the same objects mean the same
counters. (Pruning a series' old points waits for its next change; no increase depends on it.)"""


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Whether ``a`` and ``b`` (of ``_counter_inputs``) hold the very same objects (gpumon.util.reuse.same_objects,
    compared in C)."""
    return all(map(is_, a, b))


@dataclass(frozen=True)
class Increase:
    """How much one counter of one GPU rose within its rule's window."""

    index: int
    uuid: str
    counter: str
    label: str
    increase: float
    window_seconds: float
    links: Mapping[str, float] = field(default_factory=dict)
    """NVLink counters: each link's increase that is not 0, by link index (they sum to ``increase``)."""


class _Series:
    """Reset-adjusted running total, kept as change points (time, total)."""

    def __init__(self, t: float, raw: int) -> None:
        self.raw = raw
        self.total = 0.0
        self.points: deque[tuple[float, float]] = deque([(t, 0.0)])

    def add(self, t: float, raw: int) -> None:
        step = raw - self.raw if raw >= self.raw else raw  # a drop is a reset: counted from 0
        self.raw = raw
        if step:
            self.total += step
            self.points.append((t, self.total))

    def increase(self, now: float, window: float) -> float:
        return self.increase_until(now, window)[0]

    def increase_until(self, now: float, window: float) -> tuple[float, float, float]:
        """(increase, lo, hi): the increase, and the span of ``now`` over which it stays the same."""
        start = now - window
        before = self.points[0][1]
        lo, hi = -math.inf, math.inf
        for t, total in self.points:
            if t > start:
                hi = t + window
                break
            before = total
            lo = t + window
        return self.total - before, lo, hi

    def prune(self, now: float, keep: float) -> None:
        while len(self.points) > 1 and self.points[1][0] <= now - keep:
            self.points.popleft()


class TrendTracker:
    def __init__(self, config: TrendsConfig, words: Callable[[str], str] | None = None) -> None:
        """``words``: an XID code's description for the summary (the catalog's name)."""
        self.config = config
        self._words = words
        self._series: dict[tuple[str, str, str, str], tuple[int, _Series]] = {}
        """(uuid, counter, label, link) -> (GPU index, the series)."""
        self._longest = max((r.window_seconds for r in config.rules.values()), default=0.0)
        self._first_seen: dict[str, float] = {}
        """When each GPU (uuid) was first observed."""
        self._generation = 0
        """Bumped whenever a series changes; increases() is cached until then."""
        self._cached: tuple[int, float, float, list[Increase]] | None = None
        self._last_inputs: dict[str, tuple[object, ...]] = {}
        """uuid -> what ``counters_of`` read of the GPU last time (``_counter_inputs``)."""
        self._found: tuple[list[Increase], list[Finding]] | None = None
        """The findings of the very increases kept in ``_cached`` (worked out again only when those are)."""

    def observe(self, snapshot: Snapshot) -> None:
        if not self.config.enabled or not snapshot.nvml_up:
            return
        t = snapshot.timestamp_seconds
        for gpu in snapshot.gpus:
            if not gpu.up:
                continue
            inputs = _counter_inputs(gpu)
            last = self._last_inputs.get(gpu.uuid)
            if last is not None and _same(last, inputs):
                continue  # the very counters of the last snapshot: nothing to add (most polls)
            self._last_inputs[gpu.uuid] = inputs
            for counter, label, link, raw in counters_of(gpu):
                if counter not in self.config.rules:
                    continue
                key = (gpu.uuid, counter, label, link)
                known = self._series.get(key)
                if known is None:
                    series = _Series(t, 0 if self._new_since_watched(gpu, counter, label) else raw)
                    series.add(t, raw)
                    self._series[key] = (gpu.index, series)
                    self._generation += 1
                else:
                    points = len(known[1].points), known[1].points[0]
                    known[1].add(t, raw)
                    known[1].prune(t, self._longest)
                    if known[0] != gpu.index or points != (len(known[1].points), known[1].points[0]):
                        self._generation += 1
                    self._series[key] = (gpu.index, known[1])
            self._first_seen.setdefault(gpu.uuid, t)

    def _new_since_watched(self, gpu: GpuSnapshot, counter: str, label: str) -> bool:
        """A new XID code whose last event came after gpumon started watching the GPU: all of it is new.
        (XIDs the daemon reads back from the kernel log, from earlier in the boot, are a total.)"""
        if counter != "xid" or gpu.uuid not in self._first_seen:
            return False
        last = (gpu.xid_last_timestamp_seconds or {}).get(label)
        return last is not None and last >= self._first_seen[gpu.uuid]

    def increases(self, now: float) -> list[Increase]:
        """Each series' increase within its window at ``now``; computed again only when a series
        changed or ``now`` moved a point in or out of a window (scrapes ask every few seconds)."""
        return list(self._increases(now))

    def _increases(self, now: float) -> list[Increase]:
        """``increases(now)``: the very list kept while no series changed and ``now`` stays within the span it holds."""
        cached = self._cached
        if cached is not None and cached[0] == self._generation and cached[1] <= now < cached[2]:
            return cached[3]
        out: list[Increase] = []
        lo, hi = -math.inf, math.inf
        for (uuid, counter, label, link), (index, series) in sorted(
            self._series.items(), key=lambda kv: (kv[1][0], kv[0])
        ):
            rule = self.config.rules[counter]
            increase, since, until = series.increase_until(now, rule.window_seconds)
            lo, hi = max(lo, since), min(hi, until)
            by_link = {link: increase} if link and increase else {}
            last = out[-1] if out else None
            if last is not None and (last.index, last.uuid, last.counter, last.label) == (index, uuid, counter, label):
                out[-1] = Increase(
                    index,
                    uuid,
                    counter,
                    label,
                    last.increase + increase,
                    rule.window_seconds,
                    {**last.links, **by_link},
                )  # one more link of this counter (sorted: a counter's links come together)
            else:
                out.append(Increase(index, uuid, counter, label, increase, rule.window_seconds, by_link))
        self._cached = (self._generation, lo, hi, out)
        return out

    def findings(self, now: float) -> list[Finding]:
        """A WARNING ``<counter>_trend`` finding per counter that rose by more than its rule allows within its
        window; worked out again only when the increases are (the alert tick asks every 5 s, scrapes too)."""
        increases = self._increases(now)
        kept = self._found
        if kept is None or kept[0] is not increases:
            kept = self._found = (increases, self._findings(increases))
        return list(kept[1])

    def _findings(self, increases: list[Increase]) -> list[Finding]:
        found = []
        for inc in increases:
            rule = self.config.rules[inc.counter]
            if inc.increase <= rule.max_increase:
                continue
            what, action, advice = WORDS[inc.counter]
            if inc.counter == "xid":
                name = self._words(inc.label) if self._words else ""
                what = f"XID {inc.label}" + (f" ({name})" if name else "") + " events"
            where = ""
            if inc.links:
                names = sorted(inc.links, key=lambda link: (len(link), link))
                where = f" on link{'s' if len(names) > 1 else ''} {', '.join(names)}"
            summary = (
                f"{what} rising{where}: {inc.increase:g} in the last {duration(rule.window_seconds, style='units')} "
                f"(more than {rule.max_increase:g}), {advice}"
            )
            found.append(
                Finding(
                    kind=f"{inc.counter}_trend",
                    severity=WARNING,
                    action=action,
                    summary=summary,
                    gpu=inc.index,
                    uuid=inc.uuid,
                    evidence={
                        "counter": inc.counter,
                        "xid": inc.label or None,
                        "increase": inc.increase,
                        "window_seconds": rule.window_seconds,
                        "max_increase": rule.max_increase,
                        **({"links": dict(inc.links)} if inc.links else {}),
                        "source": "error trend",
                    },
                )
            )
        return found
