"""Tiered polling of the backend into snapshots. ``poll()`` never raises (but see "strict" below).

Every call reads the FAST tier of every GPU; the SLOW and STATIC tiers are read when
their interval has passed. Values of slower tiers are cached per GPU and merged into
each snapshot, so a snapshot always holds the latest value of every field.

Faults (README, "Faults"; docs/architecture.md):
* NVML missing: the snapshot says ``nvml_up=False``; ``init`` is retried with
  exponential backoff (1 s … 60 s); one log line when it goes and one when it returns.
* A GPU lost: that GPU is reported ``up=False`` with its identity, counters and XID counts only (DESIGN.md §4),
  the others are unaffected; it is re-probed with backoff (5 s … 60 s).
* Any other exception in a read: logged, counted in that tier's errors, the GPU's
  cached values are kept, the next poll runs as usual.
* A key a backend returns that is no GpuSnapshot field (a reader's typo, a field not declared in
  gpumon/model/fields/): logged at error level once per key and counted (``Poller.unknown_fields()``),
  the rest of the read is kept. With ``strict_fields`` (the test suite sets ``GPUMON_STRICT_FIELDS=1``)
  ``poll()`` raises ``UnknownFieldError`` instead, so such a key fails the tests.

Which tiers a poll reads is ``poll_plan.py``'s to say, the merge of a GPU's tiers into its snapshot
``merge.py``'s, what is kept of each GPU between polls ``poll_state.py``'s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpumon.backends.base import GpuBackend, GpuLostError, NvmlUnavailableError
from gpumon.collect.host_figures import HostFigureReader
from gpumon.collect.merge import GpuMerge, ProcessEnricher, UnknownFieldError, XidCounts
from gpumon.collect.poll_plan import FAST_ONLY, plan_tiers
from gpumon.collect.poll_state import POLLED_TIERS, GpuState
from gpumon.collect.store import SnapshotStore
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import (
    GpuSnapshot,
    HostSnapshot,
    Snapshot,
    Tier,
    TierStats,
)

log = logging.getLogger(__name__)

_FAST = Tier.FAST
"""Tier.FAST, read once: each ``Tier.X`` is a descriptor call (~0.1 µs), and the fast path names it per GPU."""
_TIER_NAMES: Mapping[Tier, str] = {tier: tier.value for tier in Tier}
"""Each tier's name, the key of Snapshot.tiers (``tier.value`` is a property call too)."""
_FAST_NAME = _TIER_NAMES[_FAST]

STRICT_FIELDS_ENV = "GPUMON_STRICT_FIELDS"
"""``1``: pollers made without ``strict_fields`` raise on unknown keys (set by tests/conftest.py)."""


class Poller:
    """Reads the backend tier by tier and publishes a Snapshot to the store."""

    def __init__(
        self,
        backend: GpuBackend,
        store: SnapshotStore,
        intervals: PollIntervals = PollIntervals(),
        *,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        host_figures: Callable[[], Mapping[str, Any]] | None = None,
        enrich_processes: ProcessEnricher | None = None,
        xid_counts: XidCounts | None = None,
        strict_fields: bool | None = None,
    ) -> None:
        """``strict_fields``: raise ``UnknownFieldError`` out of ``poll()`` when a backend returns a key
        that is no GpuSnapshot field, instead of logging it and leaving it out; None: strict when the
        environment has ``GPUMON_STRICT_FIELDS=1`` (the test suite)."""
        self._backend = backend
        self._store = store
        self._intervals = intervals
        self._wall = wall_clock
        self._mono = monotonic
        self._host_figures = host_figures if host_figures is not None else HostFigureReader()
        strict = os.environ.get(STRICT_FIELDS_ENV) == "1" if strict_fields is None else strict_fields
        self._merger = GpuMerge(enrich_processes, xid_counts, strict)
        # bound once: the fast path calls them per GPU (a benchmark times self._merge)
        self._merge = self._merger.merge
        self._lost_snapshot = self._merger.lost_snapshot
        self._nvml_up = False
        self._nvml_error: str | None = None
        self._init_at = 0.0
        self._init_backoff = 1.0
        self._host = HostSnapshot()
        self._host_figures_cache: HostSnapshot | None = None
        self._host_figures_at = 0.0
        self._gpus: list[GpuState] = []
        self._tier_stats: dict[str, TierStats] = {}
        """Per tier (by its value, as in Snapshot.tiers), as of the tier's last read."""
        self._tier_errors: dict[Tier, int] = {t: 0 for t in POLLED_TIERS}
        self._running_since: float | None = None
        self._reading_gpu: int | None = None
        """The GPU whose backend read the poll in progress is inside (``progress``)."""
        self._next_slower_due = 0.0
        """No slow or static read is due before this monotonic time (skips planning on most polls)."""
        self._planned_with = intervals
        """The intervals ``_next_slower_due`` was planned with: new ones (a reload) plan again at once."""

    def set_intervals(self, intervals: PollIntervals) -> None:
        """Use new tier intervals from the next poll on (SIGHUP): that poll plans with them, so a shortened
        interval is honoured at once (a tier read longer ago than its new interval is read then)."""
        self._intervals = intervals

    @property
    def nvml_up(self) -> bool:
        return self._nvml_up

    def poll(self) -> Snapshot:
        """One poll; publishes and returns the snapshot. Never raises (a failing store listener
        is the store's to log)."""
        start = self._mono()
        self._running_since = start
        try:
            snapshot = self._poll(start)
        except UnknownFieldError:
            raise  # strict: a test is to fail
        except Exception as exc:  # a bug must not stop polling
            log.exception("poll failed unexpectedly")
            self._tier_errors[Tier.FAST] += 1
            fast = self._tier_stats.get(Tier.FAST.value)
            if fast is not None:
                fast = dataclasses.replace(fast, errors_total=self._tier_errors[Tier.FAST])
                self._tier_stats = {**self._tier_stats, Tier.FAST.value: fast}
            snapshot = Snapshot(
                timestamp_seconds=self._wall(),
                monotonic_seconds=self._mono(),
                nvml_up=self._nvml_up,
                nvml_error=f"internal error: {exc}",
                host=self._host,
                tiers=self._stats_view(),
            )
        finally:
            self._running_since = None
            self._reading_gpu = None
        self._store.publish(snapshot)
        return snapshot

    def unknown_fields(self) -> Mapping[str, int]:
        """Keys a backend returned that are no GpuSnapshot field, and how many reads had each (not strict)."""
        return self._merger.unknown_fields()

    @property
    def poll_running(self) -> bool:
        """True while a poll is inside the backend (a hung NVML call keeps it True)."""
        return self._running_since is not None

    def progress(self) -> tuple[float | None, int | None]:
        """(when the poll in progress started, monotonic seconds; the GPU whose read it is inside), each
        None when not known: what names the GPU of a read that hangs (gpumon.health.poll_watch)."""
        return self._running_since, self._reading_gpu

    # ------------------------------------------------------------------
    def _poll(self, start: float) -> Snapshot:
        if not self._nvml_up and start >= self._init_at:
            self._try_init(start)
        if not self._nvml_up:
            return self._snapshot_without_gpus(False, self._nvml_error)
        try:
            durations: dict[Tier, float] | None = None
            if (
                start < self._next_slower_due and self._planned_with is self._intervals
            ):  # most polls: the fast tier of every GPU, nothing slower
                gpus = self._read_fast_tier(start)
                end = self._mono()  # one clock read for the duration and the snapshot (µs each on some VMs)
            else:
                gpus, durations = self._read_planned_tiers(start)
                end = self._mono()
            self._reading_gpu = None
            errors = self._backend.take_errors()
            if errors:  # most polls: none, no call for them
                self._count_backend_errors(errors)
        except NvmlUnavailableError as exc:
            # the driver went away under us (unloaded, upgraded): re-initialise with backoff
            log.error("NVML went away: %s; re-initialising with backoff", exc)
            try:
                self._backend.shutdown()
            except Exception:
                log.debug("backend shutdown failed", exc_info=True)
            self._nvml_up = False
            self._nvml_error = str(exc)
            self._init_at = start + self._init_backoff
            return self._snapshot_without_gpus(False, self._nvml_error)
        end_wall = self._wall()
        if durations is None:  # the fast tier alone, timed by the poll's own clock reads
            fast = TierStats.of_read(end - start, self._tier_errors[_FAST], end_wall)
            tier_stats = {**self._tier_stats, _FAST_NAME: fast}
        else:
            tier_stats = dict(self._tier_stats)
            for tier, seconds in durations.items():
                tier_stats[_TIER_NAMES[tier]] = TierStats.of_read(seconds, self._tier_errors[tier], end_wall)
        self._tier_stats = tier_stats
        return Snapshot.of_poll(end_wall, end, self._with_host_figures(start), gpus, tier_stats)

    def _read_fast_tier(
        self, now: float, plan: Sequence[Sequence[Tier]] | None = None, durations: dict[Tier, float] | None = None
    ) -> tuple[GpuSnapshot, ...]:
        """Every GPU's fast tier, one backend read and one merge per GPU: the poll of most seconds (no
        ``plan``), and in a planned poll each GPU whose plan is ``FAST_ONLY`` (most of them), its read timed
        into ``durations`` when given; a GPU with a slower tier planned, or lost, goes to ``_read_gpu``."""
        read, mono = self._backend.read, self._mono
        out = []
        for index, state in enumerate(self._gpus):
            tiers = FAST_ONLY if plan is None else plan[index]
            if (
                tiers is not FAST_ONLY or state.lost_reason is not None
            ):  # a lost GPU: re-probed, when its backoff allows
                out.append(self._read_gpu(index, state, tiers, durations or {}, now, timed=durations is not None))
                continue
            self._reading_gpu = index
            t0 = 0.0 if durations is None else mono()
            try:
                state.cache[_FAST] = read(index, _FAST)
            except GpuLostError as exc:
                self._mark_lost(index, state, exc.reason, now)
                out.append(self._lost_snapshot(index, state))
                continue
            except NvmlUnavailableError:
                raise
            except Exception:  # the GPU's cached values are kept
                self._tier_errors[_FAST] += 1
                log.exception("reading fast tier of GPU %d failed", index)
            finally:
                if durations is not None:
                    durations[_FAST] += mono() - t0
            out.append(self._merge(index, state))
        return tuple(out)

    def _read_planned_tiers(self, start: float) -> tuple[tuple[GpuSnapshot, ...], dict[Tier, float]]:
        """A poll that reads a slower tier of some GPU: (GPU snapshots, each tier read and its duration,
        slowest tier first)."""
        self._planned_with = intervals = self._intervals
        plan, due, self._next_slower_due = plan_tiers(self._gpus, intervals, start)
        durations = dict.fromkeys(due, 0.0)
        # A fast-only poll (a GPU re-probed later, say) is timed as a whole: clock reads cost µs on some VMs.
        if len(due) > 1:
            return self._read_fast_tier(start, plan, durations), durations
        gpus = self._read_fast_tier(start, plan)
        durations[Tier.FAST] = self._mono() - start
        return gpus, durations

    def _try_init(self, now: float) -> None:
        try:
            self._backend.init()
            count = self._backend.device_count()
            gpus = []
            for i in range(count):
                try:
                    uuid = self._backend.uuid(i)
                except GpuLostError as exc:
                    gpus.append(GpuState(uuid=f"unknown-{i}", lost_reason=exc.reason, reprobe_at=now))
                    continue
                gpus.append(GpuState(uuid=uuid))
            self._host = self._backend.host()
            self._host_figures_cache = None
        except NvmlUnavailableError as exc:
            message = str(exc)
            if message != self._nvml_error:
                log.error("NVML unavailable: %s; gpumon keeps running and retries with backoff", message)
            self._nvml_error = message
            self._init_at = now + self._init_backoff
            self._init_backoff = min(self._init_backoff * 2, 60.0)
            return
        except Exception as exc:
            log.exception("NVML initialisation failed")
            self._nvml_error = f"initialisation failed: {exc}"
            self._init_at = now + self._init_backoff
            self._init_backoff = min(self._init_backoff * 2, 60.0)
            return
        if self._nvml_error is not None:
            log.info("NVML is back: %d GPU(s)", len(gpus))  # its going was the ERROR; coming back is good news
        elif self._backend.simulated:
            log.info("fake backend: %d simulated GPU(s) behind a simulated NVML (no NVIDIA driver in use)", len(gpus))
        else:
            log.info("NVML initialised: %d GPU(s), driver %s", len(gpus), self._host.driver_version)
        self._nvml_up = True
        self._nvml_error = None
        self._init_backoff = 1.0
        self._gpus = gpus
        self._next_slower_due = 0.0

    def _read_gpu(
        self,
        index: int,
        state: GpuState,
        planned: Sequence[Tier],
        durations: dict[Tier, float],
        now: float,
        timed: bool = True,
    ) -> GpuSnapshot:
        reprobing = state.lost_reason is not None
        if reprobing and now < state.reprobe_at:
            return self._lost_snapshot(index, state)
        tiers = list(POLLED_TIERS) if reprobing else planned
        self._reading_gpu = index
        for tier in tiers:
            t0 = self._mono() if timed else 0.0
            try:
                values = self._backend.read(index, tier)
            except GpuLostError as exc:
                self._mark_lost(index, state, exc.reason, now)
                return self._lost_snapshot(index, state)
            except NvmlUnavailableError:
                raise
            except Exception:
                self._tier_errors[tier] += 1
                log.exception("reading %s tier of GPU %d failed", tier.value, index)
                continue
            finally:
                if timed:
                    durations[tier] = durations.get(tier, 0.0) + (self._mono() - t0)
            state.cache[tier] = values
            if tier is not Tier.FAST:
                state.base = None
                state.read_at[tier] = now
        if reprobing:
            log.warning("GPU %d (%s) answers again", index, state.uuid)
            state.lost_reason = None
            state.reprobe_backoff = 5.0
            try:
                state.uuid = self._backend.uuid(index)
            except Exception:
                log.debug("could not re-read the UUID of GPU %d", index, exc_info=True)
        return self._merge(index, state)

    def _count_backend_errors(self, errors: Mapping[str, int]) -> None:
        """Errors the backend survived inside a read (one reader group failing), by tier, once per poll."""
        for tier_name, count in errors.items():
            tier = Tier(tier_name)
            self._tier_errors[tier] = self._tier_errors.get(tier, 0) + count

    def _mark_lost(self, index: int, state: GpuState, reason: str, now: float) -> None:
        if state.lost_reason is None:
            log.error(
                "GPU %d (%s) lost: %s; other GPUs keep reporting; re-probing with backoff", index, state.uuid, reason
            )
        else:
            state.reprobe_backoff = min(state.reprobe_backoff * 2, 60.0)
        state.lost_reason = reason
        state.reprobe_at = now + state.reprobe_backoff

    def _with_host_figures(self, now: float) -> HostSnapshot:
        """Driver facts plus psutil figures, re-read every slow interval (~50 µs a read); ``now``: monotonic s."""
        if self._host_figures_cache is None or now - self._host_figures_at >= self._intervals.slow_seconds:
            self._host_figures_at = now
            try:
                figures = self._host_figures()
            except Exception:
                log.debug("host figures unavailable", exc_info=True)
                return self._host
            self._host_figures_cache = dataclasses.replace(self._host, **figures)
        return self._host_figures_cache

    def _snapshot_without_gpus(self, nvml_up: bool, error: str | None) -> Snapshot:
        """A snapshot that carries no GPU readings: NVML down, or a poll that failed outright."""
        return Snapshot(
            timestamp_seconds=self._wall(),
            monotonic_seconds=self._mono(),
            nvml_up=nvml_up,
            nvml_error=error,
            host=self._with_host_figures(self._mono()),
            tiers=self._stats_view(),
        )

    def _stats_view(self) -> Mapping[str, TierStats]:
        """Tier stats as of each tier's last read (errors are counted before the stats are made).

        The mapping is never changed once made (a new one replaces it), so snapshots share it."""
        return self._tier_stats
