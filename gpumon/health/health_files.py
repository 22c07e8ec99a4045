"""The health service's plain files: the inventory baseline (``inventory.json`` in the health folder), the
kernel's boot id, and a damaged state file set aside."""

from __future__ import annotations

import logging
from pathlib import Path

from gpumon.health.inventory import Inventory
from gpumon.model.findings import WARNING, Finding
from gpumon.util.boundedfile import FileReadError, read_regular_file
from gpumon.util.state.files import STATE_FILE_MODE, health_dir, move_aside, read_json, write_json
from gpumon.util.state.lock import state_lock

MAX_BOOT_ID_BYTES = 4096
"""The kernel's boot id is 37 bytes; a file named in its place may hold at most this."""


def read_boot_id(path: Path) -> str | None:
    """The kernel's boot id (changes at every boot), or None when unreadable: only a regular file of at most
    MAX_BOOT_ID_BYTES is read (a FIFO named in its place would hang the check, /dev/zero never end)."""
    try:
        return read_regular_file(path, MAX_BOOT_ID_BYTES).decode("ascii").strip() or None
    except (FileReadError, UnicodeDecodeError):
        return None


def save_inventory(state_dir: Path, inventory: Inventory, simulated: str | None = None) -> None:
    """Write the baseline into the health folder of ``state_dir`` (under its lock)."""
    folder = health_dir(state_dir, simulated)
    with state_lock(folder):
        write_json(folder / "inventory.json", inventory.to_json(), mode=STATE_FILE_MODE)


def load_inventory(state_dir: Path, simulated: str | None = None) -> Inventory | None:
    return Inventory.from_json(read_json(health_dir(state_dir, simulated) / "inventory.json"))


def set_aside(path: Path, why: str, now_seconds: float, log: logging.Logger) -> Finding:
    """Move the damaged state file ``path`` aside (kept for the operator; ``now_seconds``: Unix time, in its
    new name), say so on ``log``, and the ``state_damaged`` finding that shows it while the process runs."""
    try:
        kept = f"moved aside to {move_aside(path, now_seconds).name}"
    except OSError as exc:
        kept = f"could not be moved aside: {exc.strerror or exc}"
    log.error("health state file %s is damaged (%s): %s; going on without it", path, why, kept)
    return Finding(
        kind="state_damaged",
        severity=WARNING,
        action="none",
        summary=f"{path.name} was damaged ({why}) and {kept}: what it held is not known",
        evidence={"path": str(path), "why": why},
    )
