"""Turn a backend spec (``nvml``, ``fake``, ``fake:PATH``) into a GpuBackend."""

from __future__ import annotations

from gpumon.backends.base import GpuBackend


def make_backend(spec: str, fake_gpus: int = 2) -> GpuBackend:
    """Build the backend a user asked for. The fake one is only ever used when named.

    Raises gpumon.backends.fake.ScenarioError for a bad scenario file.
    """
    if spec == "fake":
        from gpumon.backends.fake import FakeBackend

        return FakeBackend.plausible(fake_gpus)
    if spec.startswith("fake:"):
        from gpumon.backends.fake import FakeBackend

        return FakeBackend.from_file(spec[len("fake:") :])
    if spec == "nvml":
        from gpumon.backends.nvml import NvmlBackend

        return NvmlBackend.from_system()
    raise ValueError(f"unknown backend {spec!r} (nvml, fake, fake:PATH)")
