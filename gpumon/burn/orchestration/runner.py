"""One ``gpumon burn`` run from validated options to exit code, on this agent.

Order: refuse early (no torch, busy GPU, MIG, CUDA too old) → meet the other agents →
running marker → watcher thread → workers (``Agent``) → merge on agent 0 → judge → report,
verdict table, JSON, last.json → marker removed (also on failure and Ctrl-C).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import json
import os
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from gpumon.backends.base import GpuBackend, GpuLostError
from gpumon.burn.orchestration.agent import Agent, start_worker_server
from gpumon.burn.orchestration.live import LiveView
from gpumon.burn.orchestration.network import gloo_interface
from gpumon.burn.orchestration.options import BurnOptions
from gpumon.burn.orchestration.protocol import WorkerSpec
from gpumon.burn.orchestration.watcher import Watcher, summarise
from gpumon.burn.record import StateFiles
from gpumon.burn.verdict import report as report_mod
from gpumon.burn.verdict.errors import EXIT_CANNOT_RUN, BurnUsageError, CannotRunError
from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.thresholds import Thresholds, group_link
from gpumon.burn.workloads import sw as sw_mod
from gpumon.burn.workloads.inject import Injection
from gpumon.collect.processes import enrich as enrich_processes
from gpumon.model.snapshot import Tier
from gpumon.util.jsonout import emit_json

MERGE_TIMEOUT_SECONDS = 120.0
LOST_MERGE_GRACE_SECONDS = 5.0
"""How long agent 0 still waits for the result of an agent named lost (one that was only starved of CPU
comes back within it and is merged; a node that is gone costs this much)."""


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


def _store(opts: BurnOptions, timeout_seconds: float) -> Any:
    dist: Any = importlib.import_module("torch.distributed")

    launch = opts.launch
    timeout = datetime.timedelta(seconds=timeout_seconds)
    try:
        if launch.mode == "local":
            store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timeout)
        else:
            store = dist.TCPStore(
                launch.master_addr,
                launch.master_port,
                is_master=launch.store_is_master,
                wait_for_workers=False,
                timeout=timeout,
            )
    except Exception as exc:
        where = f"{launch.master_addr}:{launch.master_port}"
        raise CannotRunError(f"cannot reach the rendezvous store at {where}: {exc}") from exc
    return store


def run_burn(
    opts: BurnOptions,
    backend: GpuBackend,
    injection: Injection,
    thresholds: Thresholds,
    console: Console,
    warn: Callable[[str], None],
) -> int:
    """Run the burn on this agent; returns the exit code (the caller prints nothing more)."""
    if importlib.util.find_spec("torch") is None:
        from gpumon.burn.torch_hint import torch_install_hint

        raise CannotRunError(torch_install_hint(opts.device, backend.host().cuda_driver_version))
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    worker_server = start_worker_server()  # imports torch for the workers while this process imports it too
    import torch

    launch = opts.launch
    started_at = time.time()
    local = opts.local_gpus
    info = {g: read_gpu(backend, g) for g in local}
    sw_checks = sw_mod.check_host(backend.host(), getattr(torch.version, "cuda", None), opts.device)
    for g in local:
        sw_checks += sw_mod.check_gpu(g, info[g], own_pids=(os.getpid(),))
    refusal = next((c for c in sw_checks if c.severity == "cannot_run"), None)
    busy = [c for c in sw_checks if c.severity == "busy"]
    refuse = None
    if refusal is not None:
        refuse = (f"GPU {refusal.gpu}: " if refusal.gpu is not None else "") + refusal.detail
    elif busy and not opts.force:
        refuse = "; ".join(f"GPU {c.gpu} is busy: {c.detail}" for c in busy) + " (use --force to burn anyway)"

    store = _store(opts, max(opts.startup_timeout_seconds, 60.0))
    dist: Any = importlib.import_module("torch.distributed")

    agents = dist.PrefixStore(launch.run_id + "/agents", store)
    node_names: dict[int, str] = {}
    if launch.agent_count > 1:
        node_names = _meet(agents, opts, refuse)
    elif refuse:
        raise CannotRunError(refuse)

    state = StateFiles(opts.state_dir, warn)
    watcher = Watcher(backend, local)
    models = {g: (str(info[g].get("name") or "unknown") if opts.device == "cuda" else "cpu") for g in local}
    single_node = launch.node_count == 1
    topology = {str(g): dict(info[g].get("topology_level") or {}) for g in local}
    pcie = {
        str(g): {
            "generation_max": info[g].get("pcie_link_generation_max"),
            "width_max": info[g].get("pcie_link_width_max"),
        }
        for g in local
    }
    link = group_link(topology, pcie, list(local))
    interface = None
    if opts.device == "cpu" and not single_node:  # gloo across nodes (NCCL picks its own interface)
        interface = gloo_interface(os.environ, launch.master_addr)
    specs = [
        WorkerSpec(
            rank=opts.rank_offset + i,
            world_size=opts.world_size,
            gpu=g,
            node_gpus=opts.gpus,
            expected_uuid=info[g].get("uuid") if backend.name == "nvml" else None,
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
    if launch.writes_node_state:
        node_gpus = list(opts.gpus)
        uuids = [info[g]["uuid"] if g in info else backend.uuid(g) for g in node_gpus]
        state.write_marker(os.getpid(), node_gpus, uuids, started_at)
    try:
        watcher.start()
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
        watcher.stop()
        mine = agent.node_result()
        if launch.node_name:
            mine["hostname"] = launch.node_name
        mine["gpus_info"] = {str(g): {"uuid": info[g].get("uuid"), "name": info[g].get("name")} for g in local}
        simulated = backend.name == "fake"  # a CPU burn's GPUs too: their power and temperature are not measured
        mine["telemetry"] = {str(g): {**summarise(watcher.telemetry[g]), "simulated": simulated} for g in local}
        mine["sw"] = [c.to_jsonable() for c in sw_checks] if "sw" in opts.tests else []
        mine["busy_gpus"] = sorted({c.gpu for c in busy if c.gpu is not None})
        mine["topology"] = topology
        mine["pcie"] = pcie
        if launch.agent_count > 1:
            final = _merge_multi(agents, opts, mine, thresholds, injection, started_at)
        else:
            final = _report([mine], opts, thresholds, injection, started_at)
        final["node"] = launch.node_index
        if launch.is_leader:
            report_mod.render(final, console, opts.tests)
            if opts.json_path:
                try:
                    emit_json(final, opts.json_path)
                except OSError as exc:
                    warn(f"warning: cannot write --json {opts.json_path}: {exc.strerror or exc}")
        if launch.writes_node_state:
            state.write_last(final)
        return int(final["exit_code"])
    finally:
        watcher.stop()
        state.remove_marker()


def _report(
    nodes: list[dict[str, Any]], opts: BurnOptions, thresholds: Thresholds, injection: Injection, started_at: float
) -> dict[str, Any]:
    j = judge(nodes, thresholds, opts.tests)
    models = sorted({g["model"] for g in j.gpus.values()})
    dtypes = sorted({str(g["matmul"]["dtype"]) for g in j.gpus.values() if (g.get("matmul") or {}).get("dtype")})
    return report_mod.build(
        j,
        options={
            "gpus": list(opts.gpus),
            "tests": list(opts.tests),
            "duration_seconds": opts.duration_seconds,
            "quick": opts.quick,
            "dtype": opts.dtype,
            "device": opts.device,
            "backend": opts.backend_spec,
            "force": opts.force,
            "heartbeat_timeout_seconds": opts.heartbeat_timeout_seconds,
            "nodes": opts.launch.node_count,
            "world_size": opts.world_size,
            "launch": opts.launch.mode,
        },
        thresholds=thresholds.to_jsonable(models, dtypes[0] if dtypes else opts.dtype),
        started_at=started_at,
        finished_at=time.time(),
        injection=injection.describe(),
    )


def _meet(agents: Any, opts: BurnOptions, refuse: str | None) -> dict[int, str]:
    """Every agent says hello (its GPU count, or why it refuses) and waits for all the others.

    Returns each node's name (Slurm's node name) when every node has one of its own, else {}."""
    launch = opts.launch
    agents.set(
        f"hello/{launch.agent_index}",
        json.dumps(
            {"gpus": len(opts.local_gpus), "refuse": refuse, "node": launch.node_index, "name": launch.node_name}
        ),
    )
    keys = [f"hello/{i}" for i in range(launch.agent_count)]
    try:
        agents.wait(keys, datetime.timedelta(seconds=opts.startup_timeout_seconds))
    except Exception as exc:
        missing = [k for k in keys if not agents.check([k])]
        raise CannotRunError(
            f"other nodes did not join within {opts.startup_timeout_seconds:.0f} s "
            f"(missing agents {', '.join(k.split('/')[1] for k in missing)}): {exc}"
        ) from exc
    hellos = [json.loads(agents.get(k)) for k in keys]
    refusals = [f"node {h['node']}: {h['refuse']}" for h in hellos if h["refuse"]]
    if refusals:
        raise CannotRunError("; ".join(refusals))
    names = {int(h["node"]): h.get("name") for h in hellos}
    if all(names.values()) and len(set(names.values())) == len(names):
        return {node: str(name) for node, name in names.items()}
    return {}
    counts = {h["gpus"] for h in hellos}
    if len(counts) > 1:
        raise BurnUsageError([f"every node must burn the same number of GPUs (got {sorted(counts)})"])


def _merge_multi(
    agents: Any,
    opts: BurnOptions,
    mine: dict[str, Any],
    thresholds: Thresholds,
    injection: Injection,
    started_at: float,
) -> dict[str, Any]:
    """Agent 0 gathers every agent's result and publishes the merged report; the others fetch it."""
    launch = opts.launch
    timeout = datetime.timedelta(seconds=MERGE_TIMEOUT_SECONDS + opts.heartbeat_timeout_seconds)
    abort = mine.get("abort") or {}
    lost = set(abort.get("agents") or ()) if abort.get("kind") == "lost" else set()
    try:
        agents.set(f"node/{launch.agent_index}", json.dumps(mine))
    except Exception as exc:
        if launch.is_leader:
            raise
        final = _report([mine], opts, thresholds, injection, started_at)  # the store went with agent 0
        if not final["faults"]:
            final["faults"].append(f"lost contact with agent 0 (it hosts the rendezvous store): {exc}")
            final["exit_code"], final["verdict"] = 1, "fail"
        return final
    if launch.is_leader:
        nodes = [mine]
        missing = []
        deadline = time.monotonic() + timeout.total_seconds()
        for i in range(1, launch.agent_count):
            key = f"node/{i}"
            until = min(deadline, time.monotonic() + LOST_MERGE_GRACE_SECONDS) if i in lost else deadline
            while not agents.check([key]) and time.monotonic() < until:
                time.sleep(0.2)
            if agents.check([key]):
                nodes.append(json.loads(agents.get(key)))
                lost.discard(i)
            elif i not in lost:  # a lost agent is named in the abort already
                missing.append(i)
        final = _report(nodes, opts, thresholds, injection, started_at)
        for i in missing:
            final["faults"].append(f"agent {i} sent no result within {timeout.total_seconds():.0f} s (node lost?)")
            final["exit_code"], final["verdict"] = 1, "fail"
        agents.set("report", json.dumps(final))
        with contextlib.suppress(Exception):  # stay up (we may host the store) until everyone has the report
            agents.wait(
                [f"fetched/{i}" for i in range(1, launch.agent_count) if i not in missing and i not in lost],
                datetime.timedelta(seconds=30),
            )
        return final
    if 0 in lost or (abort.get("kind") == "dead" and not abort.get("ranks")):
        # agent 0 (and the store it hosts) is gone: this node reports what it has
        return _report([mine], opts, thresholds, injection, started_at)
    try:
        agents.wait(["report"], timeout)
        final = json.loads(agents.get("report"))
        agents.set(f"fetched/{launch.agent_index}", "1")
    except Exception as exc:
        final = _report([mine], opts, thresholds, injection, started_at)
        final["faults"].append(f"no merged report from agent 0 within {timeout.total_seconds():.0f} s ({exc})")
        final["exit_code"], final["verdict"] = 1, "fail"
    return dict(final)


__all__ = ["EXIT_CANNOT_RUN", "run_burn"]
