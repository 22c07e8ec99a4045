"""The snapshot as a readable table, the way nvidia-smi shows a host (gpumon once).

Every string that comes from outside gpumon (a process's name and user, a GPU's name, a driver's
version, a lost GPU's reason) is shown as text: never read as rich markup (a process named ``[/]``
or ``[bold]``), and with control characters (an ANSI escape sequence, a bidi override) shown as
``\\x1b``-style escapes rather than written to the operator's terminal."""

from __future__ import annotations

import sys
import unicodedata

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpumon.snapshot import GpuSnapshot, Snapshot

GIB = 1024**3


def shown(value: object, missing: str = "?") -> Text:
    """``value`` (from outside: a process name, a user, a GPU name) as plain text for the terminal:
    no markup, and every control or format character (C0, C1, DEL, bidi overrides) as an escape."""
    if value is None or value == "":
        return Text(missing)
    text = str(value)
    return Text("".join(_escape(c) if unicodedata.category(c) in _HIDDEN else c for c in text))


_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
"""Unicode categories never written raw: controls, format characters, surrogates, private use,
unassigned, line and paragraph separators."""


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _fmt(value: float | None, fmt: str, missing: str = "n/a") -> str:
    return missing if value is None else format(value, fmt)


def _throttle(gpu: GpuSnapshot) -> str:
    active = [r for r, on in (gpu.clock_events_active or {}).items() if on and r != "gpu_idle"]
    return ", ".join(active) if active else "-"


def _nvlinks(gpu: GpuSnapshot) -> str:
    if not gpu.nvlink_up:
        return "-"
    up = sum(1 for v in gpu.nvlink_up.values() if v)
    return f"{up}/{len(gpu.nvlink_up)}"


def _ecc(gpu: GpuSnapshot) -> str:
    if gpu.ecc_mode_enabled is None:
        return "n/a"
    if not gpu.ecc_mode_enabled:
        return "off"
    errors = gpu.ecc_errors_total or {}
    return f"on, {errors.get('uncorrected_volatile', 0)} uncorr"


def print_snapshot(snapshot: Snapshot, console: Console | None = None) -> None:
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    host = snapshot.host
    title = (
        Text("Driver ")
        + shown(host.driver_version)
        + Text("   CUDA ")
        + shown(host.cuda_driver_version)
        + Text(f"   {len(snapshot.gpus)} GPU(s)")
    )
    table = Table(title=title, title_justify="left")
    for column in (
        "GPU",
        "Name",
        "Bus-Id",
        "Temp",
        "Power / Cap",
        "Util",
        "Memory",
        "SM clock",
        "Perf",
        "Throttle",
        "ECC",
        "NVLink",
        "Procs",
    ):
        table.add_column(column, no_wrap=column not in ("Name", "Throttle"))
    for gpu in snapshot.gpus:
        if not gpu.up:
            lost = Text("LOST: ", style="red") + shown(gpu.lost_reason)
            lost.stylize("red")
            table.add_row(str(gpu.index), shown(gpu.name), shown(gpu.pci_bus_id), lost)
            continue
        memory = "n/a"
        if gpu.memory_used_bytes is not None and gpu.memory_total_bytes:
            memory = f"{gpu.memory_used_bytes / GIB:.1f} / {gpu.memory_total_bytes / GIB:.1f} GiB"
        clocks = gpu.clocks_hertz or {}
        table.add_row(
            str(gpu.index),
            shown(gpu.name),
            shown(gpu.pci_bus_id),
            _fmt(gpu.temperature_celsius, ".0f") + "°C",
            f"{_fmt(gpu.power_watts, '.0f')} / {_fmt(gpu.power_limit_watts, '.0f')} W",
            _fmt(None if gpu.utilization_ratio is None else gpu.utilization_ratio * 100, ".0f") + "%",
            memory,
            _fmt(None if "sm" not in clocks else clocks["sm"] / 1e6, ".0f") + " MHz",
            "P" + _fmt(gpu.performance_state, "d", "?"),
            shown(_throttle(gpu)),
            _ecc(gpu),
            _nvlinks(gpu),
            str(len(gpu.processes)) if gpu.processes is not None else "n/a",
        )
    console.print(table)
    processes = [(g.index, p) for g in snapshot.gpus for p in (g.processes or ())]
    if processes:
        procs = Table(title="Compute processes", title_justify="left")
        for column in ("GPU", "PID", "User", "Name", "GPU memory", "Where"):
            procs.add_column(column)
        for index, p in processes:
            where = p.container_id or p.pod_uid or p.slurm_job_id or p.systemd_unit or ""
            mem = "n/a" if p.used_memory_bytes is None else f"{p.used_memory_bytes / GIB:.2f} GiB"
            procs.add_row(str(index), str(p.pid), shown(p.user), shown(p.name), mem, shown(where, ""))
        console.print(procs)
