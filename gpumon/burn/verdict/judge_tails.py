"""Tails: a GPU whose p99 stands out from its peers' (or, alone, from its own median) is named.

Every GEMM of the matmul test is timed (``workloads.tails``): a GPU that stalls one op in a hundred
keeps a fine median and mean, and only its p99 shows it. The rule: p99 above ``tail_factor`` × its
own p50 (a spread of its own, not a uniformly slow GPU: that is the straggler check) and, where it
has same-model peers, above ``tail_factor`` × the median of their p99s (a spread its peers do not
share, not a noisy host).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from gpumon.burn.verdict.judgement import GpuKey, Judgement
from gpumon.burn.verdict.thresholds import Thresholds


def judge_matmul_tails(j: Judgement, res: Mapping[GpuKey, Any], th: Thresholds) -> None:
    """One ``matmul/tail`` check per GPU that recorded its GEMM times."""
    tails = {k: d["tails"] for k, d in res.items() if (d.get("tails") or {}).get("iterations")}
    groups: dict[str, list[GpuKey]] = {}
    for k in tails:
        groups.setdefault(f"{res[k]['model']} {res[k]['dtype']}", []).append(k)
        j.gpus[k].setdefault("matmul", {}).update(
            {"p50_ms": tails[k]["p50_ms"], "p99_ms": tails[k]["p99_ms"], "slowest": tails[k]["slowest"]}
        )
    for keys in groups.values():
        for k in keys:
            t = tails[k]
            peers = [tails[p]["p99_ms"] for p in keys if p != k]
            peer_p99 = statistics.median(peers) if peers else None
            own_spread = t["p99_ms"] > th.tail_factor * t["p50_ms"]
            stands_out = own_spread and (peer_p99 is None or t["p99_ms"] > th.tail_factor * peer_p99)
            compared = f"peers' p99 {peer_p99:.3f} ms" if peer_p99 is not None else "no same-model peer"
            slowest = ", ".join(f"{s['ms']:.2f} ms at {s['at_seconds']:.1f} s" for s in t["slowest"][:3])
            j.add(
                "matmul",
                k,
                "tail",
                not stands_out,
                f"GEMM p99 {t['p99_ms']:.3f} ms vs its p50 {t['p50_ms']:.3f} ms ({compared}; limit "
                f"{th.tail_factor:g}x) over {t['iterations']} GEMMs; slowest {slowest}"
                + ((": stalls its peers do not" if peers else ": stalls") if stands_out else ""),
                t["p99_ms"] / 1e3,
                "seconds",
                th.tail_factor * (peer_p99 if peer_p99 is not None else t["p50_ms"]) / 1e3,
            )
