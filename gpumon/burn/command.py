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
from pathlib import Path
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
    Launch,
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
        "--long",
        action="store_true",
        help="soak: matmul at full power for 15 min (or --duration) with settle and throttle-onset times, "
        "then power steps (pulse)",
    )
    p.add_argument(
        "--dtype", default="auto", help=f"matmul dtype: {'|'.join(DTYPES)} (auto: bf16 on sm80+, fp16 before)"
    )
    add_json_option(p, "the report")
    p.add_argument(
        "--wide", action="store_true", help="verdict table with a column per test, however wide (default: fits)"
    )
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


def burn_state_dir(state_dir: str, backend_spec: str, device: str) -> str:
    """Where the burn keeps burn/last.json and burn/running.json: ``state_dir`` for a burn of the node's
    GPUs; for a simulated run, whatever ``--state-dir`` says, a folder of its own so that it never
    writes the node's burn verdict: ``STATE_DIR/simulated/<backend>`` for simulated GPUs (where the health
    verdict of that backend reads it), ``STATE_DIR/simulated/cpu`` for ``--device cpu`` on real telemetry."""
    from gpumon.backends.factory import simulated_spec
    from gpumon.util.state.files import SIMULATED_DIR, health_dir

    spec = simulated_spec(backend_spec)
    if spec is not None:
        return str(health_dir(state_dir, spec).parent)
    return str(Path(state_dir) / SIMULATED_DIR / "cpu") if device == "cpu" else state_dir


def _torchrun(env: dict[str, str]) -> bool:
    return "RANK" in env and "WORLD_SIZE" in env and "LOCAL_RANK" in env


def build_options(args: argparse.Namespace, env: dict[str, str]) -> tuple[BurnOptions | None, Any, list[str]]:
    """Validate everything; returns (options, initialised backend, problems). Raises CannotRunError."""
    problems: list[str] = []
    tests, p = parse_tests(args.tests, long=bool(getattr(args, "long", False)))
    problems += p
    problems += _flag_problems(args)
    device = args.device if args.device in DEVICES else "cuda"
    problems += _environment_problems(env)
    launch, p = _launch(args, env)
    problems += p
    _gpus, p = parse_gpus(args.gpus, None)
    problems += p
    spec = args.backend or ("nvml" if device == "cuda" else "fake")
    backend, p = _open_backend(spec, device, any_problems=bool(problems))
    problems += p
    if backend is None:
        return None, None, problems
    count = backend.device_count()
    if count == 0 and not problems:
        backend.shutdown()
        raise CannotRunError("no GPU found")
    gpus, p = parse_gpus(args.gpus, count)
    problems += [x for x in p if x not in problems]
    gpus, gpus_per_agent, p = _agent_gpus(args, env, launch, gpus, count)
    problems += p
    if problems:
        backend.shutdown()
        return None, None, problems
    assert gpus is not None
    opts = BurnOptions(
        gpus=gpus,
        tests=tests,
        duration_seconds=args.duration
        if args.duration is not None
        else default_duration(device, args.quick, bool(getattr(args, "long", False))),
        quick=args.quick,
        dtype=args.dtype,
        json_path=args.json,
        force=args.force,
        device=device,
        backend_spec=spec,
        state_dir=burn_state_dir(args.state_dir, spec, device),
        heartbeat_timeout_seconds=args.heartbeat_timeout,
        startup_timeout_seconds=args.startup_timeout,
        launch=launch,
        gpus_per_agent=gpus_per_agent,
        wide=bool(getattr(args, "wide", False)),
        long=bool(getattr(args, "long", False)),
    )
    return opts, backend, []


def _flag_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with --dtype, --device, --duration and the two timeouts (seconds)."""
    problems: list[str] = []
    if args.quick and getattr(args, "long", False):
        problems.append("--quick and --long: choose one")
    if args.dtype not in DTYPES:
        problems.append(f"--dtype: unknown dtype {args.dtype!r} (one of {'|'.join(DTYPES)})")
    if args.device not in DEVICES:
        problems.append(f"--device: {args.device!r} is not one of {'|'.join(DEVICES)}")
    if args.duration is not None and not args.duration > 0:
        problems.append("--duration must be more than 0 seconds")
    if not args.heartbeat_timeout > 0:
        problems.append("--heartbeat-timeout must be more than 0 seconds")
    if not args.startup_timeout > 0:
        problems.append("--startup-timeout must be more than 0 seconds")
    return problems


def _environment_problems(env: dict[str, str]) -> list[str]:
    """What is wrong with the fault injection and the floor overrides given in the environment."""
    from gpumon.burn.verdict import thresholds
    from gpumon.burn.workloads import inject

    _injection, injection_problems = inject.parse(env.get(inject.ENV_VAR))
    _th, floor_problems = thresholds.parse_floors(env.get(thresholds.FLOORS_ENV_VAR))
    return injection_problems + floor_problems


def _launch(args: argparse.Namespace, env: dict[str, str]) -> tuple[Launch, list[str]]:
    """Where this process sits: from torchrun's or the flags' values, else (inside a Slurm step) from srun's."""
    if _torchrun(env) or args.nnodes > 1 or not slurm_launch.in_slurm_step(env):
        return launch_from(env, args.nnodes, args.node_rank, args.master_addr, args.master_port)
    return slurm_launch.launch_from_slurm(env, args.master_addr, args.master_port, slurm_launch.first_node_address)


def _open_backend(spec: str, device: str, any_problems: bool) -> tuple[Any, list[str]]:
    """The initialised telemetry backend, or None and the problem with --backend.

    Without NVML: None when other problems are already listed (they are what the user sees), else CannotRunError.
    """
    from gpumon.backends.base import NvmlUnavailableError

    try:
        backend = _make_backend(spec, device)
        backend.init()
    except NvmlUnavailableError as exc:
        if any_problems:
            return None, []
        raise CannotRunError(
            f"NVML is not available ({exc}): is the NVIDIA driver loaded? (--device cpu for a dry run)"
        ) from exc
    except (ValueError, ImportError) as exc:  # ScenarioError is a ValueError
        return None, [f"--backend {spec}: {exc}"]
    return backend, []


def _agent_gpus(
    args: argparse.Namespace, env: dict[str, str], launch: Launch, gpus: tuple[int, ...] | None, count: int
) -> tuple[tuple[int, ...] | None, int, list[str]]:
    """The GPUs this agent burns and how many each agent has; under torchrun one each, --nproc-per-node in all."""
    if launch.mode != "torchrun":
        return gpus, len(gpus or ()), []
    local_world = int(env.get("LOCAL_WORLD_SIZE", "1"))
    if args.gpus is None:
        gpus = tuple(range(min(local_world, count)))
    problems = []
    if gpus is not None and len(gpus) != local_world:
        problems.append(f"torchrun --nproc-per-node {local_world} needs {local_world} GPUs, --gpus selects {len(gpus)}")
    return gpus, 1, problems


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
        from gpumon.util.state.handback import give_back

        for line in give_back(args.state_dir):  # what an older root burn left root's in the service user's tree
            _err(f"state directory: {line}")

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
