"""Every threshold ``gpumon burn`` judges by; each one is copied into the JSON report.

Floors are per GPU model (matched on the product name NVML/torch report). Figures for
H100/H200 come from docs/DESIGN.md §3 (2×H200 SXM, driver 580): bf16 GEMM 747–797 TFLOP/s
burst and ~656 sustained at the 700 W cap, tf32 ~400, fp32 ~51; HBM device copy ~4.3 TB/s;
P2P copy over NVLink ~392 GB/s; NCCL all-reduce busbw 302/329/349 GB/s at 256 MiB/1 GiB/4 GiB.
A floor sits well below those figures so that only a GPU that is clearly broken or throttled
fails it; peers catch the subtler stragglers. Other models' floors are conservative
estimates, not measurements; a model not in the table is judged against its peers only.

``GPUMON_BURN_FLOORS`` overrides floors for every model, e.g.
``matmul_tflops=300,memory_gbps=2000,p2p_gbps=100,allreduce_busbw_gbps=150``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FLOORS_ENV_VAR = "GPUMON_BURN_FLOORS"
FLOOR_KEYS = ("matmul_tflops", "memory_gbps", "p2p_gbps", "allreduce_busbw_gbps", "pcie_gbps")

GB = 1e9

# model substring (first match wins, most specific first) -> floors
_MODEL_FLOORS: tuple[tuple[str, Mapping[str, Any]], ...] = (
    (
        "H100 PCIe",
        {
            "matmul_tflops": {"bf16": 350.0, "fp16": 350.0, "tf32": 180.0, "fp32": 30.0, "fp64": 30.0},
            "memory_gbps": 1500.0,
            "p2p_gbps": {"nvlink": 200.0, "pcie": 15.0},
            "allreduce_busbw_gbps": 100.0,
            "pcie_gbps": 40.0,
        },
    ),
    (
        "H200",
        {
            "matmul_tflops": {"bf16": 600.0, "fp16": 600.0, "tf32": 300.0, "fp32": 40.0, "fp64": 40.0},
            "memory_gbps": 3500.0,
            "p2p_gbps": {"nvlink": 300.0, "pcie": 15.0},
            "allreduce_busbw_gbps": 240.0,
            "pcie_gbps": 40.0,
        },
    ),
    (
        "H100",
        {
            "matmul_tflops": {"bf16": 550.0, "fp16": 550.0, "tf32": 280.0, "fp32": 40.0, "fp64": 40.0},
            "memory_gbps": 2500.0,
            "p2p_gbps": {"nvlink": 300.0, "pcie": 15.0},
            "allreduce_busbw_gbps": 240.0,
            "pcie_gbps": 40.0,
        },
    ),
    (
        "A100",
        {
            "matmul_tflops": {"bf16": 220.0, "fp16": 220.0, "tf32": 110.0, "fp32": 15.0, "fp64": 15.0},
            "memory_gbps": 1300.0,
            "p2p_gbps": {"nvlink": 150.0, "pcie": 15.0},
            "allreduce_busbw_gbps": 120.0,
            "pcie_gbps": 20.0,
        },
    ),
)

PCIE_LANE_GBPS: Mapping[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
"""Usable GB/s per lane and direction of each PCIe generation (after line coding)."""
PCIE_ALLREDUCE_FRACTION = 0.3
"""All-reduce busbw floor between GPUs that reach each other only over PCIe: this share of the
slowest GPU's link rate (generation and width at their max). An estimate, not a measurement:
NCCL over PCIe usually reaches well over half the link rate, so only a broken, downtrained or
contended path falls below it (PCIe gen4 x16: 9.5 GB/s, gen5 x16: 18.9 GB/s)."""


@dataclass(frozen=True)
class GroupLink:
    """The slowest kind of path between the GPUs of a one-node all-reduce, from NVML's topology."""

    kind: str
    """nvlink (every pair over NVLink) | pcie (some pair only over PCIe) | unknown"""
    pcie_generation: int | None = None
    """Lowest max PCIe generation of the GPUs (pcie.link.gen.max), for kind pcie."""
    pcie_width: int | None = None
    """Lowest max PCIe width of the GPUs (pcie.link.width.max), for kind pcie."""

    def describe(self) -> str:
        if self.kind == "pcie":
            gen = f"gen{self.pcie_generation}" if self.pcie_generation else "gen ?"
            width = f"x{self.pcie_width}" if self.pcie_width else "x?"
            return f"PCIe {gen} {width}"
        return {"nvlink": "NVLink"}.get(self.kind, "links of unknown type")


def group_link(
    topology: Mapping[str, Mapping[str, str]], pcie: Mapping[str, Mapping[str, Any]], gpus: list[int]
) -> GroupLink:
    """The path type of an all-reduce over ``gpus`` of one node.

    ``topology``: GPU -> peer -> NVML level ("nvlink", or a PCIe level); ``pcie``: GPU ->
    {"generation_max", "width_max"}.
    """
    levels = [topology.get(str(a), {}).get(str(b)) for a in gpus for b in gpus if a != b]
    if not levels or any(level is None for level in levels):
        return GroupLink("unknown")
    if all(level == "nvlink" for level in levels):
        return GroupLink("nvlink")
    gens = [x for g in gpus if isinstance(x := pcie.get(str(g), {}).get("generation_max"), int)]
    widths = [x for g in gpus if isinstance(x := pcie.get(str(g), {}).get("width_max"), int)]
    return GroupLink(
        "pcie",
        min(gens) if len(gens) == len(gpus) else None,
        min(widths) if len(widths) == len(gpus) else None,
    )


# Largest relative error allowed between the GPU's small product and a float64 CPU
# reference on the same (already rounded) inputs: max|C - C_ref| / max|C_ref|.
REFERENCE_REL_TOLERANCE: Mapping[str, float] = {
    "bf16": 2e-2,
    "fp16": 4e-3,
    "tf32": 4e-3,
    "fp32": 1e-5,
    "fp64": 1e-12,
}


@dataclass(frozen=True)
class Thresholds:
    """What a result is judged against."""

    straggler_fraction: float = 0.10
    """A GPU more than this share below the median of its same-model peers is a straggler."""
    link_fraction: float = 0.20
    """A link (p2p pair or all-reduce pair) more than this share below the median of its path type is slow."""
    tail_factor: float = 2.0
    """A GPU whose per-op p99 exceeds this many times its own p50 and its peers' p99 stalls (verdict.judge_tails)."""
    reference_rel_tolerance: Mapping[str, float] = field(default_factory=lambda: dict(REFERENCE_REL_TOLERANCE))
    floor_overrides: Mapping[str, float] = field(default_factory=dict)
    """GPUMON_BURN_FLOORS values, applied to every model."""

    def model_floors(self, model: str) -> Mapping[str, Any]:
        for needle, floors in _MODEL_FLOORS:
            if needle.lower() in model.lower():
                return floors
        return {}

    def matmul_floor_tflops(self, model: str, dtype: str) -> float | None:
        if "matmul_tflops" in self.floor_overrides:
            return self.floor_overrides["matmul_tflops"]
        table = self.model_floors(model).get("matmul_tflops", {})
        value = table.get(dtype)
        return float(value) if value is not None else None

    def memory_floor_bytes_per_second(self, model: str) -> float | None:
        if "memory_gbps" in self.floor_overrides:
            return self.floor_overrides["memory_gbps"] * GB
        value = self.model_floors(model).get("memory_gbps")
        return float(value) * GB if value is not None else None

    def p2p_floor_bytes_per_second(self, model: str, path: str) -> float | None:
        if "p2p_gbps" in self.floor_overrides:
            return self.floor_overrides["p2p_gbps"] * GB
        table = self.model_floors(model).get("p2p_gbps", {})
        value = table.get("nvlink" if path == "nvlink" else "pcie")
        return float(value) * GB if value is not None else None

    def pcie_floor_bytes_per_second(self, model: str) -> float | None:
        """Pinned host<->device copy, each direction, one GPU alone (docs/burn.md gives the sources)."""
        if "pcie_gbps" in self.floor_overrides:
            return self.floor_overrides["pcie_gbps"] * GB
        value = self.model_floors(model).get("pcie_gbps")
        return float(value) * GB if value is not None else None

    def allreduce_floor_bytes_per_second(
        self, model: str, single_node: bool, link: GroupLink | None = None
    ) -> float | None:
        """Floor of busbw at the largest size of the sweep (>= 256 MiB on CUDA; smaller sizes are reported only).

        By the path between the GPUs:

        NVLink (or unknown): the model's figure. PCIe only: PCIE_ALLREDUCE_FRACTION of the slowest
        GPU's PCIe link rate, whatever the model (None when its generation or width is unknown).
        None across nodes (the network decides). GPUMON_BURN_FLOORS overrides all of these.
        """
        if "allreduce_busbw_gbps" in self.floor_overrides:
            return self.floor_overrides["allreduce_busbw_gbps"] * GB
        if not single_node:
            return None
        if link is not None and link.kind == "pcie":
            lane = PCIE_LANE_GBPS.get(link.pcie_generation or 0)
            if lane is None or not link.pcie_width:
                return None
            return PCIE_ALLREDUCE_FRACTION * lane * link.pcie_width * GB
        value = self.model_floors(model).get("allreduce_busbw_gbps")
        return float(value) * GB if value is not None else None

    def to_jsonable(self, models: list[str], dtype: str) -> dict[str, Any]:
        """Every threshold that applied to this run, for the report."""
        return {
            "straggler_fraction": self.straggler_fraction,
            "link_fraction": self.link_fraction,
            "tail_factor": self.tail_factor,
            "reference_rel_tolerance": dict(self.reference_rel_tolerance),
            "floor_overrides": dict(self.floor_overrides),
            "allreduce_pcie_fraction": PCIE_ALLREDUCE_FRACTION,
            "pcie_lane_gbps": {str(k): v for k, v in PCIE_LANE_GBPS.items()},
            "floors": {
                m: {
                    "matmul_tflops": self.matmul_floor_tflops(m, dtype),
                    "memory_bytes_per_second": self.memory_floor_bytes_per_second(m),
                    "p2p_nvlink_bytes_per_second": self.p2p_floor_bytes_per_second(m, "nvlink"),
                    "p2p_pcie_bytes_per_second": self.p2p_floor_bytes_per_second(m, "pcie"),
                    "allreduce_busbw_nvlink_bytes_per_second": self.allreduce_floor_bytes_per_second(m, True),
                    "pcie_bytes_per_second": self.pcie_floor_bytes_per_second(m),
                }
                for m in sorted(set(models))
            },
        }


def for_device(device: str, floors_env: str | None) -> tuple[Thresholds, list[str]]:
    """Thresholds for ``cuda`` or ``cpu``. CPU timings are noisy, so the peer margins are wider: simulated
    GPUs share the host's cores, caches and memory bandwidth with whatever else runs there (a loaded test
    host measured one rank's copies 61 % below the other's in a healthy run); a quarter of the median
    still names a GPU slowed ten times (``slow:G``)."""
    overrides, problems = parse_floors(floors_env)
    if device == "cpu":
        cpu = Thresholds(straggler_fraction=0.75, link_fraction=0.5, tail_factor=4.0, floor_overrides=overrides)
        return cpu, problems
    return Thresholds(floor_overrides=overrides), problems


def parse_floors(text: str | None) -> tuple[dict[str, float], list[str]]:
    """``matmul_tflops=300,allreduce_busbw_gbps=150`` -> dict; problems listed."""
    out: dict[str, float] = {}
    problems: list[str] = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in FLOOR_KEYS:
            problems.append(f"{FLOORS_ENV_VAR}: unknown floor {key!r} (one of {', '.join(FLOOR_KEYS)})")
            continue
        try:
            out[key] = float(value)
        except ValueError:
            problems.append(f"{FLOORS_ENV_VAR}: {key} needs a number, got {value!r}")
    return out, problems
