"""The fleet-wide SDC fingerprint: every GPU's digests against the majority of its model, software and dtype.

GPUs are compared only where the bits must agree: the same model (and SM count) running the same
torch, CUDA and cuBLAS (``software``). A GPU whose digest differs from the majority of its group is
named, whichever node it is on; two GPUs that disagree with no majority are both named (one of
them is wrong); a GPU with no peer in the run is not judged here, and its digests, exported with
the burn's metrics, are compared with other runs' by the fleet's Prometheus. GPUs of the same
model on other software are listed in the check, not compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpumon.burn.verdict.judgement import GpuKey, Judgement


def judge_fingerprint(j: Judgement, res: Mapping[GpuKey, Any]) -> None:
    """One check per GPU and dtype: its digest against its group's majority; one fault per GPU named."""
    groups: dict[tuple[str, str, str], list[GpuKey]] = {}
    for key, d in res.items():
        j.gpus[key]["fingerprint"] = {"software": d["software"], "digests": dict(d["digests"])}
        for dtype in d["digests"]:
            groups.setdefault((d["model"], d["software"], dtype), []).append(key)
    outvoted: dict[GpuKey, list[str]] = {}
    """GPU -> the dtypes where it differs from its group's majority."""
    no_majority: dict[tuple[GpuKey, ...], list[str]] = {}
    for (model, sw, dtype), keys in groups.items():
        digests = {k: res[k]["digests"][dtype] for k in keys}
        counts = Counter(digests.values())
        top, top_count = counts.most_common(1)[0]
        majority = top if top_count * 2 > len(keys) else None
        bad = [k for k in keys if digests[k] != majority] if majority is not None or len(keys) == 1 else list(keys)
        if len(keys) == 1:
            bad = []
        for k in keys:
            _check(j, k, dtype, digests[k], model, keys, majority, counts, bad, _other_software(res, model, sw))
        for k in bad if majority is not None else ():
            outvoted.setdefault(k, []).append(dtype)
        if bad and majority is None:
            no_majority.setdefault(tuple(bad), []).append(dtype)
    for k, dtypes in outvoted.items():
        peers = len(groups[(res[k]["model"], res[k]["software"], dtypes[0])]) - 1
        j.faults.append(
            f"{_where(j, k)}: fingerprint: {', '.join(dtypes)} results differ from the majority of the {peers} other "
            f"{res[k]['model']} GPUs given identical inputs: silent data corruption (a wrong answer every time)"
        )
    for keys_bad, dtypes in no_majority.items():
        j.faults.append(
            f"{', '.join(_where(j, k) for k in keys_bad)}: fingerprint: {', '.join(dtypes)} results differ with no "
            "majority given identical inputs: one of them computes wrong (a third GPU of the model tells which)"
        )


def _where(j: Judgement, key: GpuKey) -> str:
    uuid = j.gpus.get(key, {}).get("uuid")
    return j.name(key) + (f" ({uuid})" if uuid else "")


def _check(
    j: Judgement,
    key: GpuKey,
    dtype: str,
    digest: str,
    model: str,
    keys: list[GpuKey],
    majority: str | None,
    counts: Counter[str],
    bad: list[GpuKey],
    others: str,
) -> None:
    if len(keys) == 1:
        detail, passed = f"{dtype} digest {digest}: no other {model} GPU with the same software to compare", None
    elif key in bad and majority is not None:
        detail = f"{dtype} digest {digest} differs from the {counts[majority]} other {model} GPUs' {majority}"
        passed = False
    elif key in bad:
        detail, passed = f"{dtype} digest {digest}: {len(counts)} different digests among {len(keys)} GPUs", False
    else:
        detail, passed = f"{dtype} digest {digest} identical to {counts[digest] - 1} other {model} GPUs", True
    j.add("fingerprint", key, f"digest_{dtype}", passed, detail + others, fault="")


def _other_software(res: Mapping[GpuKey, Any], model: str, sw: str) -> str:
    """ " (not compared with N GPUs on other software: ...)" where the same model runs other software."""
    other = sorted({d["software"] for d in res.values() if d["model"] == model and d["software"] != sw})
    if not other:
        return ""
    n = sum(1 for d in res.values() if d["model"] == model and d["software"] != sw)
    return f" (not compared with {n} {model} GPUs on {'; '.join(other)}: other kernels may round differently)"
