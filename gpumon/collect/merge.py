"""A GPU's tiers merged into one GpuSnapshot: the cached slower tiers, the fast read, the processes with
their /proc facts (reused while NVML reports the same processes), XID counts; a lost GPU's snapshot.

A key a backend returns that is no GpuSnapshot field is logged at error level once per key and counted,
or raises ``UnknownFieldError`` where the merge is strict (gpumon/collect/poller.py's docstring).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any

from gpumon.collect.poll_state import POLLED_TIERS, GpuState
from gpumon.model.snapshot import GpuSnapshot, ProcessSnapshot, Tier, counter_field_names

log = logging.getLogger(__name__)

_IDENTITY_FIELDS = ("name", "pci_bus_id", "serial", "vbios_version", "compute_capability", "minor_number")
_FAST = Tier.FAST
"""Tier.FAST, read once: each ``Tier.X`` is a descriptor call (~0.1 µs), and the merge names it per GPU."""
_FIELD_COUNT = len(dataclasses.fields(GpuSnapshot))
_KEY_FIELDS = frozenset({"index", "uuid", "up", "lost_reason"})
"""GpuKey's fields: gpumon sets them, a backend's read may not."""
_SETTABLE_FIELDS = frozenset(f.name for f in dataclasses.fields(GpuSnapshot)) - _KEY_FIELDS

ProcessEnricher = Callable[[tuple[ProcessSnapshot, ...]], tuple[ProcessSnapshot, ...]]
XidCounts = Callable[[int], tuple[Mapping[str, int], Mapping[str, float]]]
"""A GPU's XID (counts, last timestamps) by code, as mappings never changed afterwards (XidTracker.for_gpu):
snapshots hold them as they are."""

ENRICH_REUSE_POLLS = 30
"""Polls that may reuse a GPU's process attribution while NVML reports the same processes (same pids
and what the backend said of them; the memory and SM share they use come from each read): /proc is read
again when the list changes, and at least every 30 polls."""


_PER_READ_FIGURES = ("used_memory_bytes", "sm_utilization_ratio")
_ATTRIBUTED = attrgetter(*(f.name for f in dataclasses.fields(ProcessSnapshot) if f.name not in _PER_READ_FIGURES))
"""A process's fields but the per-read figures (pid first), as one tuple."""


def _same_processes(old: tuple[ProcessSnapshot, ...], new: tuple[ProcessSnapshot, ...]) -> bool:
    """The same processes as far as /proc attribution goes: equal but for the per-read figures."""
    return old is new or (
        len(old) == len(new) and all(_ATTRIBUTED(a) == _ATTRIBUTED(b) for a, b in zip(old, new, strict=True))
    )


def _with_figures_of(
    enriched: tuple[ProcessSnapshot, ...], read: tuple[ProcessSnapshot, ...]
) -> tuple[ProcessSnapshot, ...]:
    """The attributed processes ``enriched`` with the memory and SM share of this ``read`` of the same processes."""
    return tuple(
        e
        if (e.used_memory_bytes, e.sm_utilization_ratio) == (r.used_memory_bytes, r.sm_utilization_ratio)
        else dataclasses.replace(e, used_memory_bytes=r.used_memory_bytes, sm_utilization_ratio=r.sm_utilization_ratio)
        for e, r in zip(enriched, read, strict=True)
    )


class UnknownFieldError(RuntimeError):
    """A backend returned keys that are no GpuSnapshot field (raised only by a strict poller)."""


class GpuMerge:
    """Merges each GPU's cached tiers into its snapshot; counts the keys that are no field."""

    def __init__(self, enrich_processes: ProcessEnricher | None, xid_counts: XidCounts | None, strict: bool) -> None:
        """``strict``: raise ``UnknownFieldError`` for a key that is no GpuSnapshot field instead of
        logging it and leaving it out."""
        self._enrich = enrich_processes
        self._xid_counts = xid_counts
        self._strict = strict
        self._unknown_fields: dict[str, int] = {}

    def unknown_fields(self) -> Mapping[str, int]:
        """Keys a backend returned that are no GpuSnapshot field, and how many reads had each (not strict)."""
        return dict(self._unknown_fields)

    def _settable(self, values: Mapping[str, Any]) -> Mapping[str, Any]:
        """``values`` without keys that are no GpuSnapshot field: each is logged once and counted, or raises if strict."""
        if values.keys() <= _SETTABLE_FIELDS:
            return values
        unknown = sorted(values.keys() - _SETTABLE_FIELDS)
        if self._strict:
            raise UnknownFieldError(
                f"the backend returned {unknown}, which are no GpuSnapshot fields (gpumon/model/fields/)"
            )
        for key in unknown:
            if key not in self._unknown_fields:
                log.error("the backend returned %r, which is no GpuSnapshot field: left out (a bug)", key)
            self._unknown_fields[key] = self._unknown_fields.get(key, 0) + 1
        return {k: v for k, v in values.items() if k in _SETTABLE_FIELDS}

    def lost_snapshot(self, index: int, state: GpuState) -> GpuSnapshot:
        """A lost GPU: its identity, counters and XID counts only (DESIGN.md §4)."""
        keep = counter_field_names().union(_IDENTITY_FIELDS)
        kept = {k: v for tier in POLLED_TIERS for k, v in state.cache.get(tier, {}).items() if k in keep}
        if self._xid_counts is not None:
            kept["xid_errors_total"], kept["xid_last_timestamp_seconds"] = self._xid_counts(index)
        return GpuSnapshot(index=index, uuid=state.uuid, up=False, lost_reason=state.lost_reason, **kept)

    def merge(self, index: int, state: GpuState) -> GpuSnapshot:
        """The GPU's snapshot: its latest fast read over its slower tiers, processes and XID counts added."""
        if state.base is None:
            slower: dict[str, Any] = {}
            for tier in (Tier.STATIC, Tier.SLOW):
                slower.update(self._settable(state.cache.get(tier, {})))
            state.base = GpuSnapshot.base_fields(slower)
        values = state.cache.get(_FAST, {})
        extra: dict[str, Any] = {}
        processes = values.get("processes")
        if processes and self._enrich is not None:
            known = state.enriched
            if known is not None and known[2] > 0 and _same_processes(known[0], processes):
                extra["processes"] = _with_figures_of(known[1], processes)
                state.enriched = (known[0], extra["processes"], known[2] - 1)
            else:
                try:
                    extra["processes"] = self._enrich(processes)
                    state.enriched = (processes, extra["processes"], ENRICH_REUSE_POLLS - 1)
                except Exception:
                    state.enriched = None
                    log.exception("process attribution failed")
        if self._xid_counts is not None:
            extra["xid_errors_total"], extra["xid_last_timestamp_seconds"] = self._xid_counts(index)
        # the cached read stays as the backend returned it: what gpumon adds is laid over it
        snapshot = GpuSnapshot.assemble(index, state.uuid, values, state.base, extra)
        if len(snapshot.__dict__) != _FIELD_COUNT or not values.keys().isdisjoint(_KEY_FIELDS):
            # a key that is no field (base holds every field but the key ones once: one more key
            # is one that is no field), or a key field: left out (logged, counted) or raised (strict)
            snapshot = GpuSnapshot.assemble(index, state.uuid, self._settable(values), state.base, extra)
        return snapshot
