"""``RecordingNvml``: the pynvml module as the NVML backend sees it, writing down every answer.

It stands where ``pynvml`` stands (``NvmlBackend(RecordingNvml(pynvml, recording))``), so the calls
recorded are exactly those gpumon's readers make, in their order, with their arguments. Each call
goes to the real binding; its answer (value, NVMLError code, or another exception) is added to the
``Recording`` (gpumon.backends.recording) and handed back (or raised) unchanged. Attribute look-ups
are recorded too (a constant's value, a function, or a name the binding lacks), so the replay
answers ``getattr(nv, NAME, None)`` as this binding did.

``redact``: serial numbers, UUIDs and process ids are replaced as they are recorded (see
gpumon.backends.redact); NVML gives no process names, so a recording holds none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpumon.backends.nvml.events import handle_key
from gpumon.backends.recording import Recording, call_key, encode
from gpumon.backends.redact import Redactor

OPAQUE_MAKERS = frozenset({"nvmlEventSetCreate", "nvmlGpmSampleAlloc"})
"""Functions that return a token the caller only passes back (an event set, a GPM sample)."""


class RecordingNvml:
    """The binding ``nv`` with every call and look-up written into ``recording`` (thread-safe: the
    event thread calls too)."""

    def __init__(self, nv: Any, recording: Recording, *, redact: bool = False) -> None:
        self._nv = nv
        self._recording = recording
        self._lock = threading.Lock()
        self._gpus: dict[Any, int] = {}
        """handle_key of a device handle or GPM sample -> GPU index."""
        self._redactor = Redactor() if redact else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            value = getattr(self._nv, name)
        except AttributeError:
            self._note(name, None)
            raise AttributeError(f"the binding has no {name}", name=name, obj=self) from None
        if callable(value) and name.startswith("nvml"):
            self._note(name, "function")
            wrapper = self._wrap(name, value)
            self.__dict__[name] = wrapper  # looked up once
            return wrapper
        self._note(name, value if isinstance(value, bool | int | float | str) else "object")
        return value

    def gpu_of(self, value: Any) -> int | None:
        """The GPU index of a device handle or GPM sample this binding handed out, else None."""
        try:
            return self._gpus.get(handle_key(value))
        except TypeError:
            return None

    def _note(self, name: str, what: Any) -> None:
        with self._lock:
            self._recording.attributes.setdefault(name, what)

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            key = call_key(name, args, kwargs, self.gpu_of)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                self._add(key, _failure(exc))
                raise
            self._learn(name, args, result)
            self._add(key, self._answer(name, args, result))
            return result

        call.__name__ = name
        return call

    def _learn(self, name: str, args: tuple[Any, ...], result: Any) -> None:
        """Remember which GPU a handle (or a GPM sample) is, for keys and answers."""
        if name == "nvmlDeviceGetHandleByIndex":
            with self._lock:
                self._gpus[handle_key(result)] = int(args[0])
        elif name == "nvmlGpmSampleGet" and len(args) > 1:
            gpu = self.gpu_of(args[0])
            if gpu is not None:
                with self._lock:
                    self._gpus[handle_key(args[1])] = gpu

    def _answer(self, name: str, args: tuple[Any, ...], result: Any) -> Any:
        if name in OPAQUE_MAKERS:
            return {"opaque": name}
        if name == "nvmlGpmMetricsGet":
            request = args[0]
            metrics = [request.metrics[i] for i in range(int(request.numMetrics))]
            out = [[int(m.metricId), int(m.nvmlReturn), encode(float(m.value), self.gpu_of)] for m in metrics]
            return {"return": None, "out": out}
        if name == "nvmlDeviceGetHandleByIndex":
            return {"gpu": int(args[0])}
        answer = encode(result, self.gpu_of)
        outs = [encode(a._obj, self.gpu_of) for a in args if hasattr(a, "_obj")]  # ctypes.byref(struct)
        if self._redactor is not None:
            gpu = self.gpu_of(args[0]) if args else None
            answer = self._redactor.answer(name, gpu, answer)
            outs = [self._redactor.answer(name, gpu, o) for o in outs]
        return {"return": answer, "out": outs} if outs else answer

    def _add(self, key: str, answer: Any) -> None:
        with self._lock:
            self._recording.add(key, answer)


def _failure(exc: Exception) -> dict[str, Any]:
    """A failed call as recorded: NVML's return code, or the exception's class and message."""
    code = getattr(exc, "value", None)
    if isinstance(code, int) and not isinstance(code, bool):
        return {"error": code}
    return {"raise": type(exc).__name__, "message": str(exc)[:200]}
