"""One ``gpumon burn`` run from validated options to exit code, on this agent.

Order: refuse early (no torch, busy GPU, MIG, CUDA too old) → meet the other agents →
running marker → watcher thread → workers (``Agent``) → merge on agent 0 → judge → report,
verdict table, JSON, last.json → marker removed (also on failure and Ctrl-C).
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from gpumon.backends.base import GpuBackend, GpuLostError
from gpumon.burn.orchestration.agent import Agent
from gpumon.burn.orchestration.live import LiveView
from gpumon.burn.orchestration.merge import build_report, merge_results
from gpumon.burn.orchestration.network import gloo_interface
from gpumon.burn.orchestration.options import BurnOptions
from gpumon.burn.orchestration.protocol import WorkerSpec
from gpumon.burn.orchestration.rendezvous import meet, open_store
from gpumon.burn.orchestration.watcher import Watcher, summarise
from gpumon.burn.orchestration.worker_server import start_worker_server
from gpumon.burn.verdict import report as report_mod
from gpumon.burn.verdict.errors import EXIT_CANNOT_RUN, CannotRunError
from gpumon.burn.verdict.thresholds import GroupLink, Thresholds, group_link
from gpumon.burn.workloads import sw as sw_mod
from gpumon.burn.workloads.inject import Injection
from gpumon.collect.processes import enrich as enrich_processes
from gpumon.model.snapshot import Tier
from gpumon.state.burn_record import StateFiles
from gpumon.util.jsonout import emit_json


def read_gpu(backend: GpuBackend, gpu: int) -> dict[str, Any]:
    """All tiers of one GPU, for the sw checks and the report's identity fields.

    Compute processes get their name, user and cgroup place from /proc, as in ``gpumon once``.
    """
    values: dict[str, Any] = {}
    for tier in (Tier.STATIC, Tier.SLOW, Tier.FAST):
        try:
            values.update(backend.read(gpu, tier))
        except GpuLostError as exc:
            raise CannotRunError(f"GPU {gpu} is lost ({exc.reason}): reset or reboot before a burn") from exc
    if values.get("processes"):
        values["processes"] = enrich_processes(values["processes"])
    try:
        values["uuid"] = backend.uuid(gpu)
    except GpuLostError as exc:
        raise CannotRunError(f"GPU {gpu} is lost ({exc.reason})") from exc
    return values


def run_burn(
    opts: BurnOptions,
    backend: GpuBackend,
    injection: Injection,
    thresholds: Thresholds,
    console: Console,
    warn: Callable[[str], None],
) -> int:
    """Run the burn on this agent; returns the exit code (the caller prints nothing more)."""
    worker_server, torch_cuda_version = _start_torch(opts, backend)
    launch = opts.launch
    started_at = time.time()
    info = {g: read_gpu(backend, g) for g in opts.local_gpus}
    sw_checks = _software_checks(opts, backend, info, torch_cuda_version)
    refuse = _refusal(sw_checks, opts.force)

    store = open_store(opts, max(opts.startup_timeout_seconds, 60.0))
    dist: Any = importlib.import_module("torch.distributed")

    agents = dist.PrefixStore(launch.run_id + "/agents", store)
    node_names: dict[int, str] = {}
    if launch.agent_count > 1:
        node_names = meet(agents, opts, refuse)
    elif refuse:
        raise CannotRunError(refuse)

    state = StateFiles(opts.state_dir, warn)
    watcher = Watcher(backend, opts.local_gpus)
    topology, pcie = _topology(info, opts.local_gpus), _pcie(info, opts.local_gpus)
    link = group_link(topology, pcie, list(opts.local_gpus))
    specs = _worker_specs(opts, backend, info, store, injection, thresholds, link)
    try:  # the marker is written inside: a stop that comes as it is written still removes it
        if launch.writes_node_state:
            node_gpus = list(opts.gpus)
            uuids = [info[g]["uuid"] if g in info else backend.uuid(g) for g in node_gpus]
            state.write_marker(os.getpid(), node_gpus, uuids, started_at)
        watcher.start()
        agent = _run_agent(specs, opts, agents, node_names, worker_server, watcher, console)
        watcher.stop()
        mine = _node_result(agent, opts, backend, info, watcher, sw_checks)
        mine["topology"] = topology
        mine["pcie"] = pcie
        if launch.agent_count > 1:
            final = merge_results(agents, opts, mine, thresholds, injection, started_at)
        else:
            final = build_report([mine], opts, thresholds, injection, started_at)
        final["node"] = launch.node_index
        _publish(final, opts, console, warn, state)
        return int(final["exit_code"])
    finally:
        watcher.stop()
        state.remove_marker()


def _start_torch(opts: BurnOptions, backend: GpuBackend) -> tuple[Any, str | None]:
    """Refuse without torch; else start the workers' fork server and import torch here too.

    Returns the fork server (the workers' multiprocessing context) and the CUDA version torch was built for.
    """
    if importlib.util.find_spec("torch") is None:
        from gpumon.burn.torch_hint import torch_install_hint

        raise CannotRunError(torch_install_hint(opts.device, backend.host().cuda_driver_version))
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    worker_server = start_worker_server()  # imports torch for the workers while this process imports it too
    import torch

    return worker_server, getattr(torch.version, "cuda", None)


def _software_checks(
    opts: BurnOptions, backend: GpuBackend, info: dict[int, dict[str, Any]], torch_cuda_version: str | None
) -> list[sw_mod.SwCheck]:
    """The host's checks (driver, CUDA, torch) then each local GPU's (MIG, busy, ...)."""
    sw_checks = sw_mod.check_host(backend.host(), torch_cuda_version, opts.device)
    for g in opts.local_gpus:
        sw_checks += sw_mod.check_gpu(g, info[g], own_pids=(os.getpid(),))
    return sw_checks


def _busy(sw_checks: list[sw_mod.SwCheck]) -> list[sw_mod.SwCheck]:
    return [c for c in sw_checks if c.severity == "busy"]


def _refusal(sw_checks: list[sw_mod.SwCheck], force: bool) -> str | None:
    """Why this node cannot burn (a check that cannot run, or a busy GPU without --force); None when it can."""
    refusal = next((c for c in sw_checks if c.severity == "cannot_run"), None)
    busy = _busy(sw_checks)
    if refusal is not None:
        return (f"GPU {refusal.gpu}: " if refusal.gpu is not None else "") + refusal.detail
    if busy and not force:
        return "; ".join(f"GPU {c.gpu} is busy: {c.detail}" for c in busy) + " (use --force to burn anyway)"
    return None


def _topology(info: dict[int, dict[str, Any]], local: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """Each local GPU's topology level to each other GPU, keyed by GPU index as text."""
    return {str(g): dict(info[g].get("topology_level") or {}) for g in local}


def _pcie(info: dict[int, dict[str, Any]], local: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """Each local GPU's maximum PCIe generation and width, keyed by GPU index as text."""
    return {
        str(g): {
            "generation_max": info[g].get("pcie_link_generation_max"),
            "width_max": info[g].get("pcie_link_width_max"),
        }
        for g in local
    }


def _worker_specs(
    opts: BurnOptions,
    backend: GpuBackend,
    info: dict[int, dict[str, Any]],
    store: Any,
    injection: Injection,
    thresholds: Thresholds,
    link: GroupLink,
) -> list[WorkerSpec]:
    """One spec per local GPU: its global rank, where the rendezvous store is, what to run and judge against."""
    launch = opts.launch
    local = opts.local_gpus
    models = {g: (str(info[g].get("name") or "unknown") if opts.device == "cuda" else "cpu") for g in local}
    single_node = launch.node_count == 1
    interface = None
    if opts.device == "cpu" and not single_node:  # gloo across nodes (NCCL picks its own interface)
        interface = gloo_interface(os.environ, launch.master_addr)
    return [
        WorkerSpec(
            rank=opts.rank_offset + i,
            world_size=opts.world_size,
            gpu=g,
            node_gpus=opts.gpus,
            expected_uuid=None if backend.simulated else info[g].get("uuid"),
            device=opts.device,
            dtype=opts.dtype,
            tests=opts.tests,
            duration_seconds=opts.duration_seconds,
            quick=opts.quick,
            store_host="127.0.0.1" if launch.mode == "local" else launch.master_addr,
            store_port=int(store.port) if launch.mode == "local" else launch.master_port,
            store_prefix=launch.run_id,
            injection=injection,
            allreduce_floor_bytes_per_second=thresholds.allreduce_floor_bytes_per_second(models[g], single_node, link),
            link_fraction=thresholds.link_fraction,
            p2p_concurrent=link.kind == "nvlink",
            socket_interface=interface,
        )
        for i, g in enumerate(local)
    ]


def _run_agent(
    specs: list[WorkerSpec],
    opts: BurnOptions,
    agents: Any,
    node_names: dict[int, str],
    worker_server: Any,
    watcher: Watcher,
    console: Console,
) -> Agent:
    """Start the workers and watch them to the end, with the live view on the leader; returns the finished agent."""
    launch = opts.launch
    with LiveView(console, watcher, enabled=launch.is_leader) as view:
        agent = Agent(
            specs,
            node=launch.node_index,
            agent_index=launch.agent_index,
            agent_count=launch.agent_count,
            store=agents,
            heartbeat_timeout_seconds=opts.heartbeat_timeout_seconds,
            startup_timeout_seconds=opts.startup_timeout_seconds,
            on_tick=view.update,
            on_test=watcher.set_test,
            mp_context=worker_server,
            node_names=node_names,
        )
        agent.run()
    return agent


def _node_result(
    agent: Agent,
    opts: BurnOptions,
    backend: GpuBackend,
    info: dict[int, dict[str, Any]],
    watcher: Watcher,
    sw_checks: list[sw_mod.SwCheck],
) -> dict[str, Any]:
    """This node's result: the workers' figures plus identity, telemetry and the software checks."""
    local = opts.local_gpus
    mine = agent.node_result()
    if opts.launch.node_name:
        mine["hostname"] = opts.launch.node_name
    mine["gpus_info"] = {str(g): {"uuid": info[g].get("uuid"), "name": info[g].get("name")} for g in local}
    simulated = backend.simulated  # a CPU burn's GPUs too: their power and temperature are not measured
    mine["telemetry"] = {str(g): {**summarise(watcher.telemetry[g]), "simulated": simulated} for g in local}
    mine["sw"] = [c.to_jsonable() for c in sw_checks] if "sw" in opts.tests else []
    mine["busy_gpus"] = sorted({c.gpu for c in _busy(sw_checks) if c.gpu is not None})
    return mine


def _publish(
    final: dict[str, Any], opts: BurnOptions, console: Console, warn: Callable[[str], None], state: StateFiles
) -> None:
    """The leader renders the report and writes --json; each node writing state keeps it as last.json."""
    launch = opts.launch
    if launch.is_leader:
        report_mod.render(final, console, opts.tests, wide=opts.wide)
        if opts.json_path:
            try:
                emit_json(final, opts.json_path)
            except OSError as exc:
                warn(f"warning: cannot write --json {opts.json_path}: {exc.strerror or exc}")
    if launch.writes_node_state:
        state.write_last(final)


__all__ = ["EXIT_CANNOT_RUN", "run_burn"]
