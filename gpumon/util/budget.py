"""A call with a time budget: run on a thread of its own, waited for until its deadline and no longer.

``Budgeted(name, work, budget_seconds)`` is called like ``work``. Each call that finds no call of
``work`` running hands one to the budget's own daemon thread and waits for it until ``budget_seconds``
have passed; a call that finds one running waits for that one (until that one's deadline) and gets its
answer. The thread is started at the first call and kept, blocked without a timeout between calls
(starting a thread a call cost the poll thread ~110 µs of CPU a poll for the energy listener alone);
a call that overran keeps it, and the next call after it returns is handed to it again. The hand-off
is a ``queue.SimpleQueue`` and each call's answer a held ``threading.Lock`` the worker releases, both
waited on in C: ``Condition`` and ``Event`` wait in Python, ~70 µs more of CPU a call after an idle
second, paid at every scrape by each budgeted source (docs/benchmarks.md, "a scrape every second").
Past the deadline the caller gets ``OverBudget`` at once, and keeps getting it while the late call
runs on (it is never started twice): whoever asked goes on without it, and the late call's answer,
when it comes, is dropped. An exception of ``work`` is raised to every caller that waited for it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class OverBudget(Exception):
    """A call that took longer than its budget (or was asked while such a call still runs)."""


@dataclass
class _Call:
    deadline: float
    """time.monotonic() seconds after which nobody waits for it."""
    done: threading.Lock = field(default_factory=threading.Lock)
    """Held until the call has run: a caller waits by acquiring it and lets the next one in at once."""
    finished: bool = False
    value: Any = None
    error: BaseException | None = None

    def __post_init__(self) -> None:
        self.done.acquire()

    def wait(self, timeout: float) -> bool:
        """Whether the call has run, waiting ``timeout`` seconds at most."""
        if not self.done.acquire(timeout=timeout):
            return False
        self.done.release()  # every other caller of the same call gets in too
        return True


class Budgeted(Generic[P, T]):
    """``work``, called on a thread of its own and waited for at most ``budget_seconds`` a call."""

    def __init__(self, name: str, work: Callable[P, T], budget_seconds: float) -> None:
        self.name = name
        self.budget_seconds = budget_seconds
        self._work = work
        self._lock = threading.Lock()
        self._call: _Call | None = None
        self._handed: queue.SimpleQueue[tuple[_Call, Any, Any]] = queue.SimpleQueue()
        """The calls for the worker (one at most: a call is made only when the last one has run)."""
        self._worker: threading.Thread | None = None
        self.overran = False
        """Whether the last caller went on without an answer (the call ran past its deadline)."""

    def __repr__(self) -> str:
        return f"Budgeted({self.name}, {self.budget_seconds:g} s)"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """``work(*args, **kwargs)``'s answer; OverBudget when it is not there by the deadline."""
        with self._lock:
            call = self._call
            if call is None or call.finished:
                call = self._call = _Call(time.monotonic() + self.budget_seconds)
                self._handed.put((call, args, kwargs))
                if self._worker is None:
                    self._worker = threading.Thread(target=self._serve, name=f"gpumon-{self.name}", daemon=True)
                    self._worker.start()
        if not call.wait(max(0.0, call.deadline - time.monotonic())):
            self.overran = True
            raise OverBudget(f"{self.name} took longer than its budget of {self.budget_seconds:g} s")
        self.overran = False
        if call.error is not None:
            raise call.error
        value: T = call.value
        return value

    def _serve(self) -> None:
        """The worker: each call handed to it, in turn, for as long as the process lives."""
        while True:
            self._run(*self._handed.get())

    def _run(self, call: _Call, args: Any, kwargs: Any) -> None:
        try:
            call.value = self._work(*args, **kwargs)
        except BaseException as exc:  # handed to the callers, who log it
            call.error = exc
        finally:
            call.finished = True
            call.done.release()
