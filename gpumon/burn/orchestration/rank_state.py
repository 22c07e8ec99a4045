"""What an agent knows of each local worker, and why a run was stopped."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RankState:
    """The agent's view of one local worker."""

    rank: int
    gpu: int
    node: int
    test: str = "start"
    collective: str | None = "spawn"
    last_progress: float = field(default_factory=time.monotonic)
    ready: bool = False
    done: bool = False
    exit_code: int | None = None
    model: str | None = None
    startup_seconds: dict[str, float] = field(default_factory=dict)
    """How long the worker took to import torch, open its device and join the process group."""
    metrics: dict[str, float] = field(default_factory=dict)
    rates: dict[str, list[float]] = field(default_factory=dict)
    """TFLOP/s of every round reported so far, by test: kept when the run is stopped before the result."""
    died_at: float | None = None
    results: dict[str, Any] = field(default_factory=dict)
    errors: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Abort:
    kind: str
    """hang | dead | lost (another node's agent went silent) | cannot_run | interrupted"""
    message: str
    ranks: tuple[int, ...] = ()
    agents: tuple[int, ...] = ()
    """For ``lost``: the agents that went silent (the merge does not wait for them)."""

    def to_jsonable(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "ranks": list(self.ranks), "agents": list(self.agents)}
