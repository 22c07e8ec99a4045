"""Judge the merged results: every figure against its peers and floors; name the GPU, link or rank.

Pure functions over JSON-ready data, so every rule is unit-tested without torch. This module
merges the nodes and orders the rules; each test's rules live in ``judge_loads``,
``judge_allreduce`` and ``judge_telemetry``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from gpumon.burn.verdict.judge_allreduce import judge_allreduce
from gpumon.burn.verdict.judge_fingerprint import judge_fingerprint
from gpumon.burn.verdict.judge_loads import judge_matmul, judge_memory, judge_p2p
from gpumon.burn.verdict.judge_pcie import judge_pcie
from gpumon.burn.verdict.judge_soak import judge_pulse, report_settle
from gpumon.burn.verdict.judge_telemetry import judge_telemetry
from gpumon.burn.verdict.judgement import GpuKey, Judgement
from gpumon.burn.verdict.thresholds import Thresholds, group_link


def judge(nodes: list[dict[str, Any]], thresholds: Thresholds, tests: tuple[str, ...]) -> Judgement:
    """Checks, faults and per-GPU summaries for the whole run (all nodes)."""
    j = Judgement(multi_node=len(nodes) > 1)
    results = _merge_nodes(j, nodes, tests)
    for node in nodes:
        j.busy |= {(node["node"], int(g)) for g in node.get("busy_gpus", ())}
        for r in node["ranks"]:
            _partial_matmul(j, (node["node"], r["gpu"]), r)
    for node in nodes:
        _judge_sw(j, node)
    _judge_aborts(j, nodes)
    _judge_errors(j, nodes)
    _judge_loads(j, results, nodes, thresholds, tests)
    _summarise_gpus(j, tests)
    j.cannot_run = list(dict.fromkeys(j.cannot_run))
    return j


def _merge_nodes(j: Judgement, nodes: list[dict[str, Any]], tests: tuple[str, ...]) -> dict[str, dict[GpuKey, Any]]:
    """Every node's GPUs into ``j.gpus`` (and node names when each node has its own); returns the results by test."""
    names = {int(node["node"]): str(node.get("hostname") or "") for node in nodes}
    if len(nodes) > 1 and "" not in names.values() and len(set(names.values())) == len(names):
        j.node_names = names  # nodes told apart by name too (one host in tests: indices only)
    results: dict[str, dict[GpuKey, Any]] = {t: {} for t in tests}
    for node in nodes:
        n = node["node"]
        for r in node["ranks"]:
            key = (n, r["gpu"])
            info = node.get("gpus_info", {}).get(str(r["gpu"]), {})
            j.gpus[key] = {
                "node": n,
                "gpu": r["gpu"],
                "rank": r["rank"],
                "uuid": info.get("uuid"),
                "model": r.get("model") or info.get("name") or "unknown",
                "hostname": node.get("hostname"),
                "telemetry": node.get("telemetry", {}).get(str(r["gpu"]), {}),
                "startup_seconds": r.get("startup_seconds") or {},
                "tests": {},
            }
            for test, data in r["results"].items():
                results.setdefault(test, {})[key] = data
    return results


def _judge_aborts(j: Judgement, nodes: list[dict[str, Any]]) -> None:
    """The watchdog's finding first: it names the cause, the workers' errors after it are fallout."""
    seen_aborts: set[str] = set()
    for node in nodes:
        abort = node.get("abort")
        if abort and abort["kind"] in ("hang", "dead", "lost") and abort["message"] not in seen_aborts:
            seen_aborts.add(abort["message"])
            ranks = set(abort["ranks"])
            keys = [k for k, g in j.gpus.items() if g["rank"] in ranks]
            if not keys:  # a lost node's GPUs sent nothing, or the other nodes could not be reached
                j.add("run", None, "node_lost" if abort["kind"] == "lost" else "worker_died", False, abort["message"])
                j.faults[-1] = abort["message"]
                continue
            test = _last_test(nodes, ranks)
            for i, key in enumerate(keys):
                j.add(
                    test,
                    key,
                    "watchdog" if abort["kind"] == "hang" else "worker_died",
                    False,
                    abort["message"],
                    fault=abort["message"] if i == 0 else "",
                )
        if abort and abort["kind"] == "cannot_run":
            j.cannot_run.append(abort["message"])


def _judge_errors(j: Judgement, nodes: list[dict[str, Any]]) -> None:
    """The workers' errors: a fault of their GPU, unless raised because the run was being stopped."""
    for node in nodes:
        for r in node["ranks"]:
            for err in r["errors"]:
                message = str(err.get("message"))
                if err.get("kind") == "cannot_run":
                    j.cannot_run.append(message)
                elif err.get("after_abort"):
                    # raised because the run was being stopped (a peer killed, a link closed)
                    j.add(str(err.get("test")), (node["node"], r["gpu"]), "error", None, "after the stop: " + message)
                else:
                    j.add(str(err.get("test")), (node["node"], r["gpu"]), "error", False, message, fault=message)


def _judge_loads(
    j: Judgement,
    results: dict[str, dict[GpuKey, Any]],
    nodes: list[dict[str, Any]],
    thresholds: Thresholds,
    tests: tuple[str, ...],
) -> None:
    """Each load test's rules on its results, and the telemetry rules, in report order."""
    if "fingerprint" in tests:
        judge_fingerprint(j, results.get("fingerprint", {}))
    if "pcie" in tests:
        judge_pcie(j, results.get("pcie", {}), nodes, thresholds)
    if "matmul" in tests:
        judge_matmul(j, results.get("matmul", {}), thresholds)
    if "memory" in tests:
        judge_memory(j, results.get("memory", {}), thresholds)
    if "p2p" in tests:
        judge_p2p(j, results.get("p2p", {}), nodes, thresholds)
    for key, g in j.gpus.items():
        judge_telemetry(j, key, g["telemetry"])
        if g["telemetry"].get("simulated") is not True:
            report_settle(j, key, g["telemetry"])
    if "allreduce" in tests:
        link = None
        if len(nodes) == 1:
            gpus = [g for (_n, g), d in results.get("allreduce", {}).items() if "skipped" not in d]
            link = group_link(nodes[0].get("topology") or {}, nodes[0].get("pcie") or {}, sorted(gpus))
        judge_allreduce(j, results.get("allreduce", {}), thresholds, single_node=len(nodes) == 1, link=link)
    if "pulse" in tests:
        judge_pulse(j, results.get("pulse", {}), thresholds)


def _summarise_gpus(j: Judgement, tests: tuple[str, ...]) -> None:
    """Each GPU's verdict per test (None: not judged) from the checks that count for it, with notes."""
    for key, g in j.gpus.items():
        for test in tests:
            checks = [c for c in j.checks if c["test"] == test]
            verdicts = [c["passed"] for c in checks if c["passed"] is not None and _counts_for(c, key)]
            note = _charged_elsewhere(j, checks, key)
            # only links charged to their other end (two GPUs, one link): it passes, with the note
            g["tests"][test] = all(verdicts) if verdicts else (True if note else None)
            if note and g["tests"][test] is not False:
                g.setdefault("notes", {})[test] = note
        tel = g["telemetry"]
        if tel and "telemetry" not in g["tests"]:
            g["tests"]["telemetry"] = all(
                c["passed"] is not False for c in j.checks if c["test"] == "telemetry" and (c["node"], c["gpu"]) == key
            )


def _counts_for(check: Mapping[str, Any], key: GpuKey) -> bool:
    """Whether ``check`` says what GPU ``key`` did: its own check, a result of a group it is in, or a
    failed link of it; a link's failure counts only for the GPU it is charged to (``blame_links``)."""
    if "charged_to" in check:
        return list(key) in check["charged_to"]
    if (check["node"], check["gpu"]) == key or list(key) in check.get("group", ()):
        return True
    return check.get("peer_gpu") is not None and (check["node"], check["peer_gpu"]) == key and check["passed"] is False


def _charged_elsewhere(j: Judgement, checks: list[dict[str, Any]], key: GpuKey) -> str:
    """The note of a GPU at one end of slow links charged to the GPU at the other end ("" when none)."""
    others = sorted(
        {
            (c["charged_to"][0][0], c["charged_to"][0][1])
            for c in checks
            if "charged_to" in c and list(key) in c["link"] and list(key) not in c["charged_to"]
        }
    )
    if not others:
        return ""
    names = ", ".join(j.name(k) for k in others)
    return f"slow only on its links to {names}, which the faults name (slow on every link)"


def _partial_matmul(j: Judgement, key: GpuKey, rank: Mapping[str, Any]) -> None:
    """The rounds a GPU finished before the run was stopped (a hang elsewhere, a lost node): shown, not judged."""
    rates = (rank.get("partial") or {}).get("matmul", {}).get("tflops_rounds") or []
    if not rates or "matmul" in rank["results"]:
        return
    median = statistics.median(rates)
    j.gpus[key]["matmul"] = {"dtype": None, "tflops": median, "tflops_max": max(rates), "partial": True}
    j.add(
        "matmul",
        key,
        "partial",
        None,
        f"{len(rates)} rounds done when the run was stopped: median {median:.1f} TFLOP/s, "
        f"max {max(rates):.1f} (not judged)",
        median * 1e12,
        "flop_per_second",
    )


def _last_test(nodes: list[dict[str, Any]], ranks: set[int]) -> str:
    for node in nodes:
        for r in node["ranks"]:
            if r["rank"] in ranks:
                return str(r.get("last_test") or "run")
    return "run"


def _judge_sw(j: Judgement, node: dict[str, Any]) -> None:
    for c in node.get("sw", []):
        key = (node["node"], c["gpu"]) if c["gpu"] is not None else None
        if c["severity"] in ("busy", "cannot_run"):
            passed: bool | None = None if c["severity"] == "busy" else False
        else:
            passed = None if c["severity"] == "skipped" else c["severity"] != "fault"
        j.add("sw", key, c["name"], passed, c["detail"] + (" (warning)" if c["severity"] == "warn" else ""))
