"""The load tests by name, as ``--tests`` and the worker know them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumon.burn.workloads.allreduce import allreduce
from gpumon.burn.workloads.context import Context
from gpumon.burn.workloads.fingerprint import fingerprint
from gpumon.burn.workloads.matmul import matmul
from gpumon.burn.workloads.memory import memory
from gpumon.burn.workloads.p2p import p2p
from gpumon.burn.workloads.pcie import pcie
from gpumon.burn.workloads.pulse import pulse

TESTS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "fingerprint": fingerprint,
    "pcie": pcie,
    "matmul": matmul,
    "memory": memory,
    "p2p": p2p,
    "allreduce": allreduce,
    "pulse": pulse,
}
