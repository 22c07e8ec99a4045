"""The verdict table: one column per test when the terminal is wide enough (or ``--wide``), else a compact one.

The wide table has a cell per test and per GPU (telemetry included: a GPU lost mid-run fails
there), the rates, power and peak temperature. Where it does not fit the console (80 columns
holds the compact one with any number of tests), each row says PASS, or FAIL and the tests it
failed, next to the rates; never a cut header or cell.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpumon.util.outside_text import shown

SIMULATED_CELL = "sim."
SIMULATED_NOTE = "power and temperature of simulated GPUs (--backend fake), not measured"
TITLE = "gpumon burn — verdict"


def verdict_table(report: dict[str, Any], console: Console, tests: tuple[str, ...], wide: bool) -> tuple[Table, int]:
    """(the wide table when ``wide`` or when it fits ``console``'s width, else the compact one; the width to
    print it at: the wide table's own under ``wide``, never cut)."""
    columns = _tests_shown(report, tests)
    full = _table(report, columns, compact=False)
    needed = Measurement.get(console, console.options.update_width(10_000), full).maximum
    if wide or needed <= console.width:
        return full, max(needed, console.width) if wide else console.width
    return _table(report, columns, compact=True), console.width


def _tests_shown(report: dict[str, Any], tests: tuple[str, ...]) -> tuple[str, ...]:
    """The selected tests, and telemetry wherever a GPU has a verdict for it."""
    has_telemetry = any("telemetry" in (g.get("tests") or {}) for g in report["gpus"])
    return tests + (("telemetry",) if has_telemetry and "telemetry" not in tests else ())


def _table(report: dict[str, Any], tests: tuple[str, ...], compact: bool) -> Table:
    multi = len({g["node"] for g in report["gpus"]}) > 1
    table = Table(title=TITLE, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD, pad_edge=not compact)
    table.add_column("GPU", no_wrap=True)
    table.add_column("model", no_wrap=True)
    if compact:
        table.add_column("result", min_width=max(len(t) for t in tests) if tests else 6)  # a test name never split
    else:
        for t in tests:
            table.add_column(t, no_wrap=True)
    table.add_column("TFLOP/s", justify="right", no_wrap=True)
    table.add_column("mem GB/s" if not compact else "mem\nGB/s", justify="right", no_wrap=True)
    table.add_column("busbw GB/s" if not compact else "busbw\nGB/s", justify="right", no_wrap=True)
    if not compact:
        table.add_column("power W (limit)", justify="right", no_wrap=True)
    table.add_column("peak °C" if not compact else "peak\n°C", justify="right", no_wrap=True)
    for g in report["gpus"]:
        table.add_row(*_row(g, tests, multi, compact))
    return table


def _row(g: dict[str, Any], tests: tuple[str, ...], multi: bool, compact: bool) -> list[str | Text]:
    tel = g.get("telemetry") or {}
    power = _fmt(tel.get("power_sustained_watts"))
    if tel.get("power_limit_watts"):
        power += f" ({tel['power_limit_watts']:.0f})"
    peak = _fmt(tel.get("temperature_peak_celsius"))
    if tel.get("simulated"):  # the fake backend's figures: not shown as if measured
        power = peak = SIMULATED_CELL
    notes = g.get("notes") or {}
    verdicts = {t: g["tests"].get(t) for t in tests}
    cells = [_mark(verdicts[t], notes.get(t)) for t in tests] if not compact else [_result(verdicts, notes)]
    tflops = (g.get("matmul") or {}).get("tflops")
    figures = [
        _fmt(tflops, 1, 1 if (tflops or 0) >= 10 else 3),
        _fmt((g.get("memory") or {}).get("bandwidth_bytes_per_second"), 1e9),
        _fmt((g.get("allreduce") or {}).get("busbw_bytes_per_second"), 1e9, 1),
    ]
    return [
        shown(f"{g['node']}:{g['gpu']}") if multi else str(g["gpu"]),
        shown(short_model(str(g.get("model") or "?")) if compact else g.get("model")),  # the driver's words: text
        *cells,
        *figures,
        *([power] if not compact else []),
        peak,
    ]


def short_model(model: str) -> str:
    """ "NVIDIA H200" -> "H200", "NVIDIA H100 80GB HBM3" -> "H100 80GB": the name without the vendor, two words."""
    words = model.removeprefix("NVIDIA ").split()
    return " ".join(words[:2]) or "?"


def _result(verdicts: dict[str, bool | None], notes: dict[str, str]) -> str:
    failed = [t for t, v in verdicts.items() if v is False]
    if failed:
        return "[bold red]FAIL[/] " + ", ".join(failed)
    if not any(v is True for v in verdicts.values()):
        return "[dim]—[/]"
    return "[green]PASS[/]" + ("*" if any(notes.get(t) for t in verdicts) else "")


def _fmt(value: float | None, scale: float = 1.0, digits: int = 0, unit: str = "") -> str:
    return "—" if value is None else f"{value / scale:.{digits}f}{unit}"


def _mark(passed: bool | None, note: str | None = None) -> str:
    """A GPU's cell for one test: what that GPU did; ``*`` when a note under the table goes with it."""
    mark = {True: "[green]PASS[/]", False: "[bold red]FAIL[/]", None: "[dim]—[/]"}[passed]
    return mark + "*" if note else mark
