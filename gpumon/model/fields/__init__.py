"""Every per-GPU field declared once, by subsystem (identity, usage, thermal, power, clocks, fans,
pcie, ecc, modes, nvlink, topology, processes, gpm, events); the NVML readers of gpumon/backends/nvml/ use
the same names; ``gpumon.model.snapshot.GpuSnapshot`` joins them.

How a field is declared: gpumon/model/fields/spec.py. Adding one: docs/architecture.md, "Adding a field".
"""
