"""``--backend replay:FILE``: the real NVML backend, answered from a recording of a real host.

``ReplayNvml`` stands where the ``pynvml`` module stands, so ``NvmlBackend``'s own readers run on
it, unit conversions and error policy included: a reader that turns milliwatts into kilowatts
gives kilowatts here as on a real GPU. Each question (a function and its arguments, as
``recording.call_key`` names it) gets the recorded answers in their order; after the last one the
last answer stands (the GPUs keep the state they had at the end of the recording), except the
event set's wait, which then times out after its timeout, as an idle GPU's does. A question the
recording never saw (a newer gpumon asking something new) answers NOT_SUPPORTED and is counted in
``ReplayNvml.unanswered``, so the field is left out rather than made up.

The GPUs are another host's: the backend is ``simulated`` (the host's kernel log, /sys and /proc are
not theirs; their health state is kept apart from the node's), and it never touches NVML.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gpumon.backends.nvml import NvmlBackend
from gpumon.backends.nvml.codes import NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT
from gpumon.backends.recording import Recording, call_key, decode, load

_EXCEPTIONS: dict[str, type[Exception]] = {
    "ArgumentError": ctypes.ArgumentError,
    "TypeError": TypeError,
    "ValueError": ValueError,
    "AttributeError": AttributeError,
    "KeyError": KeyError,
    "IndexError": IndexError,
}
"""Exceptions a recorded call may raise again by name; any other is raised as RuntimeError."""
GPM_METRICS_MAX = 210


@dataclass(frozen=True)
class ReplayHandle:
    """A device handle of the replay: the GPU's index."""

    index: int


class ReplayNvmlError(Exception):
    """NVMLError of the replay: ``value`` is NVML's return code, as the binding's."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value} (replayed)")
        self.value = value


class GpmMetricsRequest:
    """``c_nvmlGpmMetricsGet_t`` of the replay: the fields GpmSampler fills in and reads."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(GPM_METRICS_MAX)]


class ReplayNvml:
    """A stand-in for the ``pynvml`` module that answers from ``recording``."""

    NVMLError = ReplayNvmlError
    c_nvmlGpmMetricsGet_t = GpmMetricsRequest

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self._lock = threading.Lock()
        self._cursor: dict[str, tuple[int, int]] = {}
        self._handles: dict[int, ReplayHandle] = {}
        self._wake = threading.Event()
        self.unanswered: set[str] = set()
        """Questions the recording has no answer for (answered NOT_SUPPORTED)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in self.recording.attributes:
            raise AttributeError(f"the recorded binding has no {name}", name=name, obj=self)
        what = self.recording.attributes[name]
        if what == "function":
            fn = self._replayer(name)
            self.__dict__[name] = fn
            return fn
        if what is None or what == "object":
            raise AttributeError(f"the recorded binding has no {name}", name=name, obj=self)
        return what

    def handle(self, index: int) -> ReplayHandle:
        """The handle of GPU ``index`` (one object per GPU, as NVML's)."""
        with self._lock:
            return self._handles.setdefault(index, ReplayHandle(index))

    def gpu_of(self, value: Any) -> int | None:
        """The GPU index of a replay handle or a GPM sample taken on one."""
        if isinstance(value, ReplayHandle):
            return value.index
        gpu = getattr(value, "gpu", None)
        return gpu if isinstance(gpu, int) else None

    def answer(self, key: str) -> Any:
        """The next recorded answer to ``key`` (the last one again once they are used up), or None when
        the recording has no such question (``unanswered``) or no answer left to an event wait."""
        runs = self.recording.calls.get(key)
        with self._lock:
            if runs is None:
                self.unanswered.add(key)
                return None
            run, used = self._cursor.get(key, (0, 0))
            if run >= len(runs):
                return None if key.startswith("nvmlEventSetWait") else runs[-1][1]
            answer = runs[run][1]
            self._cursor[key] = (run, used + 1) if used + 1 < runs[run][0] else (run + 1, 0)
            return answer

    def _replayer(self, name: str) -> Callable[..., Any]:
        special = _SPECIAL.get(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if special is not None:
                return special(self, args, kwargs)
            return self._play(name, args, kwargs)

        call.__name__ = name
        return call

    def _play(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        key = call_key(name, args, kwargs, self.gpu_of)
        answer = self.answer(key)
        if answer is None and key in self.unanswered:
            raise ReplayNvmlError(NVML_ERROR_NOT_SUPPORTED)
        return self.result(answer, args)

    def result(self, answer: Any, args: tuple[Any, ...] = ()) -> Any:
        """A recorded answer played: raised when it was an error, structures passed by reference filled in."""
        if isinstance(answer, dict):
            if "error" in answer:
                raise ReplayNvmlError(int(answer["error"]))
            if "raise" in answer:
                raise _EXCEPTIONS.get(str(answer["raise"]), RuntimeError)(str(answer.get("message", "")))
            if "return" in answer:
                targets = [a._obj for a in args if hasattr(a, "_obj")]
                for target, out in zip(targets, answer.get("out") or (), strict=False):
                    _fill(target, out)
                return decode(answer["return"], self.handle)
        return decode(answer, self.handle)

    def wake(self) -> None:
        """End every event wait in progress (shutdown)."""
        self._wake.set()


def _fill(target: Any, encoded: Any) -> None:
    """Set a ctypes structure passed by reference to the recorded one's fields."""
    if not (isinstance(encoded, dict) and isinstance(encoded.get("struct"), dict)):
        return
    for name, value in encoded["struct"].items():
        if not hasattr(target, name):
            continue
        if isinstance(value, list):
            array = getattr(target, name)
            for i, item in enumerate(value[: len(array)]):
                array[i] = item
        elif isinstance(value, int | float):
            setattr(target, name, value)


def _event_wait(nv: ReplayNvml, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """nvmlEventSetWait_v2: a recorded event, or a timeout that really waits (an idle GPU's answer)."""
    answer = nv.answer(call_key("nvmlEventSetWait_v2", args, kwargs, nv.gpu_of))
    if answer is None or answer == {"error": NVML_ERROR_TIMEOUT}:
        timeout_ms = int(args[1]) if len(args) > 1 else int(kwargs.get("timeout", 0))
        if timeout_ms > 0:
            nv._wake.wait(timeout_ms / 1000.0)
        raise ReplayNvmlError(NVML_ERROR_TIMEOUT)
    return nv.result(answer)


def _shutdown(nv: ReplayNvml, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    nv.wake()
    return None


def _init(nv: ReplayNvml, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    nv._wake.clear()
    return nv.result(nv.answer("nvmlInit()"))


def _sample_alloc(nv: ReplayNvml, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return SimpleNamespace(gpu=None)


def _sample_get(nv: ReplayNvml, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    handle, sample = args[0], args[1]
    nv.result(nv.answer(call_key("nvmlGpmSampleGet", args, kwargs, nv.gpu_of)))
    sample.gpu = nv.gpu_of(handle)
    return sample


def _metrics_get(nv: ReplayNvml, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    request = args[0]
    key = call_key("nvmlGpmMetricsGet", args, kwargs, nv.gpu_of)
    answer = nv.answer(key)
    if answer is None:
        raise ReplayNvmlError(NVML_ERROR_NOT_SUPPORTED)
    nv.result({k: v for k, v in answer.items() if k != "out"} if isinstance(answer, dict) else answer)
    for i, (metric_id, code, value) in enumerate(answer.get("out") or ()):
        metric = request.metrics[i]
        metric.metricId, metric.nvmlReturn, metric.value = metric_id, code, decode(value, nv.handle)
    return request


def _nothing(nv: ReplayNvml, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return None


_SPECIAL: dict[str, Callable[[ReplayNvml, tuple[Any, ...], dict[str, Any]], Any]] = {
    "nvmlInit": _init,
    "nvmlShutdown": _shutdown,
    "nvmlEventSetWait_v2": _event_wait,
    "nvmlEventSetFree": _nothing,
    "nvmlGpmSampleAlloc": _sample_alloc,
    "nvmlGpmSampleFree": _nothing,
    "nvmlGpmSampleGet": _sample_get,
    "nvmlGpmMetricsGet": _metrics_get,
}
"""Calls played by hand: tokens the caller passes back (GPM samples), structures filled in, real waits."""


class ReplayBackend(NvmlBackend):
    """NvmlBackend over a recording: the real readers, another host's answers (``simulated``)."""

    name = "replay"
    simulated = True

    def __init__(self, nv: ReplayNvml, *, spaced: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(nv, spaced=spaced, clock=clock)
        self.replay = nv

    def shutdown(self) -> None:
        self.replay.wake()
        super().shutdown()


def replay_backend(
    path: str | Path, *, spaced: bool = False, clock: Callable[[], float] = time.monotonic
) -> ReplayBackend:
    """The backend of ``--backend replay:PATH`` (a recording, or a ``gpumon bundle`` archive). Raises
    RecordingError (a ScenarioError) naming every problem of the file. ``clock``: seconds, for the
    rates the readers work out (PCIe throughput) and the spaced readers (tests freeze it)."""
    return ReplayBackend(ReplayNvml(load(path)), spaced=spaced, clock=clock)
