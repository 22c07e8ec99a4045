"""The health service's plain files: the inventory baseline (``inventory.json`` in the health folder), the
kernel's boot id, and the stat key that says whether a file was rewritten."""

from __future__ import annotations

from pathlib import Path

from gpumon.health.inventory import Inventory
from gpumon.util.state.files import STATE_FILE_MODE, health_dir, read_json, write_json
from gpumon.util.state.lock import state_lock


def read_boot_id(path: Path) -> str | None:
    """The kernel's boot id (changes at every boot), or None when unreadable."""
    try:
        return path.read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def save_inventory(state_dir: Path, inventory: Inventory, simulated: str | None = None) -> None:
    """Write the baseline into the health folder of ``state_dir`` (under its lock)."""
    folder = health_dir(state_dir, simulated)
    with state_lock(folder):
        write_json(folder / "inventory.json", inventory.to_json(), mode=STATE_FILE_MODE)


def load_inventory(state_dir: Path, simulated: str | None = None) -> Inventory | None:
    return Inventory.from_json(read_json(health_dir(state_dir, simulated) / "inventory.json"))
