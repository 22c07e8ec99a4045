"""Where the workers start from: a fork server that imports torch once, while the agent starts up."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import forkserver
from typing import Any

from gpumon.burn.orchestration.interrupts import signals_deferred
from gpumon.burn.orchestration.protocol import NO_MULTICAST_ENV

TORCH_NUMPY_WARNING = "ignore:Failed to initialize NumPy:UserWarning"
"""The warning filter (PYTHONWARNINGS syntax) for torch's import-time warning when NumPy is missing."""


def start_worker_server() -> Any:
    """The multiprocessing context the workers start from, its fork server already importing torch.

    Spawned workers each imported torch themselves, all at once (3.4-5.4 s on 4 x H100); the fork
    server imports it once, while the agent does its own start-up, and forks every worker from there
    with torch loaded. The server never initialises CUDA, so each worker opens its GPU as before. It
    starts with SIGINT and SIGTERM blocked, as spawned workers did: each worker unblocks them first.
    """
    for key, value in NO_MULTICAST_ENV.items():
        os.environ[key] = value  # the server's environment is the workers'
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "gpumon.burn.orchestration.worker"])
    before = os.environ.get("PYTHONWARNINGS")
    # torch built without NumPy warns at import; the server imports it before any filter of ours runs
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [before, TORCH_NUMPY_WARNING]))
    try:
        with signals_deferred():
            forkserver.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before
    return ctx
