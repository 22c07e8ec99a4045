"""The ``sw`` test: checks that need no load, from one full backend read of each GPU.

Each check gives a severity: ``fault`` fails the GPU (exit 1), ``warn`` is shown but
passes, ``busy`` refuses to run unless ``--force`` (exit 3), ``cannot_run`` stops (exit 3).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.model.snapshot import HostSnapshot


@dataclass(frozen=True)
class SwCheck:
    """One software/health check of one GPU (``gpu`` None: the host)."""

    name: str
    gpu: int | None
    severity: str
    """ok | warn | fault | busy | cannot_run | skipped"""
    detail: str

    @property
    def passed(self) -> bool:
        return self.severity in ("ok", "warn", "skipped")

    def to_jsonable(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gpu": self.gpu,
            "severity": self.severity,
            "passed": self.passed,
            "detail": self.detail,
        }


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(int(p) for p in text.split(".")[:2])
    except ValueError:
        return None


def check_host(host: HostSnapshot, torch_cuda_version: str | None, device: str) -> list[SwCheck]:
    """Driver present and its CUDA version at least torch's CUDA runtime."""
    if device == "cpu":
        return [SwCheck("cuda_versions", None, "skipped", "device cpu: no CUDA runtime to compare")]
    driver = _version_tuple(host.cuda_driver_version)
    runtime = _version_tuple(torch_cuda_version)
    if runtime is None:
        return [SwCheck("cuda_versions", None, "cannot_run", "this torch has no CUDA runtime (CPU-only build)")]
    if driver is None:
        return [SwCheck("cuda_versions", None, "warn", f"driver CUDA version unknown; torch CUDA {torch_cuda_version}")]
    if runtime > driver:
        return [
            SwCheck(
                "cuda_versions",
                None,
                "cannot_run",
                f"torch's CUDA runtime {torch_cuda_version} is newer than the driver's CUDA "
                f"{host.cuda_driver_version} (driver {host.driver_version}): update the driver or torch",
            )
        ]
    return [
        SwCheck(
            "cuda_versions",
            None,
            "ok",
            f"driver {host.driver_version} CUDA {host.cuda_driver_version} >= torch CUDA {torch_cuda_version}",
        )
    ]


_Add = Callable[[str, str, str], None]
"""Records one check of the GPU being checked: (name, severity, detail)."""


def check_gpu(gpu: int, values: Mapping[str, Any], own_pids: Sequence[int] = ()) -> list[SwCheck]:
    """The no-load checks of one GPU from its STATIC+SLOW+FAST fields."""
    out: list[SwCheck] = []

    def add(name: str, severity: str, detail: str) -> None:
        out.append(SwCheck(name, gpu, severity, detail))

    _check_settings(values, add)
    _check_memory_errors(values, add)
    _check_links(values, add)
    _check_usable(values, add)
    _check_processes(values, add, own_pids)
    return out


def _check_settings(values: Mapping[str, Any], add: _Add) -> None:
    """Persistence mode and ECC mode: on is expected, off is a warning."""
    persistence = values.get("persistence_mode_enabled")
    if persistence is False:
        add("persistence_mode", "warn", "persistence mode is off (slow start-up, clocks may reset between jobs)")
    elif persistence:
        add("persistence_mode", "ok", "on")

    ecc = values.get("ecc_mode_enabled")
    if ecc is False:
        add("ecc_mode", "warn", "ECC is disabled: memory errors go undetected")
    elif ecc:
        add("ecc_mode", "ok", "enabled")


def _check_memory_errors(values: Mapping[str, Any], add: _Add) -> None:
    """Uncorrectable ECC errors, row remaps and page retirements: pending or failed ones are faults."""
    ecc_errors = values.get("ecc_errors_total") or {}
    uncorrected = ecc_errors.get("uncorrected_volatile")
    if uncorrected:
        add("ecc_uncorrected", "fault", f"{uncorrected} uncorrectable ECC errors since the last reset")
    elif uncorrected is not None:
        add("ecc_uncorrected", "ok", "0 uncorrectable ECC errors since the last reset")

    if values.get("row_remap_failure"):
        add("row_remap_failure", "fault", "a row remap failed: the GPU needs RMA diagnostics")
    if values.get("row_remap_pending"):
        add("row_remap_pending", "fault", "a row remap is pending: reset the GPU before use")
    elif values.get("row_remap_pending") is False and not values.get("row_remap_failure"):
        add("row_remap", "ok", "no pending or failed row remaps")

    if values.get("retired_pages_pending"):
        add("retired_pages_pending", "fault", "a page retirement is pending: reboot before use")
    retired = values.get("retired_pages") or {}
    if retired.get("double_bit"):
        add("retired_pages", "warn", f"{retired['double_bit']} pages retired for double-bit errors")


def _check_links(values: Mapping[str, Any], add: _Add) -> None:
    """NVLinks down and a PCIe link below its max width are faults; a lower PCIe generation at idle is not."""
    nvlink = values.get("nvlink_up") or {}
    down = sorted((k for k, up in nvlink.items() if not up), key=lambda k: int(k) if k.isdigit() else 0)
    if nvlink and down and len(down) < len(nvlink):
        add("nvlink_up", "fault", f"NVLink {', '.join(down)} down of {len(nvlink)} links")
    elif nvlink and not down:
        add("nvlink_up", "ok", f"all {len(nvlink)} NVLinks up")

    width, width_max = values.get("pcie_link_width"), values.get("pcie_link_width_max")
    if width is not None and width_max is not None:
        if width < width_max:
            add("pcie_link_width", "fault", f"PCIe link x{width}, below its max x{width_max}")
        else:
            add("pcie_link_width", "ok", f"PCIe x{width}")
    gen, gen_max = values.get("pcie_link_generation"), values.get("pcie_link_generation_max")
    if gen is not None and gen_max is not None and gen < gen_max:
        add("pcie_link_generation_idle", "ok", f"PCIe gen {gen} of {gen_max} at idle (re-checked under load)")


def _check_usable(values: Mapping[str, Any], add: _Add) -> None:
    """MIG mode, or an NVSwitch fabric not yet registered, mean the burn cannot run."""
    if values.get("mig_mode_enabled"):
        add("mig_mode", "cannot_run", "MIG mode is on: the burn needs whole GPUs")

    fabric = values.get("fabric_state")  # only on GPUs in an NVSwitch fabric
    if fabric is not None and fabric != "completed":
        state = fabric.replace("_", " ")
        add("fabric", "cannot_run", f"NVSwitch fabric registration {state}: CUDA waits for nvidia-fabricmanager")
    elif fabric is not None and values.get("fabric_status_ok") is False:
        add("fabric", "fault", "NVSwitch fabric registration failed (nvidia-smi -q: Fabric Status)")
    elif fabric is not None:
        add("fabric", "ok", "registered with the NVSwitch fabric")


def _check_processes(values: Mapping[str, Any], add: _Add, own_pids: Sequence[int]) -> None:
    """Other compute processes on the GPU (not ``own_pids``) make it busy."""
    procs = [p for p in (values.get("processes") or ()) if getattr(p, "pid", None) not in own_pids]
    if procs:
        names = ", ".join(f"{p.pid} ({p.name or '?'})" for p in procs[:5])
        add("processes", "busy", f"{len(procs)} other compute process(es) on the GPU: {names}")
    else:
        add("processes", "ok", "no other compute processes")
