"""Rules for the all-reduce: every result exact, group busbw against its floor, pairwise runs to blame a link."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.burn.verdict.judgement import GpuKey, Judgement, blame_links, slow_gpus, upper_quartile
from gpumon.burn.verdict.thresholds import GroupLink, Thresholds


def _suspects(j: Judgement, members: list[GpuKey], slow_alone: set[GpuKey]) -> dict[GpuKey, list[str]]:
    """Members of a group that other tests already name: failed checks, shared with other processes,
    or slow on every link in the pairwise runs (``slow_alone``)."""
    out: dict[GpuKey, list[str]] = {k: ["shared with other compute processes"] for k in members if k in j.busy}
    for k in members:
        if k in slow_alone:
            out.setdefault(k, []).append("slow on every link in the pairwise runs")
    for c in j.checks:
        key = (c["node"], c["gpu"])
        if key not in members or c["test"] == "allreduce" or list(key) not in c.get("charged_to", [list(key)]):
            continue  # (a slow link charged to the GPU at its other end names that GPU, not this one)
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
    j: Judgement,
    members: list[GpuKey],
    busbw: float,
    floor: float,
    detail: str,
    ran: Mapping[GpuKey, Any],
    slow_alone: set[GpuKey],
) -> None:
    """A group all-reduce below its floor: the GPUs other tests or the pairwise runs name get it, else
    the whole group does."""
    head = f"all-reduce over {len(members)} ranks: busbw {busbw / 1e9:.1f} GB/s below the floor {floor / 1e9:.1f}"
    tail = "; pairwise runs follow" if any("pairwise" in d for d in ran.values()) else ""
    suspects = _suspects(j, members, slow_alone)
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


def judge_allreduce(
    j: Judgement, res: Mapping[GpuKey, Any], th: Thresholds, single_node: bool, link: GroupLink | None = None
) -> None:
    """Every rank's result exact, the pairwise runs against each other, the group's busbw against its floor."""
    ran = {k: d for k, d in res.items() if "skipped" not in d}
    for key, d in res.items():
        if "skipped" in d:
            j.add("allreduce", key, "skipped", None, d["skipped"])
    if not ran:
        return
    _judge_exact(j, ran)
    lead = min(ran, key=lambda k: j.gpus[k]["rank"])
    members = sorted(ran, key=lambda k: j.gpus[k]["rank"])
    _record_sizes(j, ran, lead)
    _timing_fallbacks(j, ran, members)
    pair_faults, slow_alone = _judge_pairs(j, ran, th)
    _judge_group_busbw(j, ran, lead, members, th, single_node, link, slow_alone)
    j.faults += pair_faults  # after the group's line, which says the pairwise runs follow


def _judge_exact(j: Judgement, ran: Mapping[GpuKey, Any]) -> None:
    """Each rank's all-reduce results summed exactly (no element wrong, at any size)."""
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


def _record_sizes(j: Judgement, ran: Mapping[GpuKey, Any], lead: GpuKey) -> None:
    """The lead rank's figures (largest size's busbw, every size) on each GPU of the group, for the report."""
    sizes = ran[lead]["sizes"]
    largest = sizes[-1]
    for key in ran:
        j.gpus[key]["allreduce"] = {
            "busbw_bytes_per_second": largest["busbw_bytes_per_second"],
            "bytes": largest["bytes"],
            "dtype": ran[lead].get("dtype"),
            "sizes": [
                {
                    **{k: s[k] for k in ("bytes", "iterations", "algbw_bytes_per_second", "busbw_bytes_per_second")},
                    **({"timing": s["timing"]} if "timing" in s else {}),
                }
                for s in sizes
            ],
            "tails": [{"bytes": s["bytes"], **s["tails"]} for s in ran[key]["sizes"] if "tails" in s],
        }


def _judge_pairs(j: Judgement, ran: Mapping[GpuKey, Any], th: Thresholds) -> tuple[list[str], set[GpuKey]]:
    """The pairwise runs against what the fine pairs reach (their upper quartile: a slow GPU is in up to
    half the pairs); returns the slow links' faults and the GPUs slow on every link."""
    pairs = [p for d in ran.values() for p in d.get("pairwise", [])]
    if not pairs:
        return [], set()
    by_rank = {g["rank"]: k for k, g in j.gpus.items()}
    reference = upper_quartile(p["busbw_bytes_per_second"] for p in pairs) or 0.0
    limit = (1 - th.link_fraction) * reference  # pairs against each other: the floor only decided to run them
    judged = []
    for p in pairs:
        a, b = by_rank[p["ranks"][0]], by_rank[p["ranks"][1]]
        slow = p["busbw_bytes_per_second"] < limit
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
        judged.append((a, b, slow, j.checks[-1]))
    return blame_links(j, "allreduce", judged), slow_gpus([(a, b, slow) for a, b, slow, _check in judged])


def _judge_group_busbw(
    j: Judgement,
    ran: Mapping[GpuKey, Any],
    lead: GpuKey,
    members: list[GpuKey],
    th: Thresholds,
    single_node: bool,
    link: GroupLink | None,
    slow_alone: set[GpuKey],
) -> None:
    """The group's busbw at the largest size against the lowest floor of its models (none: reported only)."""
    sizes = ran[lead]["sizes"]
    largest = sizes[-1]
    busbw = largest["busbw_bytes_per_second"]
    models = sorted({j.gpus[k]["model"] for k in ran})
    floors = [f for m in models if (f := th.allreduce_floor_bytes_per_second(m, single_node, link)) is not None]
    floor = min(floors) if floors else None
    over = f" over {link.describe()}" if link is not None and link.kind != "unknown" else ""
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
        _group_too_slow(
            j, members, busbw, floor, f"{figures}; below the floor {floor / 1e9:.1f}{over}", ran, slow_alone
        )


def _timing_fallbacks(j: Judgement, ran: Mapping[GpuKey, Any], members: list[GpuKey]) -> None:
    """Sizes meant for a CUDA graph but timed eagerly: reported with the reason (their busbw includes launch overhead)."""
    reasons: dict[int, str] = {}
    for d in ran.values():
        for s in d["sizes"]:
            reason = s.get("timing_fallback")
            if reason and (s["bytes"] not in reasons or "another rank" in reasons[s["bytes"]]):
                reasons[s["bytes"]] = reason  # the rank whose capture failed says why
    if not reasons:
        return
    sizes = ", ".join(f"{b / 2**20:.0f} MiB" for b in sorted(reasons))
    why = "; ".join(dict.fromkeys(reasons[b] for b in sorted(reasons)))
    j.add(
        "allreduce",
        None,
        "timing",
        None,
        f"{sizes} timed with an eager loop, not a CUDA graph ({why}): their busbw includes launch overhead",
        group=members,
    )
