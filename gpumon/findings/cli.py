"""``gpumon health``: the node verdict, operator clears, the inventory baseline, Slurm and NPD modes.

Exit codes (docs/health.md):

* default (Nagios / NHC): 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN;
* ``--mode npd`` (Kubernetes node-problem-detector custom plugin): 0 OK (also WARNING),
  1 problem (CRITICAL), 2 UNKNOWN; one line of at most 80 characters;
* ``--slurm-prolog``: 1 when the node is CRITICAL (Slurm requeues the job), else 0;
* ``--slurm-epilog``: 0;
* ``clear`` / ``accept-inventory``: 0 done, 1 could not, 2 bad input.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gpumon.backends.base import GpuBackend
from gpumon.config import Config
from gpumon.findings.config import HealthConfig
from gpumon.findings.model import ACTION_WORDS, CRITICAL, Finding, HealthReport
from gpumon.findings.service import STATUS_VALUES, HealthService, add_clear, load_inventory
from gpumon.findings.xid_lifecycle import Clear
from gpumon.jsonout import add_json_option, emit_json, to_stdout
from gpumon.snapshot import Snapshot

EXIT_USAGE = 2
NPD_MAX_OUTPUT = 80
"""node-problem-detector's default ``max_output_length`` for custom plugins."""
NPD_EXIT = {"OK": 0, "WARNING": 0, "CRITICAL": 1, "UNKNOWN": 2}

log = logging.getLogger("gpumon")


def configure(p: argparse.ArgumentParser) -> None:
    """Give ``gpumon health``'s parser (made by gpumon.cli) its description, options and commands."""
    from gpumon.cli import _add_common

    p.description = (
        "The node's health verdict with the findings and recommended actions behind it. "
        "Asks the running daemon (/api/health), else polls the GPUs itself."
    )
    _add_common(p)
    add_json_option(p, "the verdict")
    p.add_argument(
        "--mode",
        choices=["nagios", "npd"],
        default="nagios",
        help="exit codes: nagios (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN; also NHC) or npd "
        "(node-problem-detector: 0 OK, 1 problem, 2 unknown; one short line)",
    )
    p.add_argument("--local", action="store_true", help="do not ask the daemon; poll the GPUs here")
    p.add_argument("--daemon-url", dest="daemon_url", help="the daemon's /api/health URL (default from listen)")
    slurm = p.add_mutually_exclusive_group()
    slurm.add_argument("--slurm", action="store_true", help="Slurm HealthCheckProgram: drain / resume this node")
    slurm.add_argument("--slurm-prolog", dest="slurm_prolog", action="store_true", help="Slurm Prolog (fast)")
    slurm.add_argument(
        "--slurm-epilog", dest="slurm_epilog", action="store_true", help="Slurm Epilog (may burn a failed job's GPUs)"
    )
    p.set_defaults(func=cmd_health)
    hs = p.add_subparsers(dest="health_command", metavar="SUBCOMMAND")
    clear = hs.add_parser("clear", help="clear a GPU's XID faults after a repair (recorded with the reason)")
    _add_common(clear)
    clear.add_argument("--gpu", type=int, required=True, help="GPU index")
    clear.add_argument("--reason", required=True, help="what was done, e.g. 'reseated, passed burn'")
    clear.set_defaults(func=cmd_clear)
    accept = hs.add_parser("accept-inventory", help="make the GPUs seen now the expected inventory")
    _add_common(accept)
    accept.set_defaults(func=cmd_accept_inventory)


# ---- helpers ----------------------------------------------------------------
def _setup(args: argparse.Namespace) -> tuple[Config, Path] | int:
    from gpumon.cli import _usable_state_dir, load_or_report

    config = load_or_report(args)
    if config is None:
        return EXIT_USAGE
    level = getattr(logging, (args.log_level or "warning").upper())
    logging.basicConfig(level=level, format="gpumon: %(message)s", stream=sys.stderr)
    if not args.log_level:  # the verdict says it; the daemon's retry wording would mislead here
        logging.getLogger("gpumon.poller").setLevel(logging.CRITICAL)
    explicit = args.state_dir is not None or "GPUMON_STATE_DIR" in os.environ
    state_dir = _usable_state_dir(config, explicit)
    if state_dir is None:
        print(f"gpumon: state directory {config.state_dir} cannot be created or written", file=sys.stderr)
        return 1
    return dataclasses.replace(config, state_dir=state_dir), state_dir


def _health_config(config: Config) -> HealthConfig:
    return config.health or HealthConfig()


def daemon_url(config: Config) -> str:
    host, port = config.listen_address()
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/api/health"


def ask_daemon(url: str, timeout_seconds: float = 3.0) -> HealthReport | None:
    """The daemon's verdict, or None when no daemon answers (then gpumon health polls itself)."""
    import requests

    try:
        response = requests.get(url, timeout=timeout_seconds)
        if response.status_code != 200:
            log.info("the daemon at %s answered %d; polling the GPUs here", url, response.status_code)
            return None
        return HealthReport.from_json(response.json(), source="daemon")
    except (requests.RequestException, ValueError, KeyError, TypeError):
        return None


class BackendProblem(Exception):
    """The backend cannot be built (a bad scenario file)."""


def local_report(config: Config, state_dir: Path, *, kernel_log: bool = True) -> HealthReport:
    """Poll the GPUs once here, add what the state directory remembers, and judge."""
    from gpumon.backends.base import ScenarioError
    from gpumon.backends.factory import make_backend
    from gpumon.events.catalog import XidCatalog
    from gpumon.events.tracker import XidTracker

    try:
        backend = make_backend(config.backend, config.fake_gpus)
    except ScenarioError as exc:
        raise BackendProblem(str(exc)) from exc
    service = HealthService(
        state_dir, XidCatalog.load(config.xid_catalog), _health_config(config), simulated=backend.name == "fake"
    )
    snapshot = _poll_within(backend, _health_config(config).poll_timeout_seconds)
    if snapshot is None:  # a call into the driver hangs: a GPU fallen off the bus, typically
        return service.report(source="local", extra=[poll_hung(_health_config(config).poll_timeout_seconds)])
    service.on_snapshot(snapshot)
    tracker = XidTracker(live_since_seconds=time.time(), logger=logging.getLogger("gpumon.xid"))
    tracker.set_gpus_from_snapshot(snapshot)
    tracker.subscribe(service.on_xid)
    if snapshot.nvml_up and backend.name == "fake":  # scripted XIDs; real ones come from the kernel log
        try:
            for event in backend.wait_events(0.0):
                tracker.record(event)
        except Exception:
            log.debug("no simulated XID events", exc_info=True)
    if kernel_log and config.kernel_log and backend.name != "fake":
        from gpumon.events.kernel_log import read_boot_xids

        tracker.record_all(read_boot_xids(logger=logging.getLogger("gpumon.kmsg")).events)
    try:
        backend.shutdown()
    except Exception:
        log.debug("backend shutdown failed", exc_info=True)
    return service.report(source="local")


def _poll_within(backend: GpuBackend, timeout_seconds: float) -> Snapshot | None:
    """One poll, or None when it does not finish in time (the stuck thread is left behind, a daemon thread)."""
    from gpumon.poller import Poller
    from gpumon.store import SnapshotStore

    result: list[Snapshot] = []
    thread = threading.Thread(
        target=lambda: result.append(Poller(backend, SnapshotStore()).poll()), name="gpumon-health-poll", daemon=True
    )
    thread.start()
    thread.join(timeout_seconds)
    return result[0] if result else None


def poll_hung(timeout_seconds: float) -> Finding:
    return Finding(
        kind="nvml_hang",
        severity=CRITICAL,
        action="reboot_node",
        summary=f"the NVIDIA driver did not answer within {timeout_seconds:g} s (a GPU may have fallen off the bus)",
        evidence={"timeout_seconds": timeout_seconds},
    )


def get_report(args: argparse.Namespace, config: Config, state_dir: Path, *, kernel_log: bool = True) -> HealthReport:
    if not args.local:
        url = args.daemon_url or (None if config.web_config_file else daemon_url(config))
        if url is not None:
            report = ask_daemon(url)
            if report is not None:
                return report
    return local_report(config, state_dir, kernel_log=kernel_log)


def npd_line(report: HealthReport) -> str:
    """One line for node-problem-detector, at most NPD_MAX_OUTPUT characters."""
    line = f"{report.status}: {report.reason()}"
    if len(line) > NPD_MAX_OUTPUT:
        line = line[: NPD_MAX_OUTPUT - 3] + "..."
    return line


def print_report(report: HealthReport) -> None:
    where = "from the daemon" if report.source == "daemon" else "polled here"
    print(f"gpumon health: {report.status} - {report.reason()} ({where})")
    if report.gpus:
        print(f"{'GPU':<4} {'STATUS':<9} {'ACTION':<17} REASON")
        for g in report.gpus:
            print(f"{g.index:<4} {g.status:<9} {g.action:<17} {g.reason}")
    host = [f for f in report.findings if f.gpu is None]
    if host:
        print("node:")
        for f in host:
            print(f"  {f.severity:<9} {f.action:<17} {f.summary}")
    if report.action != "none":
        print(f"recommended: {ACTION_WORDS[report.action]}" if report.action in ACTION_WORDS else report.action)


# ---- commands -----------------------------------------------------------------
def cmd_health(args: argparse.Namespace) -> int:
    setup = _setup(args)
    if isinstance(setup, int):
        return setup
    config, state_dir = setup
    slurm_mode = args.slurm or args.slurm_prolog or args.slurm_epilog
    slurm = _health_config(config).slurm
    if slurm_mode and not slurm.enabled:
        print(
            "gpumon: health.slurm.enabled is not true in the configuration; gpumon drains no node unless told to",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.slurm_epilog:
        _epilog_burn(config, state_dir, os.environ)
    try:
        report = get_report(args, config, state_dir, kernel_log=not args.slurm_prolog)
    except BackendProblem as exc:
        print(f"gpumon: bad scenario file:\n{exc}", file=sys.stderr)
        return EXIT_USAGE
    decision = None
    if slurm_mode:
        from gpumon.integrations.slurm import act

        decision = act(report, slurm, state_dir)
    if args.mode == "npd":
        print(npd_line(report))
        return NPD_EXIT[report.status]
    if args.json is not None:
        data = report.to_json()
        if decision is not None:
            data["slurm"] = decision.to_json()
        try:
            emit_json(data, args.json)
        except OSError as exc:
            print(f"gpumon: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_USAGE
    if not to_stdout(args.json):
        print_report(report)
        if decision is not None:
            print(f"slurm: {decision.step}: {decision.message}")
    if args.slurm_prolog:
        return 1 if report.status == "CRITICAL" and decision is not None and decision.step != "refused" else 0
    if args.slurm_epilog:
        return 0
    return STATUS_VALUES[report.status]


def _job_failed(env: Mapping[str, str]) -> bool:
    for name in ("SLURM_JOB_EXIT_CODE", "SLURM_JOB_DERIVED_EC"):
        value = env.get(name, "").split(":")[0].strip()
        if value and value != "0":
            return True
    return False


def burn_command(config: Config, state_dir: Path, gpus: str) -> list[str]:
    cmd = [sys.executable, "-m", "gpumon", "burn", "--quick", "--state-dir", str(state_dir)]
    if gpus:
        cmd += ["--gpus", gpus]
    if config.source:
        cmd += ["--config", config.source]
    return cmd


def _epilog_burn(
    config: Config,
    state_dir: Path,
    env: Mapping[str, str],
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> int | None:
    """``gpumon burn --quick`` on the job's GPUs when the job failed and ``epilog_burn`` is on; its exit code."""
    if not _health_config(config).slurm.epilog_burn or not _job_failed(env):
        return None
    cmd = burn_command(config, state_dir, env.get("SLURM_JOB_GPUS", ""))
    log.warning("job %s failed; running %s", env.get("SLURM_JOB_ID", "?"), " ".join(cmd))
    try:
        done = run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.error("gpumon burn could not run: %s", exc)
        return None
    return int(done.returncode)


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
    (its state apart, gpumon.state.files.health_dir) or None; else an exit code."""
    from gpumon.cli import load_or_report
    from gpumon.state.access import refusal

    config = load_or_report(args)
    if config is None:
        return EXIT_USAGE
    level = getattr(logging, (args.log_level or "warning").upper())
    logging.basicConfig(level=level, format="gpumon: %(message)s", stream=sys.stderr)
    refused = refusal(config.state_dir, what)
    if refused is not None:
        print(f"gpumon: {refused}", file=sys.stderr)
        return 1
    return config, (config.backend if config.backend.startswith("fake") else None)


def cmd_accept_inventory(args: argparse.Namespace) -> int:
    state = _admin_state(args, "accept the inventory")
    if isinstance(state, int):
        return state
    config, simulated = state
    state_dir = config.state_dir
    from gpumon.backends.base import ScenarioError
    from gpumon.backends.factory import make_backend
    from gpumon.findings.inventory import drift, inventory_of, pci_gpus
    from gpumon.findings.service import save_inventory
    from gpumon.poller import Poller
    from gpumon.store import SnapshotStore

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
    health = _health_config(config)
    sysfs = health.sysfs_root or (None if backend.name == "fake" else Path("/sys"))
    remaining = drift(inventory, snapshot, pci_gpus(sysfs) if sysfs else None, health.expected_gpu_count)
    for finding in remaining:  # what an accepted inventory does not silence (docs/health.md)
        print(f"still reported: {finding.severity} {finding.summary}")
    return 0
