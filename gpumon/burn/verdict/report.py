"""The burn report: JSON (every figure and threshold) and the verdict table on the terminal."""

from __future__ import annotations

import platform
from typing import Any

from rich.console import Console
from rich.markup import escape

from gpumon.burn.verdict.errors import EXIT_CANNOT_RUN, EXIT_FAULT, EXIT_PASSED
from gpumon.burn.verdict.judgement import Judgement
from gpumon.burn.verdict.table import SIMULATED_CELL, SIMULATED_NOTE, verdict_table

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


def render(report: dict[str, Any], console: Console, tests: tuple[str, ...], wide: bool = False) -> None:
    """Per-GPU verdict table (``verdict.table``), the notes, the tails, then the faults and one verdict line."""
    table, width = verdict_table(report, console, tests, wide)
    if width > console.width:  # --wide: the whole table, lines longer than the terminal rather than cut cells
        wider = Console(file=console.file, width=width, force_terminal=console.is_terminal, no_color=console.no_color)
        wider.print(table, crop=False)
    else:
        console.print(table)
    multi = len({g["node"] for g in report["gpus"]}) > 1
    if any((g.get("telemetry") or {}).get("simulated") for g in report["gpus"]):
        console.print(f"{SIMULATED_CELL}: {SIMULATED_NOTE}", highlight=False)
    for g in report["gpus"]:
        for t, note in (g.get("notes") or {}).items():
            where = f"node {g['node']} GPU {g['gpu']}" if multi else f"GPU {g['gpu']}"
            console.print(f"* {escape(where)} {escape(t)}: {escape(note)}", highlight=False)
    for line in tail_lines(report):
        console.print(escape(line), highlight=False)
    for line in report["faults"]:
        console.print(f"[bold red]FAULT[/] {escape(line)}", highlight=False)
    for line in report["could_not_run"]:
        console.print(f"[bold yellow]COULD NOT RUN[/] {escape(line)}", highlight=False)
    console.print(escape(verdict_line(report)), highlight=False)


def tail_lines(report: dict[str, Any]) -> list[str]:
    """Per-iteration tails: each GPU's GEMM p50/p99 and slowest, the first rank's all-reduce p50/p99 per size."""
    multi = len({g["node"] for g in report["gpus"]}) > 1
    lines = []
    for g in report["gpus"]:
        mm = g.get("matmul") or {}
        if "p99_ms" in mm:
            where = f"node {g['node']} GPU {g['gpu']}" if multi else f"GPU {g['gpu']}"
            worst = (mm.get("slowest") or [{}])[0]
            lines.append(
                f"tails {where} GEMM: p50 {mm['p50_ms']:.3f} ms, p99 {mm['p99_ms']:.3f} ms, slowest "
                f"{worst.get('ms', 0):.3f} ms at {worst.get('at_seconds', 0):.1f} s"
            )
    first = next((g for g in report["gpus"] if (g.get("allreduce") or {}).get("tails")), None)
    if first is not None:
        sizes = ", ".join(
            f"{_size(t['bytes'])} p50 {t['p50_ms'] * 1e3:.0f}/p99 {t['p99_ms'] * 1e3:.0f} µs"
            for t in first["allreduce"]["tails"]
        )
        lines.append(f"tails all-reduce (rank {first['rank']}, one op at a time): {sizes}")
    return lines


def _size(nbytes: int) -> str:
    return f"{nbytes >> 30} GiB" if nbytes >= 1 << 30 else f"{nbytes >> 20} MiB"


def verdict_line(report: dict[str, Any]) -> str:
    n = len(report["gpus"])
    if report["exit_code"] == EXIT_PASSED:
        return f"burn: PASS — {n} GPU(s), every test passed ({report['duration_seconds']:.0f} s)"
    if report["exit_code"] == EXIT_FAULT:
        return f"burn: FAIL — {report['faults'][0]}" + (
            f" (+{len(report['faults']) - 1} more)" if len(report["faults"]) > 1 else ""
        )
    return f"burn: COULD NOT RUN — {report['could_not_run'][0]}"
