"""The agents' results to one report: judged on this node, or gathered by agent 0 from every agent."""

from __future__ import annotations

import contextlib
import datetime
import json
import time
from typing import Any

from gpumon.burn.orchestration.options import BurnOptions
from gpumon.burn.verdict import report as report_mod
from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.thresholds import Thresholds
from gpumon.burn.workloads.inject import Injection

MERGE_TIMEOUT_SECONDS = 120.0
LOST_MERGE_GRACE_SECONDS = 5.0
"""How long agent 0 still waits for the result of an agent named lost (one that was only starved of CPU
comes back within it and is merged; a node that is gone costs this much)."""


def build_report(
    nodes: list[dict[str, Any]], opts: BurnOptions, thresholds: Thresholds, injection: Injection, started_at: float
) -> dict[str, Any]:
    """The judged report of these node results, with the options and thresholds it was judged under."""
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
            "long": opts.long,
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


def merge_results(
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
        final = build_report([mine], opts, thresholds, injection, started_at)  # the store went with agent 0
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
        final = build_report(nodes, opts, thresholds, injection, started_at)
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
        return build_report([mine], opts, thresholds, injection, started_at)
    try:
        agents.wait(["report"], timeout)
        final = json.loads(agents.get("report"))
        agents.set(f"fetched/{launch.agent_index}", "1")
    except Exception as exc:
        final = build_report([mine], opts, thresholds, injection, started_at)
        final["faults"].append(f"no merged report from agent 0 within {timeout.total_seconds():.0f} s ({exc})")
        final["exit_code"], final["verdict"] = 1, "fail"
    return dict(final)
