"""Rules for the per-GPU loads: matmul (bit-exact, float64 reference, peers, floor), memory, p2p links."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.burn.verdict.judge_tails import judge_matmul_tails
from gpumon.burn.verdict.judgement import GpuKey, Judgement, blame_links, median, named_by_other_tests, peer_check
from gpumon.burn.verdict.thresholds import Thresholds


def judge_matmul(j: Judgement, res: Mapping[GpuKey, Any], th: Thresholds) -> None:
    """Each GPU's output bit-exact across rounds and close to float64; then against its peers and its floor."""
    groups: dict[tuple[str, str, int], list[GpuKey]] = {}
    for key, d in res.items():
        j.gpus[key]["matmul"] = {"dtype": d["dtype"], "tflops": d["tflops_median"], "tflops_max": d["tflops_max"]}
        _judge_matmul_alone(j, key, d)
        groups.setdefault((d["model"], d["dtype"], d["n"]), []).append(key)
    for (model, _dtype, _n), keys in groups.items():
        if len(keys) >= 2:
            _judge_matmul_bit_exact_peers(j, res, model, keys)
    judge_matmul_tails(j, res, th)
    rates = {k: d["tflops_median"] * 1e12 for k, d in res.items()}
    group_of = {k: f"{d['model']} {d['dtype']}" for k, d in res.items()}
    peer_check(j, "matmul", "peers", rates, group_of, th.straggler_fraction, "flop_per_second", 1e12, "TFLOP/s")
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


def _judge_matmul_alone(j: Judgement, key: GpuKey, d: Mapping[str, Any]) -> None:
    """One GPU on its own: every round's output identical to its first, the product close to float64's."""
    bad_rounds = d["checksum_mismatch_rounds"]
    j.add(
        "matmul",
        key,
        "bit_exact_repeat",
        not bad_rounds,
        f"output changed between identical GEMMs in {len(bad_rounds)} of {d['rounds']} rounds: silent data corruption"
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


def _judge_matmul_bit_exact_peers(j: Judgement, res: Mapping[GpuKey, Any], model: str, keys: list[GpuKey]) -> None:
    """GPUs of one model, dtype and size given identical inputs: each output against the majority's."""
    # round 0's output is compared across GPUs; later rounds are compared with round 0 in _judge_matmul_alone
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
                else (f"outputs of {', '.join(j.name(x) for x in keys)} differ with no majority: one of them is wrong")
            )
        j.add("matmul", k, "bit_exact_peers", ok, detail)


def judge_memory(j: Judgement, res: Mapping[GpuKey, Any], th: Thresholds) -> None:
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
            f"{bad} {'word' if bad == 1 else 'words'} read back wrong (first: {d['first_mismatch']}) in "
            f"{_size(d['bytes_tested'])}"
            if bad
            else f"{_size(d['bytes_tested'])} verified with {len(d['patterns'])} patterns",
            bad,
            "words",
            0,
        )
    bw = {k: d["bandwidth_bytes_per_second"] for k, d in res.items()}
    group_of = {k: d["model"] for k, d in res.items()}
    peer_check(j, "memory", "peers", bw, group_of, th.straggler_fraction, "bytes_per_second", 1e9, "GB/s")
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


def _size(nbytes: int) -> str:
    """ "1.5 GiB", or "16 MiB" below 1 GiB (never "0.0 GiB")."""
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def judge_p2p(j: Judgement, res: Mapping[GpuKey, Any], nodes: list[dict[str, Any]], th: Thresholds) -> None:
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
        med = median(groups[f"{j.gpus[src]['model']} {path}"])
        bw = p["bytes_per_second"]
        floor = th.p2p_floor_bytes_per_second(j.gpus[src]["model"], path)
        limit = max((1 - th.link_fraction) * med if med else 0.0, floor or 0.0)
        slow = bw < limit
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
        slow_pairs.append((src, dst, slow, j.checks[-1]))
        if not p["checksum_ok"]:
            j.add(
                "p2p", src, "data", False, f"data copied {j.name(src)} -> {j.name(dst)} arrived corrupted", peer=dst[1]
            )
    j.faults += blame_links(j, "p2p", slow_pairs, named_by_other_tests(j, "p2p"))
