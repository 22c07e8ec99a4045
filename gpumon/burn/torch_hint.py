"""What to install when torch is missing: the PyTorch build for this host's CUDA, not the default.

A torch from PyPI (what the ``burn`` extra on its own brings) is PyPI's
default build, a multi-GB CUDA one that may not match the driver. PyTorch publishes one package
index per CUDA version (https://download.pytorch.org/whl/cuXYZ) and a CPU-only one (.../whl/cpu);
https://pytorch.org/get-started/locally/ lists the current ones. The driver's CUDA version (what
``nvidia-smi`` and ``gpumon once`` show) is the newest CUDA build it can run.
"""

from __future__ import annotations

INDEX = "https://download.pytorch.org/whl"
BUILDS_PAGE = "https://pytorch.org/get-started/locally/"


def torch_install_hint(device: str, cuda_driver_version: str | None) -> str:
    """One line saying what to install for ``--device`` ``device`` on a driver supporting CUDA
    ``cuda_driver_version`` (e.g. ``"13.0"``; None when unknown)."""
    if device == "cpu":
        return f"torch is not installed: pip install 'torch==2.*' --index-url {INDEX}/cpu (the CPU build, about 200 MB)"
    driver = f"this driver runs CUDA {cuda_driver_version} or older" if cuda_driver_version else "see nvidia-smi"
    return (
        f"torch is not installed: pip install 'torch==2.*' --index-url {INDEX}/cuXYZ (XYZ: a CUDA build the "
        f"driver can run, {driver}; {BUILDS_PAGE} lists the builds)"
    )
