"""The detectors observe the snapshots the poll hands them when they are next asked, and answer what
observing each one as it came answers.

The daemon's poll thread only hands each snapshot over (a list append); the stragglers, trends, stuck
profiling and stuck processes observe them, in order, at the next question (the alert tick every 5 s, a
scrape) or once ``BATCH_POLLS`` wait. Over random snapshot sequences, with a burn starting and ending and
questions at random moments, their findings and series equal those of detectors that observed each
snapshot at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumon.health.detectors import BATCH_POLLS, Detectors
from tests.health.test_report_asked_often import CATALOG, Inputs, config, gpu_state

poll = st.tuples(
    st.sampled_from([1.0, 30.0, 30.0]),  # seconds since the poll before
    st.one_of(st.just({}), st.dictionaries(st.integers(0, 2), gpu_state, max_size=1)),  # GPUs that change
    st.sampled_from([False, False, False, True]),  # a burn runs
    st.sampled_from([None, None, None, 0.0, 4.0, 200.0]),  # asked this long after the poll (None: not asked)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(poll, min_size=1, max_size=3 * BATCH_POLLS))
def test_what_they_answer_is_what_observing_each_snapshot_at_once_answers(
    tmp_path: Path, polls: list[tuple[float, dict[int, dict[str, Any]], bool, float | None]]
) -> None:
    handed, at_once = Detectors.of(config(tmp_path), CATALOG), Detectors.of(config(tmp_path), CATALOG)
    inputs = Inputs()
    for seconds, changes, burning, asked_after in [*polls, (0.0, {}, False, 0.0)]:
        snapshot = inputs.advance(seconds, changes)
        handed.take(snapshot, burning)
        at_once.observe(snapshot, burning)
        assert len(handed.pending) < BATCH_POLLS
        if asked_after is not None:
            now = snapshot.timestamp_seconds + asked_after
            assert handed.findings(now, burning) == at_once.findings(now, burning)
            assert handed.signals(now) == at_once.signals(now)
