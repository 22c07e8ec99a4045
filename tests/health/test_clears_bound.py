"""Operator clears past the read bound: the newest always counts (issue 41, item 8)."""

from __future__ import annotations

import json
from pathlib import Path

from gpumon.health import clears
from gpumon.health.clears import CLEARS_DIR, Clear, add_clear, read_clears
from gpumon.util.state.files import health_dir


def test_past_the_bound_a_new_clear_is_read_and_the_oldest_are_the_ones_left_unread(tmp_path: Path) -> None:
    state = tmp_path / "state"
    folder = health_dir(state) / CLEARS_DIR
    folder.mkdir(parents=True)
    bound = clears._MAX_CLEAR_FILES
    for i in range(bound):  # a full audit trail of old clears of GPU 0, as add_clear names them
        at = 1_000_000 + i
        (folder / f"{at * 10**9:020d}-1-ops.json").write_text(
            json.dumps({"gpu": 0, "reason": f"old {i}", "at_seconds": at, "user": "ops"})
        )
    add_clear(state, Clear(gpu=1, reason="reseated, passed burn", at_seconds=2_000_000_000.0, user="ops"))

    read = read_clears(health_dir(state))
    assert read.unreadable == []
    assert len(read.clears) == bound
    assert Clear(gpu=1, reason="reseated, passed burn", at_seconds=2_000_000_000.0, user="ops") in read.clears
    assert all(c.reason != "old 0" for c in read.clears)  # the oldest one is the one not read
