"""Fixtures for tests that need a real NVIDIA GPU (marked ``gpu``, deselected by default)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from gpumon.backends.base import NvmlUnavailableError
from gpumon.backends.nvml import NvmlBackend


def smi(*args: str) -> str:
    """nvidia-smi's output; skips the test on a host without it."""
    path = shutil.which("nvidia-smi")
    if path is None:
        pytest.skip("nvidia-smi not found: not a GPU host")
    done = subprocess.run([path, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"nvidia-smi {' '.join(args)} failed: {done.stdout}{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    """The real NVML backend, initialised once per module."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi not found: not a GPU host")
    b = NvmlBackend.from_system()
    try:
        b.init()
    except NvmlUnavailableError as exc:
        pytest.skip(f"NVML unavailable on this host: {exc}")
    yield b
    b.shutdown()
