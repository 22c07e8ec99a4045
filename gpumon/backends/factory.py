"""Turn a backend spec (``nvml``, ``fake``, ``fake:NAME``, ``fake:PATH``, ``replay:FILE``) into a GpuBackend."""

from __future__ import annotations

from pathlib import Path

from gpumon.backends.base import GpuBackend


def simulated_spec(spec: str) -> str | None:
    """The spec itself for simulated GPUs (``fake``, ``fake:NAME``, ``fake:PATH``) and a replayed host's
    (``replay:FILE``), whose health state is kept apart from the node's (``gpumon.util.state.files.health_dir``'s
    ``apart``); None for real ones."""
    return spec if spec.startswith(("fake", "replay:")) else None


def make_backend(spec: str, fake_gpus: int = 2, *, daemon: bool = False) -> GpuBackend:
    """Build the backend a user asked for. The fake one is only ever used when named.

    ``daemon``: for ``gpumon run``, which reads all day: NVML's costliest calls (NVLink error
    counters, energy, GPM, violations, P2P, topology) are made at most every
    ``ReaderSpec.every_seconds`` (docs/nvml-notes.md); the other commands read them fresh every time.

    ``fake:NAME`` plays a named scenario shipped with gpumon (``gpumon scenarios`` lists them);
    anything else after ``fake:`` is a scenario file. ``replay:FILE`` answers the NVML backend's
    calls from a recording (``gpumon record``) or a bug-report bundle (``gpumon bundle``). Raises
    gpumon.backends.fake.ScenarioError for a bad scenario or recording file or a name that is neither.
    """
    if spec == "fake":
        from gpumon.backends.fake import FakeBackend

        return FakeBackend.plausible(fake_gpus)
    if spec.startswith("fake:"):
        from gpumon.backends import scenarios
        from gpumon.backends.base import ScenarioError
        from gpumon.backends.fake import FakeBackend

        target = spec[len("fake:") :]
        named = scenarios.path_of(target)
        if named is not None:
            return FakeBackend.from_file(named)
        if not Path(target).exists() and "/" not in target and not target.endswith((".yaml", ".yml")):
            raise ScenarioError(
                [
                    f"{target!r} is neither a scenario file nor a named scenario "
                    f"({', '.join(scenarios.names())}; gpumon scenarios describes them)"
                ]
            )
        return FakeBackend.from_file(target)
    if spec.startswith("replay:") and len(spec) > len("replay:"):
        from gpumon.backends.replay import replay_backend

        return replay_backend(spec[len("replay:") :], spaced=daemon)
    if spec == "nvml":
        from gpumon.backends.nvml import NvmlBackend

        return NvmlBackend.from_system(spaced=daemon)
    raise ValueError(f"unknown backend {spec!r} (nvml, fake, fake:NAME, fake:PATH, replay:FILE)")
