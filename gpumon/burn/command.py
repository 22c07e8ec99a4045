"""``gpumon burn`` command line: options, validation (every problem at once), exit codes.

Importing this module does not import torch. ``gpumon.cli`` calls ``configure(parser)``
and then ``args.func(args)``; ``python -m gpumon.burn`` (for torchrun) calls ``main()``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from gpumon.burn.orchestration import slurm_launch
from gpumon.burn.orchestration.options import (
    DEFAULT_HEARTBEAT_TIMEOUT_SECONDS,
    DEFAULT_STARTUP_TIMEOUT_SECONDS,
    DEFAULT_STATE_DIR,
    DEVICES,
    DTYPES,
    TESTS,
    BurnOptions,
    default_duration,
    launch_from,
    parse_gpus,
    parse_tests,
)
from gpumon.burn.verdict.errors import EXIT_CANNOT_RUN, EXIT_INTERRUPTED, EXIT_USAGE, BurnUsageError, CannotRunError
from gpumon.util.jsonout import add_json_option, to_stdout

DESCRIPTION = (
    "Burn-in and fault triage: load the GPUs (matmul, memory, p2p, all-reduce), check every result, "
    "and name the GPU, link or rank that is bad. Exit 0 passed, 1 fault found, 2 usage error, 3 could not run."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", default=None, help="GPU indices, e.g. 0,1, or 'all' (default: all)")
    p.add_argument("--tests", default=None, help=f"comma-separated tests (default: {','.join(TESTS)})")
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds of matmul load per GPU (default 60, --quick 6; on --device cpu 5 / 2)",
    )
    p.add_argument("--quick", action="store_true", help="a verdict in under a minute: shorter load, smaller sizes")
    p.add_argument(
        "--dtype", default="auto", help=f"matmul dtype: {'|'.join(DTYPES)} (auto: bf16 on sm80+, fp16 before)"
    )
    add_json_option(p, "the report")
    p.add_argument("--force", action="store_true", help="burn even if other compute processes use the GPUs")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (CPU tensors + gloo, for CI)")
    p.add_argument(
        "--backend",
        default=None,
        help="telemetry source: nvml | fake | fake:NAME | fake:PATH (default nvml for cuda, fake for cpu)",
    )
    p.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help=f"where burn/last.json and burn/running.json go (default {DEFAULT_STATE_DIR})",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=DEFAULT_HEARTBEAT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="a rank without progress this long is hung and is ended (default 20)",
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=DEFAULT_STARTUP_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="time allowed to start workers and meet the other nodes (default 180)",
    )
    p.add_argument("--nnodes", type=int, default=1, help="nodes in a multi-node run (one gpumon burn per node)")
    p.add_argument("--node-rank", type=int, default=0, help="this node's index, 0..nnodes-1")
    p.add_argument("--master-addr", default=None, help="address of node 0 (multi-node)")
    p.add_argument("--master-port", type=int, default=None, help="free TCP port on node 0 (multi-node)")


def configure(parser: argparse.ArgumentParser) -> None:
    """Give ``gpumon burn``'s parser (made by gpumon.cli) its description, options and command;
    dispatch with ``args.func(args)``."""
    parser.description = DESCRIPTION
    add_arguments(parser)
    parser.set_defaults(func=run)


def _err(line: str) -> None:
    print(f"gpumon burn: {line}", file=sys.stderr, flush=True)


def _make_backend(spec: str, device: str) -> Any:
    if device == "cpu" and spec == "fake":
        from gpumon.backends.fake import FakeBackend

        return FakeBackend.from_mapping({"count": 2}, source="fake")  # two idle, healthy simulated GPUs
    from gpumon.backends.factory import make_backend

    return make_backend(spec)


def _torchrun(env: dict[str, str]) -> bool:
    return "RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env


def build_options(args: argparse.Namespace, env: dict[str, str]) -> tuple[BurnOptions | None, Any, list[str]]:
    """Validate everything; returns (options, initialised backend, problems). Raises CannotRunError."""
    from gpumon.backends.base import NvmlUnavailableError
    from gpumon.burn.verdict import thresholds
    from gpumon.burn.workloads import inject

    problems: list[str] = []
    tests, p = parse_tests(args.tests)
    problems += p
    if args.dtype not in DTYPES:
        problems.append(f"--dtype: unknown dtype {args.dtype!r} (one of {'|'.join(DTYPES)})")
    if args.device not in DEVICES:
        problems.append(f"--device: {args.device!r} is not one of {'|'.join(DEVICES)}")
    device = args.device if args.device in DEVICES else "cuda"
    if args.duration is not None and not args.duration > 0:
        problems.append("--duration must be more than 0 seconds")
    if not args.heartbeat_timeout > 0:
        problems.append("--heartbeat-timeout must be more than 0 seconds")
    if not args.startup_timeout > 0:
        problems.append("--startup-timeout must be more than 0 seconds")
    _injection, p = inject.parse(env.get(inject.ENV_VAR))
    problems += p
    _th, p = thresholds.parse_floors(env.get(thresholds.FLOORS_ENV_VAR))
    problems += p
    if _torchrun(env) or args.nnodes > 1 or not slurm_launch.in_slurm_step(env):
        launch, p = launch_from(env, args.nnodes, args.node_rank, args.master_addr, args.master_port)
    else:
        launch, p = slurm_launch.launch_from_slurm(
            env, args.master_addr, args.master_port, slurm_launch.first_node_address
        )
    problems += p
    _gpus, p = parse_gpus(args.gpus, None)
    problems += p
    backend = None
    spec = args.backend or ("nvml" if device == "cuda" else "fake")
    try:
        backend = _make_backend(spec, device)
        backend.init()
    except NvmlUnavailableError as exc:
        if problems:
            return None, None, problems
        raise CannotRunError(
            f"NVML is not available ({exc}): is the NVIDIA driver loaded? (--device cpu for a dry run)"
        ) from exc
    except (ValueError, ImportError) as exc:  # ScenarioError is a ValueError
        problems.append(f"--backend {spec}: {exc}")
        return None, None, problems
    count = backend.device_count()
    if count == 0 and not problems:
        backend.shutdown()
        raise CannotRunError("no GPU found")
    gpus, p = parse_gpus(args.gpus, count)
    problems += [x for x in p if x not in problems]
    gpus_per_agent = len(gpus or ())
    if launch.mode == "torchrun":
        local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
        if args.gpus is None:
            gpus = tuple(range(min(local_world, count)))
        if gpus is not None and len(gpus) != local_world:
            problems.append(
                f"torchrun --nproc-per-node {local_world} needs {local_world} GPUs, --gpus selects {len(gpus)}"
            )
        gpus_per_agent = 1
    if problems:
        backend.shutdown()
        return None, None, problems
    assert gpus is not None
    opts = BurnOptions(
        gpus=gpus,
        tests=tests,
        duration_seconds=args.duration if args.duration is not None else default_duration(device, args.quick),
        quick=args.quick,
        dtype=args.dtype,
        json_path=args.json,
        force=args.force,
        device=device,
        backend_spec=spec,
        state_dir=args.state_dir,
        heartbeat_timeout_seconds=args.heartbeat_timeout,
        startup_timeout_seconds=args.startup_timeout,
        launch=launch,
        gpus_per_agent=gpus_per_agent,
    )
    return opts, backend, []


def run(args: argparse.Namespace) -> int:
    """Run ``gpumon burn``; returns the exit code. Every failure prints one clear line."""
    from gpumon.burn.verdict import thresholds
    from gpumon.burn.workloads import inject

    env = dict(os.environ)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm)
    backend = None
    try:
        opts, backend, problems = build_options(args, env)
        if problems or opts is None:
            for line in problems:
                _err(f"error: {line}")
            return EXIT_USAGE
        from rich.console import Console

        from gpumon.burn.orchestration.runner import run_burn

        injection, _ = inject.parse(env.get(inject.ENV_VAR))
        th, _ = thresholds.for_device(opts.device, env.get(thresholds.FLOORS_ENV_VAR))
        out = sys.stderr if to_stdout(opts.json_path) else sys.stdout  # stdout carries only the JSON then
        console = Console(file=out, highlight=False, width=None if out.isatty() else 160)
        return run_burn(opts, backend, injection, th, console, warn=lambda line: print(line, file=sys.stderr))
    except BurnUsageError as exc:
        for line in exc.problems:
            _err(f"error: {line}")
        return EXIT_USAGE
    except CannotRunError as exc:
        _err(f"could not run: {exc}")
        return EXIT_CANNOT_RUN
    except KeyboardInterrupt:
        _err("interrupted: workers stopped, running marker removed")
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: still one line, never a bare traceback
        _err(f"could not run: internal error {type(exc).__name__}: {exc} (please report it)")
        return EXIT_CANNOT_RUN
    finally:
        if backend is not None:
            with contextlib.suppress(Exception):
                backend.shutdown()


def _sigterm(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpumon.burn`` (what torchrun starts on every node)."""
    parser = argparse.ArgumentParser(prog="python -m gpumon.burn", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))
