"""What ``gpumon record --redact`` replaces in NVML's answers before they are written down.

* serial numbers (nvidia-smi serial): ``REDACTED-<gpu>``;
* UUIDs (nvidia-smi uuid): ``GPU-00000000-0000-4000-8000-<gpu, 12 hex digits>``, a valid UUID that names
  the GPU by index, the same in every call;
* process ids (nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetProcessUtilization): numbered 100001,
  100002, ... in order of appearance, the same pid mapped the same way in every call;
* the NVSwitch fabric's cluster UUID: zeros.

NVML answers no process names (those come from /proc at poll time), so a recording holds none.
Everything else (models, bus ids, VBIOS, driver version, values) is kept: it is what a bug report needs.
"""

from __future__ import annotations

from typing import Any

REDACTED_UUID = "GPU-00000000-0000-4000-8000-{:012x}"
FIRST_PID = 100001
_PROCESS_LISTS = frozenset(
    {
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetGraphicsRunningProcesses",
        "nvmlDeviceGetProcessUtilization",
    }
)


class Redactor:
    """Replaces identifying values in encoded answers (gpumon.backends.recording.encode's JSON)."""

    def __init__(self) -> None:
        self._pids: dict[int, int] = {}

    def answer(self, name: str, gpu: int | None, answer: Any) -> Any:
        """``answer`` of ``name`` on GPU ``gpu`` with its identifying values replaced."""
        if name == "nvmlDeviceGetSerial" and isinstance(answer, str):
            return f"REDACTED-{gpu}"
        if name == "nvmlDeviceGetUUID" and isinstance(answer, str):
            return REDACTED_UUID.format(gpu if gpu is not None else 0)
        if name in _PROCESS_LISTS and isinstance(answer, list):
            return [self._process(item) for item in answer]
        if name == "nvmlDeviceGetGpuFabricInfo" and isinstance(answer, dict) and "struct" in answer:
            fields = dict(answer["struct"])
            if isinstance(fields.get("clusterUuid"), list):
                fields["clusterUuid"] = [0] * len(fields["clusterUuid"])
            return {"struct": fields}
        return answer

    def pid(self, pid: int) -> int:
        """The stand-in of process id ``pid`` (the same every time)."""
        if pid not in self._pids:
            self._pids[pid] = FIRST_PID + len(self._pids)
        return self._pids[pid]

    def _process(self, item: Any) -> Any:
        if not (isinstance(item, dict) and isinstance(item.get("struct"), dict)):
            return item
        fields = dict(item["struct"])
        if isinstance(fields.get("pid"), int):
            fields["pid"] = self.pid(fields["pid"])
        return {"struct": fields}
