"""The few Slurm commands gpumon runs (``sinfo --json``, ``scontrol show node -o``, ``scontrol update``), each
bounded by ``health.slurm.timeout_seconds``; their failures are SlurmError."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from gpumon.health.config import SlurmConfig
from gpumon.health.slurm_nodes import ControllerSilent, NodeState, SlurmError, parse_nodes, parse_sinfo_json

log = logging.getLogger("gpumon.slurm")

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class Scontrol:
    """The few Slurm calls gpumon makes; each one bounded by ``timeout_seconds``."""

    def __init__(
        self, config: SlurmConfig, run: Runner = subprocess.run, seconds_left: Callable[[], float] | None = None
    ) -> None:
        """``seconds_left``: the budget left for every call together (the prolog's), in seconds, each time it
        is called; a call gets at most that long, and none is started once it is spent."""
        self.config = config
        self._run = run
        self._seconds_left = seconds_left

    def _call(self, binary: str, args: Sequence[str]) -> str:
        cmd = [binary, *args]
        tool = Path(binary).name
        timeout = self.config.timeout_seconds
        if self._seconds_left is not None:
            left = self._seconds_left()
            if left <= 0:
                raise _NoAnswer(f"{tool} not run: the prolog's time (prolog_timeout_seconds) is spent")
            timeout = min(timeout, left)
        try:
            done = self._run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except FileNotFoundError as exc:
            raise _Missing(f"{binary} not found") from exc
        except subprocess.TimeoutExpired as exc:
            if timeout < self.config.timeout_seconds:
                budget = "left of the prolog's time (prolog_timeout_seconds)"
                raise _NoAnswer(f"{tool} did not answer within the {timeout:.1f} s {budget}") from exc
            raise _NoAnswer(f"{tool} did not answer within {timeout:g} s") from exc
        except OSError as exc:
            raise SlurmError(f"cannot run {tool}: {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout or "").strip().splitlines()
            raise SlurmError(f"{tool} {' '.join(args[:2])} failed: {detail[-1] if detail else done.returncode}")
        return str(done.stdout)

    def nodes(self) -> list[NodeState]:
        """Every node: ``sinfo --json``, else (no sinfo, or one without JSON) ``scontrol show node -o``.
        A sinfo that does not answer in time is not retried with scontrol: the controller is slow."""
        try:
            return parse_sinfo_json(self._call(self.config.sinfo, ["--json"]))
        except _Missing:
            pass
        except (_NoAnswer, ControllerSilent):
            raise
        except SlurmError as exc:
            log.debug("sinfo --json: %s; reading scontrol show node -o", exc)
        return parse_nodes(self._call(self.config.scontrol, ["show", "node", "-o"]))

    def drain(self, node: str, reason: str) -> None:
        self._call(self.config.scontrol, ["update", f"nodename={node}", "state=drain", f"reason={reason}"])

    def resume(self, node: str) -> None:
        """Take gpumon's drain off (``state=undrain``: a node that went DOWN meanwhile stays DOWN)."""
        self._call(self.config.scontrol, ["update", f"nodename={node}", "state=undrain"])


class _Missing(SlurmError):
    pass


class _NoAnswer(SlurmError):
    pass
