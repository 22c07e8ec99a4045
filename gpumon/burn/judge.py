"""Judge the merged results: every figure against its peers and floors; name the GPU, link or rank.

Pure functions over JSON-ready data, so every rule is unit-tested without torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.burn.thresholds import GroupLink, Thresholds, group_link

NVLINK_ERROR_TYPES = ("replay", "recovery", "crc")
"""The NVLink counters nvidia-smi nvlink -e shows as errors; growth of any other counter is not judged."""

GpuKey = tuple[int, int]
"""(node, gpu index on that node)."""


@dataclass
class Judgement:
    checks: list[dict[str, Any]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    cannot_run: list[str] = field(default_factory=list)
    gpus: dict[GpuKey, dict[str, Any]] = field(default_factory=dict)
    multi_node: bool = False
    busy: set[GpuKey] = field(default_factory=set)
    """GPUs other compute processes used when the burn started (run with --force), sw test or not."""

    def name(self, key: GpuKey) -> str:
        node, gpu = key
        return f"node {node} GPU {gpu}" if self.multi_node else f"GPU {gpu}"

    def add(
        self,
        test: str,
        key: GpuKey | None,
        check: str,
        passed: bool | None,
        detail: str,
        value: float | None = None,
        unit: str | None = None,
        threshold: float | None = None,
        peer: int | None = None,
        fault: str | None = None,
        group: list[GpuKey] | None = None,
    ) -> None:
        """Record a check; a failed one adds ``fault`` (or a line built from it) to the faults.

        ``group``: a result of several GPUs together (``key`` None): it counts for each of them.
        """
        row: dict[str, Any] = {
            "test": test,
            "check": check,
            "passed": passed,
            "detail": detail,
            "node": key[0] if key else None,
            "gpu": key[1] if key else None,
            "uuid": self.gpus.get(key, {}).get("uuid") if key else None,
            "rank": self.gpus.get(key, {}).get("rank") if key else None,
            "value": value,
            "unit": unit,
            "threshold": threshold,
        }
        if peer is not None:
            row["peer_gpu"] = peer
        if group is not None:
            row["group"] = [list(k) for k in group]
        self.checks.append(row)
        if passed is False and fault != "":
            where = self.name(key) if key else "host"
            if key and self.gpus.get(key, {}).get("uuid"):
                where += f" ({self.gpus[key]['uuid']})"
            self.faults.append(fault if fault is not None else f"{where}: {test}: {detail}")


def _median(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def judge(nodes: list[dict[str, Any]], thresholds: Thresholds, tests: tuple[str, ...]) -> Judgement:
    """Checks, faults and per-GPU summaries for the whole run (all nodes)."""
    j = Judgement(multi_node=len(nodes) > 1)
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
                "tests": {},
            }
            for test, data in r["results"].items():
                results.setdefault(test, {})[key] = data
    for node in nodes:
        j.busy |= {(node["node"], int(g)) for g in node.get("busy_gpus", ())}
        for r in node["ranks"]:
            _partial_matmul(j, (node["node"], r["gpu"]), r)
    for node in nodes:
        _judge_sw(j, node)
    # The watchdog's finding first: it names the cause, the workers' errors after it are fallout.
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
    if "matmul" in tests:
        _judge_matmul(j, results.get("matmul", {}), thresholds)
    if "memory" in tests:
        _judge_memory(j, results.get("memory", {}), thresholds)
    if "p2p" in tests:
        _judge_p2p(j, results.get("p2p", {}), nodes, thresholds)
    for key, g in j.gpus.items():
        _judge_telemetry(j, key, g["telemetry"])
    if "allreduce" in tests:
        link = None
        if len(nodes) == 1:
            gpus = [g for (_n, g), d in results.get("allreduce", {}).items() if "skipped" not in d]
            link = group_link(nodes[0].get("topology") or {}, nodes[0].get("pcie") or {}, sorted(gpus))
        _judge_allreduce(j, results.get("allreduce", {}), thresholds, single_node=len(nodes) == 1, link=link)
    for key, g in j.gpus.items():
        for test in tests:
            mine = [
                c
                for c in j.checks
                if (c["test"] == test and (c["node"], c["gpu"]) == key)
                or (
                    c["test"] == test
                    and c.get("peer_gpu") is not None
                    and (c["node"], c["peer_gpu"]) == key
                    and c["passed"] is False
                )
                or (c["test"] == test and list(key) in c.get("group", ()))
            ]
            verdicts = [c["passed"] for c in mine if c["passed"] is not None]
            g["tests"][test] = all(verdicts) if verdicts else None
        tel = g["telemetry"]
        if tel and "telemetry" not in g["tests"]:
            g["tests"]["telemetry"] = all(
                c["passed"] is not False for c in j.checks if c["test"] == "telemetry" and (c["node"], c["gpu"]) == key
            )
    j.cannot_run = list(dict.fromkeys(j.cannot_run))
    return j


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


def _peer_check(
    j: Judgement,
    test: str,
    check: str,
    items: Mapping[GpuKey, float],
    group_of: Mapping[GpuKey, str],
    fraction: float,
    unit: str,
    scale: float,
    label: str,
) -> None:
    """Each value against the median of its group (same model): more than ``fraction`` below fails."""
    groups: dict[str, list[GpuKey]] = {}
    for key in items:
        groups.setdefault(group_of[key], []).append(key)
    for group, keys in groups.items():
        med = _median(items[k] for k in keys)
        for key in keys:
            value = items[key]
            if len(keys) < 2 or med is None:
                j.add(test, key, check, None, f"no same-model peer to compare with ({group})", value, unit)
                continue
            limit = (1 - fraction) * med
            below = 1 - value / med if med else 0.0
            ok = value >= limit
            detail = (
                (
                    f"{value / scale:.1f} {label}, {below * 100:.0f}% below the median {med / scale:.1f} of "
                    f"{len(keys)} {group} GPUs (straggler limit {fraction * 100:.0f}%)"
                )
                if not ok
                else (f"{value / scale:.1f} {label} vs median {med / scale:.1f} of {len(keys)} {group} GPUs")
            )
            j.add(test, key, check, ok, detail, value, unit, limit)


def _judge_matmul(j: Judgement, res: Mapping[GpuKey, Any], th: Thresholds) -> None:
    groups: dict[tuple[str, str, int], list[GpuKey]] = {}
    for key, d in res.items():
        j.gpus[key]["matmul"] = {"dtype": d["dtype"], "tflops": d["tflops_median"], "tflops_max": d["tflops_max"]}
        bad_rounds = d["checksum_mismatch_rounds"]
        j.add(
            "matmul",
            key,
            "bit_exact_repeat",
            not bad_rounds,
            f"output changed between identical GEMMs in {len(bad_rounds)} of {d['rounds']} rounds: "
            "silent data corruption"
            if bad_rounds
            else f"{d['rounds']} rounds bit-identical",
        )
        ref = d["reference"]
        j.add(
            "matmul",
            key,
            "float64_reference",
            bool(ref["passed"]),
            f"relative error {ref['max_rel_error']:.2e} vs float64 on a {ref['size']}³ product "
            f"(tolerance {ref['tolerance']:.0e} for {d['dtype']})",
            ref["max_rel_error"],
            "ratio",
            ref["tolerance"],
        )
        groups.setdefault((d["model"], d["dtype"], d["n"]), []).append(key)
    for (model, _dtype, _n), keys in groups.items():
        if len(keys) < 2:
            continue
        # round 0's output is compared across GPUs; later rounds are compared with round 0 above
        counts: dict[str, int] = {}
        for k in keys:
            counts[res[k]["checksum_first"]] = counts.get(res[k]["checksum_first"], 0) + 1
        majority = next((c for c, cnt in counts.items() if cnt * 2 > len(keys)), None)
        trusted = {
            res[k]["checksum_first"]
            for k in keys
            if not res[k]["checksum_mismatch_rounds"] and res[k]["reference"]["passed"]
        }
        if majority is None and len(trusted) == 1:
            majority = next(iter(trusted))  # the GPUs that are self-consistent and right agree
        for k in keys:
            mine = res[k]["checksum_first"]
            if majority is not None:
                ok = mine == majority
                detail = (
                    f"output identical to {counts[majority] - (1 if ok else 0)} {model} peers"
                    if ok
                    else f"output differs from {counts[majority]} {model} peers given identical inputs"
                )
            else:
                ok = len(counts) == 1
                detail = (
                    "identical"
                    if ok
                    else (
                        f"outputs of {', '.join(j.name(x) for x in keys)} differ with no majority: one of them is wrong"
                    )
                )
            j.add("matmul", k, "bit_exact_peers", ok, detail)
    rates = {k: d["tflops_median"] * 1e12 for k, d in res.items()}
    group_of = {k: f"{d['model']} {d['dtype']}" for k, d in res.items()}
    _peer_check(j, "matmul", "peers", rates, group_of, th.straggler_fraction, "flop_per_second", 1e12, "TFLOP/s")
    for k, d in res.items():
        floor = th.matmul_floor_tflops(d["model"], d["dtype"])
        if floor is not None:
            ok = d["tflops_median"] >= floor
            j.add(
                "matmul",
                k,
                "floor",
                ok,
                f"{d['tflops_median']:.1f} TFLOP/s {'>=' if ok else 'below'} the {d['model']} {d['dtype']} "
                f"floor {floor:.0f}",
                d["tflops_median"] * 1e12,
                "flop_per_second",
                floor * 1e12,
            )


def _judge_memory(j: Judgement, res: Mapping[GpuKey, Any], th: Thresholds) -> None:
    for key, d in res.items():
        j.gpus[key]["memory"] = {
            "bandwidth_bytes_per_second": d["bandwidth_bytes_per_second"],
            "bytes_tested": d["bytes_tested"],
        }
        bad = d["mismatched_words"]
        j.add(
            "memory",
            key,
            "patterns",
            bad == 0,
            f"{bad} words read back wrong (first: {d['first_mismatch']}) in {d['bytes_tested'] / 2**30:.1f} GiB"
            if bad
            else f"{d['bytes_tested'] / 2**30:.2f} GiB verified with {len(d['patterns'])} patterns",
            bad,
            "words",
            0,
        )
    bw = {k: d["bandwidth_bytes_per_second"] for k, d in res.items()}
    group_of = {k: d["model"] for k, d in res.items()}
    _peer_check(j, "memory", "peers", bw, group_of, th.straggler_fraction, "bytes_per_second", 1e9, "GB/s")
    for k, d in res.items():
        floor = th.memory_floor_bytes_per_second(d["model"])
        if floor is not None:
            ok = d["bandwidth_bytes_per_second"] >= floor
            j.add(
                "memory",
                k,
                "floor",
                ok,
                f"{d['bandwidth_bytes_per_second'] / 1e9:.0f} GB/s {'>=' if ok else 'below'} the {d['model']} "
                f"floor {floor / 1e9:.0f}",
                d["bandwidth_bytes_per_second"],
                "bytes_per_second",
                floor,
            )


def _blame_links(j: Judgement, test: str, pairs: list[tuple[GpuKey, GpuKey, bool]]) -> list[str]:
    """A GPU whose every pair is slow (while other pairs are fine) is blamed; otherwise the links."""
    lines = []
    gpus = {k for a, b, _ in pairs for k in (a, b)}
    bad_gpus = set()
    for g in gpus:
        mine = [slow for a, b, slow in pairs if g in (a, b)]
        others = [slow for a, b, slow in pairs if g not in (a, b)]
        if mine and all(mine) and others and not any(others):
            bad_gpus.add(g)
    for g in sorted(bad_gpus):
        lines.append(f"{j.name(g)}: {test}: every link of this GPU is slow while the other links are fine")
    for a, b, slow in pairs:
        if slow and a not in bad_gpus and b not in bad_gpus:
            lines.append(f"link {j.name(a)} <-> {j.name(b)}: {test}: slow")
    return lines


def _judge_p2p(j: Judgement, res: Mapping[GpuKey, Any], nodes: list[dict[str, Any]], th: Thresholds) -> None:
    topo = {(n["node"], int(g)): levels for n in nodes for g, levels in n.get("topology", {}).items()}
    rows = []
    for key, d in res.items():
        if "skipped" in d:
            j.add("p2p", key, "skipped", None, d["skipped"])
            continue
        for p in d["pairs"]:
            src, dst = key, (key[0], p["dst_gpu"])
            path = (topo.get(src) or {}).get(str(p["dst_gpu"]), "unknown")
            rows.append((src, dst, path, p))
            j.gpus[src].setdefault("p2p", {})[str(p["dst_gpu"])] = p["bytes_per_second"]
    groups: dict[str, list[float]] = {}
    for src, _dst, path, p in rows:
        groups.setdefault(f"{j.gpus[src]['model']} {path}", []).append(p["bytes_per_second"])
    slow_pairs = []
    for src, dst, path, p in rows:
        med = _median(groups[f"{j.gpus[src]['model']} {path}"])
        bw = p["bytes_per_second"]
        floor = th.p2p_floor_bytes_per_second(j.gpus[src]["model"], path)
        limit = max((1 - th.link_fraction) * med if med else 0.0, floor or 0.0)
        slow = bw < limit
        slow_pairs.append((src, dst, slow))
        j.add(
            "p2p",
            src,
            "bandwidth",
            not slow,
            f"{j.name(src)} -> {j.name(dst)} over {path}: {bw / 1e9:.1f} GB/s (median of {path} pairs "
            f"{(med or 0) / 1e9:.1f}, limit {limit / 1e9:.1f})",
            bw,
            "bytes_per_second",
            limit,
            peer=dst[1],
            fault="",
        )
        if not p["checksum_ok"]:
            j.add(
                "p2p", src, "data", False, f"data copied {j.name(src)} -> {j.name(dst)} arrived corrupted", peer=dst[1]
            )
    j.faults += _blame_links(j, "p2p", slow_pairs)


def _suspects(j: Judgement, members: list[GpuKey]) -> dict[GpuKey, list[str]]:
    """Members of a group that other tests already name: failed checks, or shared with other processes."""
    out: dict[GpuKey, list[str]] = {k: ["shared with other compute processes"] for k in members if k in j.busy}
    for c in j.checks:
        key = (c["node"], c["gpu"])
        if key not in members or c["test"] == "allreduce":
            continue
        if c["passed"] is False:
            reason = f"failed {c['test']}"
        elif c["test"] == "sw" and c["check"] == "processes" and c["passed"] is None:
            reason = "shared with other compute processes"
        else:
            continue
        reasons = out.setdefault(key, [])
        if reason not in reasons:
            reasons.append(reason)
    return out


def _group_too_slow(
    j: Judgement, members: list[GpuKey], busbw: float, floor: float, detail: str, ran: Mapping[GpuKey, Any]
) -> None:
    """A group all-reduce below its floor: the GPUs other tests name get it, else the whole group does."""
    head = f"all-reduce over {len(members)} ranks: busbw {busbw / 1e9:.1f} GB/s below the floor {floor / 1e9:.1f}"
    tail = "; pairwise runs follow" if any("pairwise" in d for d in ran.values()) else ""
    suspects = _suspects(j, members)
    if suspects:
        named = "; ".join(f"{j.name(k)} {', '.join(why)}" for k, why in suspects.items())
        for i, key in enumerate(suspects):
            j.add(
                "allreduce",
                key,
                "busbw",
                False,
                f"busbw GB/s: {detail}; the likely cause, as other tests name it: {named}",
                busbw,
                "bytes_per_second",
                floor,
                fault=f"{head}; likely cause: {named}{tail}" if i == 0 else "",
            )
        return
    names = ", ".join(j.name(k) for k in members)
    j.add(
        "allreduce",
        None,
        "busbw",
        False,
        f"busbw GB/s: {detail}; no other test names one of {names}: the group fails together",
        busbw,
        "bytes_per_second",
        floor,
        fault=f"{head} ({names}: no other test names one of them){tail}",
        group=members,
    )


def _judge_allreduce(
    j: Judgement, res: Mapping[GpuKey, Any], th: Thresholds, single_node: bool, link: GroupLink | None = None
) -> None:
    ran = {k: d for k, d in res.items() if "skipped" not in d}
    for key, d in res.items():
        if "skipped" in d:
            j.add("allreduce", key, "skipped", None, d["skipped"])
    if not ran:
        return
    for key, d in ran.items():
        bad = sum(s.get("mismatched_elements", 0) for s in d["sizes"])
        j.add(
            "allreduce",
            key,
            "correct",
            bad == 0,
            f"{bad} elements of the all-reduce result wrong on rank {j.gpus[key]['rank']}"
            if bad
            else f"all {len(d['sizes'])} sizes summed exactly",
            bad,
            "elements",
            0,
        )
    lead = min(ran, key=lambda k: j.gpus[k]["rank"])
    sizes = ran[lead]["sizes"]
    largest = sizes[-1]
    busbw = largest["busbw_bytes_per_second"]
    models = sorted({j.gpus[k]["model"] for k in ran})
    floors = [f for m in models if (f := th.allreduce_floor_bytes_per_second(m, single_node, link)) is not None]
    floor = min(floors) if floors else None
    members = sorted(ran, key=lambda k: j.gpus[k]["rank"])
    over = f" over {link.describe()}" if link is not None and link.kind != "unknown" else ""
    for key in ran:
        j.gpus[key]["allreduce"] = {
            "busbw_bytes_per_second": busbw,
            "bytes": largest["bytes"],
            "dtype": ran[lead].get("dtype"),
            "sizes": [
                {k: s[k] for k in ("bytes", "iterations", "algbw_bytes_per_second", "busbw_bytes_per_second")}
                for s in sizes
            ],
        }
    figures = ", ".join(f"{s['bytes'] / 2**20:.0f} MiB {s['busbw_bytes_per_second'] / 1e9:.1f}" for s in sizes)
    if floor is None:
        j.add(
            "allreduce",
            None,
            "busbw",
            None,
            f"busbw GB/s: {figures} (no floor for {', '.join(models)}{over})",
            busbw,
            "bytes_per_second",
            group=members,
        )
    elif busbw >= floor:
        j.add(
            "allreduce",
            None,
            "busbw",
            True,
            f"busbw GB/s: {figures}; >= the floor {floor / 1e9:.1f}{over} at "
            f"{largest['bytes'] / 2**20:.0f} MiB over {len(ran)} ranks",
            busbw,
            "bytes_per_second",
            floor,
            group=members,
        )
    else:
        _group_too_slow(j, members, busbw, floor, f"{figures}; below the floor {floor / 1e9:.1f}{over}", ran)
    pairs = [p for d in ran.values() for p in d.get("pairwise", [])]
    if pairs:
        by_rank = {g["rank"]: k for k, g in j.gpus.items()}
        med = _median(p["busbw_bytes_per_second"] for p in pairs) or 0.0
        limit = (1 - th.link_fraction) * med  # pairs against each other: the floor only decided to run them
        judged = []
        for p in pairs:
            a, b = by_rank[p["ranks"][0]], by_rank[p["ranks"][1]]
            slow = p["busbw_bytes_per_second"] < limit
            judged.append((a, b, slow))
            j.add(
                "allreduce",
                a,
                "pair_busbw",
                not slow,
                f"ranks {p['ranks'][0]}+{p['ranks'][1]}: {p['busbw_bytes_per_second'] / 1e9:.1f} GB/s "
                f"(limit {limit / 1e9:.1f})",
                p["busbw_bytes_per_second"],
                "bytes_per_second",
                limit,
                peer=b[1],
                fault="",
            )
        j.faults += _blame_links(j, "allreduce", judged)


def _judge_telemetry(j: Judgement, key: GpuKey, tel: Mapping[str, Any]) -> None:
    if not tel:
        return
    if tel.get("lost_reason"):
        j.add("telemetry", key, "gpu_lost", False, f"GPU lost during the burn: {tel['lost_reason']}")
    slow = tel.get("slowdowns_seen") or []
    j.add(
        "telemetry",
        key,
        "slowdown",
        not slow,
        f"clock slowdown seen under load: {', '.join(slow)}"
        if slow
        else "no thermal/hardware slowdown"
        + (f" (seen: {', '.join(tel['clock_events_seen'])})" if tel.get("clock_events_seen") else ""),
    )
    ecc = tel.get("ecc_errors_grown") or {}
    unc = sum(v for k, v in ecc.items() if k.startswith("uncorrected"))
    if unc:
        j.add("telemetry", key, "ecc", False, f"{unc} uncorrectable ECC errors during the burn")
    elif ecc:
        j.add("telemetry", key, "ecc", True, f"corrected ECC errors during the burn: {ecc} (warning)")
    rows = tel.get("remapped_rows_grown") or {}
    if rows.get("uncorrectable") or tel.get("row_remap_pending"):
        j.add("telemetry", key, "row_remap", False, f"rows remapped during the burn: {rows}; reset the GPU")
    grown = tel.get("nvlink_errors_grown") or {}
    nvl = {
        link: errors
        for link, counters in grown.items()
        if (errors := {t: n for t, n in counters.items() if t in NVLINK_ERROR_TYPES and n > 0})
    }
    if nvl:
        links = "; ".join(
            f"link {link}: " + ", ".join(f"{t} +{n}" for t, n in sorted(errors.items())) for link, errors in nvl.items()
        )
        j.add("telemetry", key, "nvlink_errors", True, f"NVLink errors grew (nvidia-smi nvlink -e): {links} (warning)")
    gen, gen_max = tel.get("pcie_link_generation_under_load"), tel.get("pcie_link_generation_max")
    if gen is not None and gen_max is not None:
        j.add(
            "telemetry",
            key,
            "pcie_link_generation",
            gen >= gen_max,
            f"PCIe gen {gen} under load (max {gen_max})",
            gen,
            "generation",
            gen_max,
        )
    temp, limit = tel.get("temperature_peak_celsius"), tel.get("temperature_slowdown_threshold_celsius")
    if temp is not None and limit is not None:
        j.add(
            "telemetry",
            key,
            "temperature",
            temp < limit,
            f"peak {temp:.0f} °C (slowdown at {limit:.0f} °C)",
            temp,
            "celsius",
            limit,
        )
