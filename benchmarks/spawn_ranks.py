"""One bare multi-GPU loop per rank, in processes of their own: what the burn benchmarks compare gpumon with.

``spawn_ranks(fn, world)`` starts ``fn(rank, world, port, out)`` on ``world`` ranks (torch.multiprocessing,
a free TCP port for the rendezvous) and returns the JSON list rank 0 wrote to ``out``; ``fn`` joins the
NCCL group with ``join_nccl(rank, world, port)``.
"""

from __future__ import annotations

import datetime
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


def join_nccl(rank: int, world: int, port: int) -> tuple[Any, Any]:
    """In a rank's process: its GPU selected, the NCCL group joined over ``port``; (torch, torch.distributed)."""
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
        device_id=torch.device("cuda", rank),
    )
    return torch, dist
