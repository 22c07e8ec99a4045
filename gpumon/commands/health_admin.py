"""``gpumon health clear`` and ``gpumon health accept-inventory``: the admin commands (not checks) that record
an operator's clear and make the GPUs seen now the expected inventory. Exit codes: 0 done, 1 could not,
2 bad input."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import sys
import time
from pathlib import Path

from gpumon.commands.health_local import poll_within
from gpumon.commands.support import load_or_report
from gpumon.config.file import Config
from gpumon.health.clears import Clear, add_clear
from gpumon.health.config import HealthConfig
from gpumon.health.health_files import load_inventory

EXIT_USAGE = 2
"""``clear`` / ``accept-inventory``: bad input."""

log = logging.getLogger("gpumon")


def node_gpus(config: Config, state_dir: Path, simulated: str | None = None) -> list[int]:
    """The GPU indices of this node: the inventory baseline's and those a poll sees now (empty when
    neither can be read)."""
    from gpumon.backends.base import ScenarioError
    from gpumon.backends.factory import make_backend

    indices: set[int] = set()
    inventory = load_inventory(state_dir, simulated)
    if inventory is not None:
        indices.update(g.index for g in inventory.gpus)
    try:
        backend = make_backend(config.backend, config.fake_gpus)
    except ScenarioError:
        return sorted(indices)
    snapshot = poll_within(backend, (config.health or HealthConfig()).poll_timeout_seconds)
    if snapshot is not None:
        if snapshot.nvml_up:
            indices.update(g.index for g in snapshot.gpus)
        try:
            backend.shutdown()
        except Exception:
            log.debug("backend shutdown failed", exc_info=True)
    return sorted(indices)


def cmd_clear(args: argparse.Namespace) -> int:
    """Record an operator clear where the daemon reads it (docs/health.md "Who may clear"): root, the state
    directory's owner or its admin group only, refused with nothing written otherwise; never in another
    folder than the configured state directory (a clear the daemon never sees is no clear)."""
    if args.gpu < 0:
        print(f"gpumon: --gpu must be a GPU index (0 or more), got {args.gpu}", file=sys.stderr)
        return EXIT_USAGE
    if not args.reason.strip():
        print("gpumon: --reason must say what was done (it is recorded)", file=sys.stderr)
        return EXIT_USAGE
    state = _admin_state(args, "clear faults")
    if isinstance(state, int):
        return state
    config, simulated = state
    gpus = node_gpus(config, Path(config.state_dir), simulated)
    if gpus and args.gpu not in gpus:
        listed = ", ".join(str(i) for i in gpus)
        print(f"gpumon: this node has no GPU {args.gpu} (its GPUs: {listed}); nothing recorded", file=sys.stderr)
        return EXIT_USAGE
    if not gpus:
        log.warning("cannot tell which GPUs this node has (no inventory baseline, NVML unavailable)")
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    clear = Clear(gpu=args.gpu, reason=args.reason.strip(), at_seconds=time.time(), user=user)
    try:
        add_clear(config.state_dir, clear, simulated)
    except OSError as exc:
        print(f"gpumon: cannot record the clear in {config.state_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"cleared GPU {args.gpu}'s XID faults and failed burns up to now ({user}: {clear.reason})")
    return 0


def _admin_state(args: argparse.Namespace, what: str) -> tuple[Config, str | None] | int:
    """The configuration, whose state directory the caller may ``what`` in, and the simulated backend's spec
    (its state apart, gpumon.util.state.files.health_dir) or None; else an exit code."""
    from gpumon.backends.factory import simulated_spec
    from gpumon.commands.admin_access import refusal

    config = load_or_report(args)
    if config is None:
        return EXIT_USAGE
    level = getattr(logging, (args.log_level or "warning").upper())
    logging.basicConfig(level=level, format="gpumon: %(message)s", stream=sys.stderr)
    refused = refusal(config.state_dir, what)
    if refused is not None:
        print(f"gpumon: {refused}", file=sys.stderr)
        return 1
    return config, simulated_spec(config.backend)


def cmd_accept_inventory(args: argparse.Namespace) -> int:
    state = _admin_state(args, "accept the inventory")
    if isinstance(state, int):
        return state
    config, simulated = state
    state_dir = config.state_dir
    from gpumon.backends.base import ScenarioError
    from gpumon.backends.factory import make_backend
    from gpumon.collect.poller import Poller
    from gpumon.collect.store import SnapshotStore
    from gpumon.health.drift import drift
    from gpumon.health.health_files import save_inventory
    from gpumon.health.inventory import inventory_of, pci_gpus

    try:
        backend = make_backend(config.backend, config.fake_gpus)
    except ScenarioError as exc:
        print(f"gpumon: bad scenario file:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    snapshot = Poller(backend, SnapshotStore()).poll()
    backend.shutdown()
    if not snapshot.nvml_up:
        print(f"gpumon: NVML unavailable ({snapshot.nvml_error}); the inventory is unchanged", file=sys.stderr)
        return 1
    old = load_inventory(state_dir, simulated)
    inventory = inventory_of(snapshot, time.time(), source="accepted")
    try:
        save_inventory(state_dir, inventory, simulated)
    except (OSError, TimeoutError) as exc:
        print(f"gpumon: cannot write the inventory in {state_dir}: {exc}", file=sys.stderr)
        return 1
    before = f" (was {len(old.gpus)} GPU(s), driver {old.driver_version})" if old else ""
    print(f"inventory accepted: {len(inventory.gpus)} GPU(s), driver {inventory.driver_version}{before}")
    health = config.health or HealthConfig()
    sysfs = health.sysfs_root or (None if backend.simulated else Path("/sys"))
    remaining = drift(inventory, snapshot, pci_gpus(sysfs) if sysfs else None, health.expected_gpu_count)
    for finding in remaining:  # what an accepted inventory does not silence (docs/health.md)
        print(f"still reported: {finding.severity} {finding.summary}")
    return 0
