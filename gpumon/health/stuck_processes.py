"""Stuck processes: a process that holds a GPU and has been in uninterruptible sleep (D state) too long.

A process in D state waits inside the kernel and cannot be killed, not even with SIGKILL; one that holds a
GPU there for minutes usually waits on the driver (a hung GPU, a stuck DMA), and the GPU cannot be reset
while it is held: freeing it takes a reboot. GPUd escalates such processes (leptonai/gpud#1299). gpumon
reads each GPU process's state every poll (``ProcessSnapshot.state``, /proc/PID/stat) and, once one has
been in D state in every poll for ``stuck_process_seconds`` (``health.stuck_process_seconds``, 300 s), gives
a ``stuck_process`` finding naming the process and the GPU: WARNING (a slow network file system also puts
processes in D state for a while; a person judges), with ``reboot_node`` as what frees the GPU.

Pure: fed snapshots, asked for findings at a time the caller gives.
"""

from __future__ import annotations

from gpumon.model.findings import WARNING, Finding
from gpumon.model.snapshot import Snapshot

STUCK_PROCESS_SECONDS = 300.0

_Key = tuple[int, int]
"""(GPU index, pid)."""


class StuckProcesses:
    """Since when each process on each GPU has been in D state without a break (while the polls saw it)."""

    def __init__(self, stuck_seconds: float = STUCK_PROCESS_SECONDS) -> None:
        self.stuck_seconds = stuck_seconds
        self._since: dict[_Key, float] = {}
        self._names: dict[_Key, tuple[str | None, str | None, str | None]] = {}
        """(process name, user, GPU uuid) of each process in D state, for the finding's words."""

    def observe(self, snapshot: Snapshot) -> None:
        now = snapshot.timestamp_seconds
        in_d: set[_Key] = set()
        for gpu in snapshot.gpus:
            for process in gpu.processes or ():
                if process.state == "D":
                    key = (gpu.index, process.pid)
                    in_d.add(key)
                    self._since.setdefault(key, now)
                    self._names[key] = (process.name, process.user, gpu.uuid)
        for key in set(self._since) - in_d:  # left D state, or the GPU, or exited: the count starts again
            del self._since[key]
            self._names.pop(key, None)

    def findings(self, now_seconds: float) -> list[Finding]:
        out = []
        for (gpu, pid), since in sorted(self._since.items()):
            held = now_seconds - since
            if held < self.stuck_seconds:
                continue
            name, user, uuid = self._names.get((gpu, pid), (None, None, None))
            who = f"process {pid}" + (f" ({name}" + (f", user {user})" if user else ")") if name else "")
            out.append(
                Finding(
                    kind="stuck_process",
                    severity=WARNING,
                    action="reboot_node",
                    summary=f"{who} in uninterruptible sleep (D) for {held / 60:.0f} min holding it; "
                    "it cannot be killed",
                    gpu=gpu,
                    uuid=uuid,
                    evidence={"pid": pid, "name": name, "user": user, "d_state_seconds": round(held, 1)},
                )
            )
        return out
