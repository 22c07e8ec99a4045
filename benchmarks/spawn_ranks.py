"""One bare multi-GPU loop per rank, in processes of their own: what the burn benchmarks compare gpumon with.

``spawn_ranks(fn, world)`` starts ``fn(rank, world, port, out)`` on ``world`` ranks (torch.multiprocessing,
a free TCP port for the rendezvous) and returns the JSON list rank 0 wrote to ``out``.
"""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def spawn_ranks(fn: Callable[[int, int, int, str], None], world: int) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = str(Path(d) / "ranks.json")
        mp.spawn(fn, args=(world, port, out), nprocs=world, join=True)
        return list(json.loads(Path(out).read_text()))
