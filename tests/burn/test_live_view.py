"""The live view while a burn runs: a rank that stops shows its silence, not its last rate."""

from __future__ import annotations

import io
import time

from rich.console import Console

from gpumon.burn.orchestration.agent import RankState
from gpumon.burn.orchestration.live import LiveView


def _view() -> tuple[LiveView, io.StringIO]:
    out = io.StringIO()
    return LiveView(Console(file=out, force_terminal=False, width=200), watcher=None), out


def test_a_rank_that_stopped_shows_how_long_it_has_been_silent_not_its_last_tflops():
    view, out = _view()
    st = RankState(rank=1, gpu=1, node=0, test="matmul", collective=None, ready=True)
    st.metrics = {"tflops": 655.4}
    st.last_progress = time.monotonic() - 12
    view.update({1: st})
    line = out.getvalue()
    assert "no progress for 12 s" in line and "655.4" not in line


def test_a_rank_that_reports_shows_its_rate_and_one_waiting_in_a_collective_says_so():
    view, out = _view()
    busy = RankState(rank=0, gpu=0, node=0, test="matmul", collective=None, ready=True)
    busy.metrics = {"tflops": 655.4}
    waiting = RankState(rank=1, gpu=1, node=0, test="allreduce", collective="barrier", ready=True)
    waiting.last_progress = time.monotonic() - 7
    view.update({0: busy, 1: waiting})
    text = out.getvalue()
    assert "655.4 TFLOP/s" in text
    assert "allreduce (waiting: barrier): waiting 7 s" in text


def test_piped_progress_names_each_figure_and_a_cpu_rate_is_not_zero_tflops():
    """Issue 46.6: piped lines read "sim. sim. sim." with no rate, and a CPU showed "0.0 TFLOP/s"."""
    view, out = _view()
    cpu = RankState(rank=0, gpu=0, node=0, test="matmul", collective=None, ready=True)
    cpu.metrics = {"tflops": 0.0312}
    view.update({0: cpu})
    line = out.getvalue()
    assert "rate 31.2 GFLOP/s" in line and "0.0 TFLOP/s" not in line
    for label in ("temperature —", "power —", "SM clock —", "errors 0"):
        assert label in line, line
