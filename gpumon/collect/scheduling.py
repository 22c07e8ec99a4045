"""The polling job: APScheduler calls the poll on an executor thread, one poll at a time.

The scheduler's own thread only decides when the poll is due and hands it to the
executor, so no scheduler lock is held while a backend call runs: a read that hangs in
NVML blocks its poll thread and nothing else. SIGHUP can change the interval and
SIGTERM can stop the scheduler in every state.

* ``DaemonThreadExecutor``: an APScheduler executor that runs each job on a daemon thread
  (the previous poll's, when it waits idle). APScheduler's ``ThreadPoolExecutor`` would do the
  same work, but Python joins ``concurrent.futures`` workers at exit, so a poll hung inside
  NVML would keep the process from ever exiting. A daemon thread is left behind instead.
* ``MonotonicScheduler``: APScheduler's BackgroundScheduler, whose jobs keep their monotonic
  schedule when the wall clock steps. APScheduler plans and compares on the wall clock, so a
  step back of 2 minutes (NTP after a VM pause) would hold every poll for 2 minutes, and a step
  forward would make the next poll a misfire. The scheduler looks at least once a second at the
  difference between the wall clock and the monotonic clock; when it changed (a step), every
  job's next run time is moved by the step, so the next poll comes one interval after the last
  one, as the monotonic clock counts.
* ``PollJob``: the poll as an interval job with ``max_instances=1`` (never two polls at
  once), ``coalesce=True`` (a late scheduler runs one poll, not a burst) and a misfire grace
  (a poll that could not start within the grace is dropped). Every scheduled poll that did
  not run is counted (``skipped_total``, from the monotonic time between polls); a poll that
  overruns is logged once, not once per skipped poll, and once more when it returns.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, EVENT_JOB_SUBMITTED
from apscheduler.executors.base import BaseExecutor, run_job
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

log = logging.getLogger("gpumon")

JOB_ID = "poll"


class DaemonThreadExecutor(BaseExecutor):  # type: ignore[misc]  # apscheduler has no type hints
    """Runs jobs on daemon threads, reusing an idle one (starting a thread costs ~170 µs of CPU
    a poll): the thread that ran the last poll waits, blocked without a timeout, for the next.
    A job submitted while every worker is busy gets a new thread; a worker that finds another
    idle one when it is done ends.

    The hand-off is a ``queue.SimpleQueue``, whose ``get`` waits in C: a ``threading.Condition``
    wait is Python code that the poll thread ran on each wake-up (once a poll)."""

    def __init__(self, thread_name: str = "gpumon-poll") -> None:
        super().__init__()
        self._thread_name = thread_name
        self._active_lock = threading.Lock()
        self._active = 0
        self._idle = 0
        """Workers waiting (or about to wait) for a job."""
        self._queued = 0
        """Jobs handed to the waiting workers and not taken yet."""
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        """Jobs for the waiting workers; None ends one (shutdown)."""
        self._closed = False

    @property
    def active(self) -> int:
        """Jobs handed to a thread and not finished (a hung poll stays counted)."""
        return self._active

    @property
    def idle_workers(self) -> int:
        """Threads waiting for the next job."""
        return self._idle

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        def run() -> None:
            try:
                events = run_job(job, job._jobstore_alias, run_times, self._logger.name)
            except BaseException as exc:
                self._run_job_error(job.id, exc, exc.__traceback__)
            else:
                self._run_job_success(job.id, events)
            finally:
                with self._active_lock:
                    self._active -= 1

        with self._active_lock:
            self._active += 1
            if self._idle > self._queued:
                self._queued += 1
                self._jobs.put(run)
                return
        try:
            threading.Thread(target=self._work, args=(run,), name=self._thread_name, daemon=True).start()
        except BaseException:
            with self._active_lock:
                self._active -= 1
            raise

    def _work(self, first: Callable[[], None]) -> None:
        job: Callable[[], None] | None = first
        while job is not None:
            job()
            with self._active_lock:
                if self._idle or self._closed:
                    return  # another worker already waits: one is enough
                self._idle += 1
            job = self._jobs.get()
            with self._active_lock:
                self._idle -= 1
                if job is not None:
                    self._queued -= 1

    def shutdown(self, wait: bool = True) -> None:
        """Nothing to join: a running job ends by itself or is left behind (a daemon thread);
        an idle worker ends."""
        with self._active_lock:
            self._closed = True
            waiting = self._idle
        for _ in range(waiting):
            self._jobs.put(None)


STEP_TOLERANCE_SECONDS = 0.5
"""A change of the wall clock against the monotonic clock larger than this is a step."""
STEP_CHECK_SECONDS = 1.0
"""The scheduler looks for a step of the wall clock at least this often."""


class MonotonicScheduler(BackgroundScheduler):  # type: ignore[misc]  # apscheduler has no type hints
    """A BackgroundScheduler that moves its jobs' next run times with every step of the wall clock.

    ``wall_clock`` must be the clock APScheduler reads (``time.time``: ``datetime.now`` in UTC);
    ``monotonic`` the one that cannot step."""

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self._mono = monotonic
        self._wall = wall_clock
        self._offset = wall_clock() - monotonic()
        """Wall minus monotonic seconds, as last seen."""
        self.steps_followed = 0

    def _process_jobs(self) -> float:
        self._follow_wall_step()
        wait = super()._process_jobs()
        return STEP_CHECK_SECONDS if wait is None else min(float(wait), STEP_CHECK_SECONDS)

    def _follow_wall_step(self) -> None:
        offset = self._wall() - self._mono()
        step = offset - self._offset
        self._offset = offset  # a slow drift (NTP slewing) is followed as it comes
        if abs(step) <= STEP_TOLERANCE_SECONDS:
            return
        self.steps_followed += 1
        for job in self.get_jobs():
            if job.next_run_time is not None:
                job.modify(next_run_time=job.next_run_time + timedelta(seconds=step))
        log.warning("the wall clock stepped by %+.1f s; polls keep their schedule on the monotonic clock", step)


def interval_trigger(seconds: float) -> IntervalTrigger:
    """The trigger for a poll every ``seconds``; raises ValueError when no timer can use it.

    Checked before anything is changed (a reload): the interval must be finite, positive and
    small enough for a datetime (1e300 s is not)."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"interval_seconds must be a finite number greater than 0, not {seconds!r}")
    try:
        trigger = IntervalTrigger(seconds=seconds, timezone=timezone.utc)
        trigger.get_next_fire_time(None, datetime.now(timezone.utc))
    except (OverflowError, ValueError) as exc:
        raise ValueError(f"interval_seconds {seconds:g} is too large for a timer ({exc})") from exc
    return trigger


def misfire_grace_seconds(interval_seconds: float) -> int:
    """How late a poll may start before it is dropped: one interval, at least 1 s (APScheduler wants whole seconds)."""
    return max(1, math.ceil(interval_seconds))


class PollJob:
    """The poll on a BackgroundScheduler, its interval changeable live, its skips counted."""

    def __init__(
        self,
        poll: Callable[[], object],
        interval_seconds: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """``wall_clock``: the clock APScheduler plans on (``time.time``), passed for tests that step it."""
        self._poll = poll
        self._interval = interval_seconds
        self._trigger = interval_trigger(interval_seconds)
        self._mono = monotonic
        self._lock = threading.Lock()
        self._skipped = 0
        self._skipped_in_overrun = 0
        self._running_since: float | None = None
        self._last_submitted: float | None = None
        """Monotonic seconds the last poll was handed to the executor (or refused as one still runs)."""
        self._wall = wall_clock
        self._executor = DaemonThreadExecutor()
        self.scheduler = MonotonicScheduler(
            monotonic=monotonic,
            wall_clock=wall_clock,
            executors={"default": self._executor},
            job_defaults={"coalesce": True, "max_instances": 1},
            timezone=timezone.utc,
            daemon=True,
        )
        self.scheduler.add_listener(self._on_event, EVENT_JOB_SUBMITTED | EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)

    # ---- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler with the first poll due now."""
        self.scheduler.add_job(
            self._run,
            self._trigger,
            id=JOB_ID,
            name="gpumon poll",
            misfire_grace_time=misfire_grace_seconds(self._interval),
            next_run_time=self._now(),
        )
        self.scheduler.start()

    def shutdown(self) -> None:
        """Stop scheduling polls; returns at once even while a poll hangs (it is not waited for)."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    def set_interval(self, trigger: IntervalTrigger, interval_seconds: float) -> None:
        """Poll on ``trigger`` (from ``interval_trigger``) from now on; the next poll is one interval away."""
        with self._lock:
            self._interval = interval_seconds
            self._trigger = trigger
            self._last_submitted = None
        if self.scheduler.get_job(JOB_ID) is None:
            return  # not started yet: start() uses the new trigger
        self.scheduler.modify_job(
            JOB_ID,
            trigger=trigger,
            next_run_time=trigger.get_next_fire_time(None, self._now()),
            misfire_grace_time=misfire_grace_seconds(interval_seconds),
        )

    # ---- figures -----------------------------------------------------------------
    @property
    def skipped_total(self) -> int:
        """Scheduled polls that did not run: one was still running, or it could not start in time."""
        return self._skipped

    @property
    def running(self) -> bool:
        """True from the moment a poll is handed to its thread until it returns (a hung read keeps it True)."""
        return self._executor.active > 0

    # ---- internals ---------------------------------------------------------------
    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._wall(), timezone.utc)

    def _run(self) -> None:
        start = self._mono()
        self._running_since = start
        try:
            self._poll()
        finally:
            self._running_since = None
            with self._lock:
                skipped, self._skipped_in_overrun = self._skipped_in_overrun, 0
            if skipped:
                log.warning(
                    "poll returned after %.1f s; %d scheduled poll(s) skipped meanwhile", self._mono() - start, skipped
                )

    def _on_event(self, event: Any) -> None:
        """Count the scheduled polls that did not run (called on scheduler and executor threads)."""
        if event.job_id != JOB_ID:
            return
        with self._lock:
            if event.code == EVENT_JOB_MISSED:
                self._skipped += 1
                log.warning("a poll could not start within its grace time (the host was suspended or short of CPU)")
                return
            # with coalesce, polls whose time passed while the scheduler itself was late are folded into
            # this one: counted from the monotonic time since the last poll (a wall-clock step is no gap)
            submitted = self._mono()
            if self._last_submitted is not None:
                gap = submitted - self._last_submitted
                self._skipped += max(0, round(gap / self._interval) - 1)
            self._last_submitted = submitted
            if event.code != EVENT_JOB_MAX_INSTANCES:
                return
            self._skipped += 1
            running = self._running_since
            if running is None:
                return  # the poll has just returned; the executor has not yet noted it
            self._skipped_in_overrun += 1
            first = self._skipped_in_overrun == 1
        if first:
            log.warning(
                "poll still running after %.1f s (a backend read is slow or hangs); polls are skipped until it returns",
                self._mono() - running,
            )
