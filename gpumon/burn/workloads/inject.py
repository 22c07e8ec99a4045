"""Fault injection for tests: ``GPUMON_BURN_INJECT=corrupt:1,slow:1,hang:1,oom:0,sdc:1``.

Each entry is ``KIND:GPU`` where GPU is the index as given to ``--gpus``:

* ``corrupt:G`` — flip one bit of GPU G's matmul output (from the second round on)
  and of its all-reduce result, as silent data corruption would.
* ``slow:G`` — GPU G sleeps between rounds so it runs at a tenth of its peers' rate.
* ``hang:G`` — GPU G's worker stops making progress at the start of its first load test.
* ``oom:G`` — GPU G's first large allocation fails with an out-of-memory error.
* ``sdc:G`` — GPU G computes the same wrong answer every time: one bit of every GEMM output
  (fingerprint and matmul, from the first round on) and of the fingerprint's memory read-back,
  always the same bit, so its repeated GEMMs agree with each other and only a comparison
  with other GPUs can see it.
* ``stall:G`` — GPU G stalls on one GEMM in 40 (a spin of about 20 GEMM times on the GPU): its
  median is fine, its p99 is not.
* ``slow-pcie:G`` — GPU G's host-link copies take four times as long (a GPU on an x4 or Gen2 link).

Never set it outside tests: it makes a healthy machine fail on purpose.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ENV_VAR = "GPUMON_BURN_INJECT"
KINDS = ("corrupt", "slow", "hang", "oom", "sdc", "stall", "slow-pcie")


@dataclass(frozen=True)
class Injection:
    """Faults to inject, as kind -> GPU indices."""

    faults: Mapping[str, frozenset[int]] = field(default_factory=dict)

    def has(self, kind: str, gpu: int) -> bool:
        """True when fault ``kind`` is injected on GPU ``gpu``."""
        return gpu in self.faults.get(kind, frozenset())

    def describe(self) -> str:
        return ",".join(f"{k}:{g}" for k, gpus in sorted(self.faults.items()) for g in sorted(gpus))


def parse(text: str | None) -> tuple[Injection, list[str]]:
    """Parse the env var's value; returns the injection and the problems found."""
    if not text:
        return Injection(), []
    problems: list[str] = []
    faults: dict[str, set[int]] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        kind, _, gpu = item.partition(":")
        if kind not in KINDS:
            problems.append(f"{ENV_VAR}: unknown fault {kind!r} (one of {', '.join(KINDS)})")
            continue
        if not (gpu.strip().isascii() and gpu.strip().isdigit()):
            problems.append(f"{ENV_VAR}: {item!r} needs a GPU index, like {kind}:1")
            continue
        faults.setdefault(kind, set()).add(int(gpu))
    return Injection({k: frozenset(v) for k, v in faults.items()}), problems
