"""The live view while the burn runs: per GPU the test, TFLOP/s or GB/s, temperature, power, clocks, errors.

A rich table redrawn in place on a terminal; plain progress lines (every few seconds and
on each test change) when stdout is not a TTY.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from gpumon.burn.orchestration.interrupts import signals_deferred
from gpumon.burn.orchestration.rank_state import RankState
from gpumon.burn.orchestration.watcher import Watcher

PLAIN_EVERY_SECONDS = 5.0
STALL_SECONDS = 3.0
"""A rank silent this long shows how long it has been silent instead of its last rate (workers report every 0.5 s)."""


def flop_rate(tflops: float) -> str:
    """ "655.3 TFLOP/s"; below 1 TFLOP/s (a CPU) in GFLOP/s, never "0.0 TFLOP/s"."""
    return f"{tflops:.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:.1f} GFLOP/s"


def _labelled(rate: str) -> str:
    """ "rate 655.3 TFLOP/s", "rate —" before the first figure, or the silence as it is ("waiting 7 s")."""
    if not rate:
        return "rate —"
    return f"rate {rate}" if rate[0].isdigit() else rate


class LiveView:
    """Call ``update(states)`` often; it redraws at most a few times a second."""

    def __init__(self, console: Console, watcher: Watcher | None, enabled: bool = True) -> None:
        self.console = console
        self.watcher = watcher
        self.enabled = enabled
        self.tty = console.is_terminal
        self.started = time.monotonic()
        self._live: Live | None = None
        self._last_draw = 0.0
        self._last_plain: dict[int, tuple[str, float]] = {}

    def __enter__(self) -> LiveView:
        if self.enabled and self.tty:
            live = Live(Table(), console=self.console, refresh_per_second=4, transient=True)
            with signals_deferred():  # a Ctrl-C inside Thread.start leaves a thread that cannot be joined
                live.__enter__()
                self._live = live
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def _row(self, st: RankState) -> list[str]:
        sample = self.watcher.latest(st.gpu) if self.watcher is not None else None
        rate = ""
        silent = time.monotonic() - st.last_progress
        if st.ready and not st.done and st.exit_code is None and silent >= STALL_SECONDS:  # start-up has its own limit
            rate = f"no progress for {silent:.0f} s" if st.collective is None else f"waiting {silent:.0f} s"
        elif "tflops" in st.metrics:
            rate = flop_rate(st.metrics["tflops"])
        elif "gbps" in st.metrics:
            rate = f"{st.metrics['gbps']:.1f} GB/s"
        test = st.test + (f" (waiting: {st.collective})" if st.collective else "")
        if st.done:
            test = "done"
        temp = f"{sample.temperature_celsius:.0f} °C" if sample and sample.temperature_celsius is not None else "—"
        power = f"{sample.power_watts:.0f} W" if sample and sample.power_watts is not None else "—"
        clock = f"{sample.sm_clock_hertz / 1e6:.0f} MHz" if sample and sample.sm_clock_hertz is not None else "—"
        if self.watcher is not None and self.watcher.backend.simulated:  # not measured: not shown as if it were
            temp = power = clock = "sim."
        return [str(st.gpu), str(st.rank), test, rate, temp, power, clock, str(len(st.errors))]

    def update(self, states: dict[int, RankState]) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self._live is not None:
            if now - self._last_draw < 0.25:
                return
            self._last_draw = now
            table = Table(title=f"gpumon burn — {now - self.started:.0f} s")
            for col in ("GPU", "rank", "test", "rate", "temp", "power", "SM clock", "errors"):
                table.add_column(col)
            for st in states.values():
                table.add_row(*self._row(st))
            self._live.update(table)
            return
        for st in states.values():
            last = self._last_plain.get(st.rank)
            if last is None or last[0] != st.test or now - last[1] >= PLAIN_EVERY_SECONDS:
                self._last_plain[st.rank] = (st.test, now)
                gpu, rank, test, rate, temp, power, clock, errors = self._row(st)
                self.console.print(
                    f"\\[{now - self.started:5.0f}s] GPU {gpu} rank {rank} {test}: {_labelled(rate)}, temperature "
                    f"{temp}, power {power}, SM clock {clock}, errors {errors}",
                    highlight=False,
                    soft_wrap=True,
                )
