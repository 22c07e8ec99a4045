"""The poll job on APScheduler: one poll at a time, skips counted, nothing waits on a hung poll."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from gpumon.collect.scheduling import PollJob, interval_trigger
from tests.helpers import wait_for


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.inf, math.nan, 1e300])
def test_an_interval_no_timer_can_use_is_refused_before_anything_changes(seconds: float) -> None:
    with pytest.raises(ValueError, match="interval_seconds"):
        interval_trigger(seconds)


def test_fractional_intervals_are_fine() -> None:
    assert interval_trigger(0.25).interval_length == 0.25


class BlockingPoll:
    """A poll whose first call blocks until released (a backend read that hangs)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0
        self.concurrent = 0
        self.most_concurrent = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.calls += 1
            self.concurrent += 1
            self.most_concurrent = max(self.most_concurrent, self.concurrent)
            first = self.calls == 1
        if first:
            self.release.wait(30)
        with self._lock:
            self.concurrent -= 1


@pytest.fixture
def job() -> Iterator[Callable[[Callable[[], object], float], PollJob]]:
    made: list[PollJob] = []

    def make(poll: Callable[[], object], interval: float) -> PollJob:
        j = PollJob(poll, interval)
        made.append(j)
        return j

    yield make
    for j in made:
        j.shutdown()


def finishes(action: Callable[[], object]) -> bool:
    """Run ``action`` on a thread; True when it returned (a wedged call would not)."""
    done = threading.Event()

    def run() -> None:
        action()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(5)


def test_a_hung_poll_is_never_stacked_and_blocks_neither_reschedule_nor_shutdown(
    job: Callable[[Callable[[], object], float], PollJob], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    poll = BlockingPoll()
    j = job(poll, 0.1)
    j.start()
    wait_for(lambda: j.skipped_total >= 3, what="polls skipped while one hangs")
    assert j.running and poll.calls == 1 and poll.most_concurrent == 1
    assert finishes(lambda: j.set_interval(interval_trigger(0.05), 0.05)), "reschedule waited on the hung poll"
    wait_for(lambda: j.skipped_total >= 6, what="skips at the new interval")
    overrun = [r.getMessage() for r in caplog.records if "skipped until it returns" in r.getMessage()]
    assert len(overrun) == 1, "one line per overrun, not one per skipped poll"

    poll.release.set()
    wait_for(lambda: poll.calls >= 3, what="polls again after the hang")
    assert poll.most_concurrent == 1
    assert any("poll returned after" in r.getMessage() for r in caplog.records)
    assert finishes(j.shutdown)


def test_shutdown_returns_at_once_while_a_poll_hangs(job: Callable[[Callable[[], object], float], PollJob]) -> None:
    poll = BlockingPoll()
    j = job(poll, 0.1)
    j.start()
    wait_for(lambda: j.running, what="the poll to hang")
    assert finishes(j.shutdown)
    poll.release.set()


def test_polls_a_late_scheduler_folds_into_one_are_counted_as_skipped(
    job: Callable[[Callable[[], object], float], PollJob],
) -> None:
    calls: list[float] = []
    j = job(lambda: calls.append(time.monotonic()), 0.1)
    j.start()
    wait_for(lambda: len(calls) >= 2, what="two polls")
    before = j.skipped_total  # 0 on an idle machine
    j.scheduler.pause()  # the scheduler falls behind (a suspended host, a starved process)
    time.sleep(0.65)
    j.scheduler.resume()
    wait_for(lambda: j.skipped_total >= before + 4, what="the ~6 polls folded into one counted")
    assert j.skipped_total <= before + 20
