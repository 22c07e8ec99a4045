"""The snapshot as a readable table, the way nvidia-smi shows a host (gpumon once).

The default table fits 80 columns, as nvidia-smi's does: GPU, Temp, Power, Util, Memory, Throttle,
Procs, with the GPU name in the title when every GPU has the same one (a Name column otherwise).
``wide`` (``gpumon once --wide``, or a terminal of WIDE_COLUMNS or more) adds Bus-Id, SM clock,
P-state, ECC and NVLink; in a terminal narrower than that table it comes in parts one under the
other, each part led by the GPU and Name columns (no column dropped or cut). Simulated GPUs (the
fake backend) say so in the title and below the table.

Every string that comes from outside gpumon (a process's name and user, a GPU's name, a driver's
version, a lost GPU's reason) is shown as text: never read as rich markup (a process named ``[/]``
or ``[bold]``), and with control characters (an ANSI escape sequence, a bidi override) shown as
``\\x1b``-style escapes rather than written to the operator's terminal.
"""

from __future__ import annotations

import sys

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpumon.model.snapshot import GpuSnapshot, ProcessSnapshot, Snapshot
from gpumon.util.outside_text import shown

GIB = 1024**3
NARROW_COLUMNS = 80
"""The default table's width, and the width the output is laid out for when stdout is not a terminal."""
WIDE_COLUMNS = 150
"""A terminal this wide (or wider) gets the wide table without asking."""
SIMULATED_NOTE = "simulated GPUs (--backend fake): not real hardware"


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


def _procs(gpu: GpuSnapshot) -> str:
    return str(len(gpu.processes)) if gpu.processes is not None else "n/a"


def _one_name(snapshot: Snapshot) -> str | None:
    """The GPUs' name when every GPU has the same one."""
    names = {gpu.name for gpu in snapshot.gpus}
    return names.pop() if len(names) == 1 else None


def _short_name(name: str | None) -> str:
    """A GPU's name without the vendor every NVIDIA GPU's name starts with (as nvidia-smi's 80 columns)."""
    return (name or "?").removeprefix("NVIDIA ")


def _where(process: ProcessSnapshot, wide: bool) -> str:
    """Where a process runs: its container (12 characters, as ``docker ps``, unless wide), pod, job or unit."""
    if process.container_id:
        return process.container_id if wide else process.container_id[:12]
    return process.pod_uid or process.slurm_job_id or process.systemd_unit or ""


def _lost(gpu: GpuSnapshot, prefix: str) -> Text:
    """A lost GPU's reason in red, as text."""
    lost = Text(prefix) + shown(gpu.lost_reason)
    lost.stylize("red")
    return lost


def _title(snapshot: Snapshot, name_in_title: bool) -> Text:
    host = snapshot.host
    count = len(snapshot.gpus)
    gpus = Text(f"{count} x ") + shown(snapshot.gpus[0].name) if name_in_title else Text(f"{count} GPU(s)")
    title = Text("Driver ") + shown(host.driver_version) + Text("   CUDA ") + shown(host.cuda_driver_version)
    title += Text("   ") + gpus
    if host.simulated:
        title += Text(" (simulated)", style="bold yellow")
    return title


WIDE_HEADERS = (
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
)
IDENTIFYING = ("GPU", "Name")
"""The wide table's columns that every part of it repeats when it is cut to fit the terminal."""
_WRAPS = ("Name", "Throttle")


def _wide_cells(gpu: GpuSnapshot) -> tuple[Text | str, ...]:
    """One GPU's cells, in WIDE_HEADERS' order; a lost GPU's reason stands in every figure's place."""
    if not gpu.up:
        return (str(gpu.index), shown(gpu.name), shown(gpu.pci_bus_id), _lost(gpu, "LOST: "), *([""] * 9))
    memory = "n/a"
    if gpu.memory_used_bytes is not None and gpu.memory_total_bytes:
        memory = f"{gpu.memory_used_bytes / GIB:.1f} / {gpu.memory_total_bytes / GIB:.1f} GiB"
    clocks = gpu.clocks_hertz or {}
    return (
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
        _procs(gpu),
    )


def _column_widths(rows: list[tuple[Text | str, ...]]) -> list[int]:
    """Each column's width in the terminal with its padding and rule (3 characters)."""
    cells = [WIDE_HEADERS, *rows]
    return [3 + max(_cell_len(row[i]) for row in cells) for i in range(len(WIDE_HEADERS))]


def _cell_len(cell: Text | str) -> int:
    return (Text(cell) if isinstance(cell, str) else cell).cell_len


def _column_groups(widths: list[int], columns: int) -> list[list[int]]:
    """WIDE_HEADERS' indexes in groups that each fit ``columns``, every group led by the identifying
    columns; one group when the whole table fits."""
    lead = [WIDE_HEADERS.index(h) for h in IDENTIFYING]
    lead_width = 1 + sum(widths[i] for i in lead)
    groups: list[list[int]] = [list(lead)]
    used = lead_width
    for i in range(len(WIDE_HEADERS)):
        if i in lead:
            continue
        if used + widths[i] > columns and len(groups[-1]) > len(lead):
            groups.append(list(lead))
            used = lead_width
        groups[-1].append(i)
        used += widths[i]
    return groups


def wide_tables(snapshot: Snapshot, columns: int | None = None) -> list[Table]:
    """Every column (about 150 characters wide): one table when it fits ``columns`` (None: always),
    else parts of it one under the other, each part with the GPU and Name columns, so no column is
    dropped or cut."""
    rows = [_wide_cells(gpu) for gpu in snapshot.gpus]
    widths = _column_widths(rows)
    groups = _column_groups(widths, columns) if columns is not None else [list(range(len(WIDE_HEADERS)))]
    tables = []
    for number, group in enumerate(groups):
        title = _title(snapshot, name_in_title=False) if number == 0 else None
        table = Table(title=title, title_justify="left")
        for i in group:
            header = WIDE_HEADERS[i]
            table.add_column(header, no_wrap=header not in _WRAPS, overflow="fold" if header in _WRAPS else "ellipsis")
        for gpu, row in zip(snapshot.gpus, rows, strict=True):
            cells = [row[i] for i in group]
            if not gpu.up and 3 not in group:  # the part without the lost reason says LOST
                cells[len(IDENTIFYING)] = Text("LOST", style="red")
            table.add_row(*cells)
        tables.append(table)
    return tables


def narrow_table(snapshot: Snapshot) -> Table:
    """The columns a newcomer needs first, in 80 columns: no frame at the sides, no vertical rules."""
    one_name = _one_name(snapshot) is not None
    table = Table(
        title=_title(snapshot, name_in_title=one_name),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("GPU", no_wrap=True, justify="right")
    if not one_name:
        table.add_column("Name", overflow="fold", min_width=14, max_width=16)
    for column in ("Temp", "Power W", "Util", "Memory GiB"):
        table.add_column(column, no_wrap=True, justify="right")
    table.add_column("Throttle", overflow="fold", max_width=None if one_name else 12)
    table.add_column("Procs", no_wrap=True, justify="right")
    for gpu in snapshot.gpus:
        name = () if one_name else (shown(_short_name(gpu.name)),)
        if not gpu.up:
            table.add_row(str(gpu.index), *name, Text("LOST", style="red"), "", "", "", _lost(gpu, ""), "")
            continue
        memory = "n/a"
        if gpu.memory_used_bytes is not None and gpu.memory_total_bytes:
            memory = f"{gpu.memory_used_bytes / GIB:.1f}/{gpu.memory_total_bytes / GIB:.0f}"
        table.add_row(
            str(gpu.index),
            *name,
            _fmt(gpu.temperature_celsius, ".0f") + "°C",
            f"{_fmt(gpu.power_watts, '.0f')}/{_fmt(gpu.power_limit_watts, '.0f')}",
            _fmt(None if gpu.utilization_ratio is None else gpu.utilization_ratio * 100, ".0f") + "%",
            memory,
            shown(_throttle(gpu)),
            _procs(gpu),
        )
    return table


def processes_table(snapshot: Snapshot, wide: bool) -> Table | None:
    processes = [(g.index, p) for g in snapshot.gpus for p in (g.processes or ())]
    if not processes:
        return None
    if wide:
        procs = Table(title="Compute processes", title_justify="left")
    else:
        procs = Table(
            title="Compute processes", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
        )
    for column in ("GPU", "PID", "User", "Name", "GPU memory", "Where"):
        fold = column in ("User", "Name", "Where")
        procs.add_column(column, overflow="fold" if fold else "ellipsis", no_wrap=not fold)
    for index, p in processes:
        where = _where(p, wide)
        mem = "n/a" if p.used_memory_bytes is None else f"{p.used_memory_bytes / GIB:.2f} GiB"
        procs.add_row(str(index), str(p.pid), shown(p.user), shown(p.name), mem, shown(where, ""))
    return procs


def print_snapshot(snapshot: Snapshot, console: Console | None = None, wide: bool | None = None) -> None:
    """Print the GPU table and the processes. ``wide``: None chooses by the terminal's width (a pipe
    or file gets the 80-column table); ``console`` defaults to stdout."""
    if console is None:
        tty = sys.stdout.isatty()
        console = Console(width=None if tty else (160 if wide else NARROW_COLUMNS))
    if wide is None:
        wide = console.width >= WIDE_COLUMNS and console.is_terminal
    for table in wide_tables(snapshot, console.width) if wide else [narrow_table(snapshot)]:
        console.print(table)
    if snapshot.host.simulated:
        console.print(f"[yellow]{SIMULATED_NOTE}[/yellow]")
    procs = processes_table(snapshot, wide)
    if procs is not None:
        console.print(procs)
