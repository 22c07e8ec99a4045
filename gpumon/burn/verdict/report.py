"""The burn report: JSON (every figure and threshold) and the verdict table on the terminal."""

from __future__ import annotations

import platform
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpumon.burn.verdict.errors import EXIT_CANNOT_RUN, EXIT_FAULT, EXIT_PASSED
from gpumon.burn.verdict.judgement import Judgement
from gpumon.util.outside_text import shown

SCHEMA_VERSION = 1


def exit_code(j: Judgement) -> int:
    """1 when a fault is found (even if part of the run could not run), 3 when nothing was judged, else 0."""
    if j.faults:
        return EXIT_FAULT
    if j.cannot_run:
        return EXIT_CANNOT_RUN
    return EXIT_PASSED


def build(
    j: Judgement,
    *,
    options: dict[str, Any],
    thresholds: dict[str, Any],
    started_at: float,
    finished_at: float,
    injection: str,
) -> dict[str, Any]:
    """The JSON report written to --json and <state_dir>/burn/last.json (see docs/burn.md)."""
    code = exit_code(j)
    return {
        "schema": SCHEMA_VERSION,
        "tool": "gpumon burn",
        "hostname": platform.node(),
        "started_at": started_at,
        "finished_at": finished_at,
        "duration_seconds": finished_at - started_at,
        "verdict": {EXIT_PASSED: "pass", EXIT_FAULT: "fail", EXIT_CANNOT_RUN: "could_not_run"}[code],
        "exit_code": code,
        "faults": j.faults,
        "could_not_run": j.cannot_run,
        "options": options,
        "fault_injection": injection or None,
        "thresholds": thresholds,
        "gpus": [{k: v for k, v in g.items()} for _key, g in sorted(j.gpus.items())],
        "checks": j.checks,
    }


SIMULATED_CELL = "sim."
SIMULATED_NOTE = "power and temperature of simulated GPUs (--backend fake), not measured"


def _fmt(value: float | None, scale: float = 1.0, digits: int = 0, unit: str = "") -> str:
    return "—" if value is None else f"{value / scale:.{digits}f}{unit}"


def _mark(passed: bool | None, note: str | None = None) -> str:
    """A GPU's cell for one test: what that GPU did; ``*`` when a note under the table goes with it."""
    mark = {True: "[green]PASS[/]", False: "[bold red]FAIL[/]", None: "[dim]—[/]"}[passed]
    return mark + "*" if note else mark


def render(report: dict[str, Any], console: Console, tests: tuple[str, ...]) -> None:
    """Per-GPU verdict table, then the faults, then one verdict line."""
    table = Table(title="gpumon burn — verdict", show_lines=False)
    multi = len({g["node"] for g in report["gpus"]}) > 1
    table.add_column("GPU")
    table.add_column("model")
    for t in tests:
        table.add_column(t)
    table.add_column("TFLOP/s", justify="right")
    table.add_column("mem GB/s", justify="right")
    table.add_column("busbw GB/s", justify="right")
    table.add_column("power W (limit)", justify="right")
    table.add_column("peak °C", justify="right")
    for g in report["gpus"]:
        tel = g.get("telemetry") or {}
        power = _fmt(tel.get("power_sustained_watts"))
        if tel.get("power_limit_watts"):
            power += f" ({tel['power_limit_watts']:.0f})"
        peak = _fmt(tel.get("temperature_peak_celsius"))
        if tel.get("simulated"):  # the fake backend's figures: not shown as if measured
            power = peak = SIMULATED_CELL
        table.add_row(
            shown(f"{g['node']}:{g['gpu']}") if multi else str(g["gpu"]),
            shown(g.get("model")),  # the driver's words: text, never markup
            *[_mark(g["tests"].get(t), (g.get("notes") or {}).get(t)) for t in tests],
            _fmt(
                (g.get("matmul") or {}).get("tflops"), 1, 1 if ((g.get("matmul") or {}).get("tflops") or 0) >= 10 else 3
            ),
            _fmt((g.get("memory") or {}).get("bandwidth_bytes_per_second"), 1e9),
            _fmt((g.get("allreduce") or {}).get("busbw_bytes_per_second"), 1e9, 1),
            power,
            peak,
        )
    console.print(table)
    if any((g.get("telemetry") or {}).get("simulated") for g in report["gpus"]):
        console.print(f"{SIMULATED_CELL}: {SIMULATED_NOTE}", highlight=False)
    for g in report["gpus"]:
        for t, note in (g.get("notes") or {}).items():
            where = f"node {g['node']} GPU {g['gpu']}" if multi else f"GPU {g['gpu']}"
            console.print(f"* {escape(where)} {escape(t)}: {escape(note)}", highlight=False)
    for line in report["faults"]:
        console.print(f"[bold red]FAULT[/] {escape(line)}", highlight=False)
    for line in report["could_not_run"]:
        console.print(f"[bold yellow]COULD NOT RUN[/] {escape(line)}", highlight=False)
    console.print(escape(verdict_line(report)), highlight=False)


def verdict_line(report: dict[str, Any]) -> str:
    n = len(report["gpus"])
    if report["exit_code"] == EXIT_PASSED:
        return f"burn: PASS — {n} GPU(s), every test passed ({report['duration_seconds']:.0f} s)"
    if report["exit_code"] == EXIT_FAULT:
        return f"burn: FAIL — {report['faults'][0]}" + (
            f" (+{len(report['faults']) - 1} more)" if len(report["faults"]) > 1 else ""
        )
    return f"burn: COULD NOT RUN — {report['could_not_run'][0]}"
