"""A call with a time budget: run on a thread of its own, waited for until its deadline and no longer.

``Budgeted(name, work, budget_seconds)`` is called like ``work``. Each call that finds no call of
``work`` running starts one on a daemon thread and waits for it until ``budget_seconds`` have passed;
a call that finds one running waits for that one (until that one's deadline) and gets its answer.
Past the deadline the caller gets ``OverBudget`` at once, and keeps getting it while the late call
runs on (it is never started twice): whoever asked goes on without it, and the late call's answer,
when it comes, is dropped. An exception of ``work`` is raised to every caller that waited for it.
"""

from __future__ import annotations

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
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class Budgeted(Generic[P, T]):
    """``work``, called on a thread of its own and waited for at most ``budget_seconds`` a call."""

    def __init__(self, name: str, work: Callable[P, T], budget_seconds: float) -> None:
        self.name = name
        self.budget_seconds = budget_seconds
        self._work = work
        self._lock = threading.Lock()
        self._call: _Call | None = None
        self.overran = False
        """Whether the last caller went on without an answer (the call ran past its deadline)."""

    def __repr__(self) -> str:
        return f"Budgeted({self.name}, {self.budget_seconds:g} s)"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """``work(*args, **kwargs)``'s answer; OverBudget when it is not there by the deadline."""
        with self._lock:
            call = self._call
            if call is None or call.done.is_set():
                call = self._call = _Call(time.monotonic() + self.budget_seconds)
                runner = threading.Thread(
                    target=self._run, args=(call, args, kwargs), name=f"gpumon-{self.name}", daemon=True
                )
                runner.start()
        if not call.done.wait(max(0.0, call.deadline - time.monotonic())):
            self.overran = True
            raise OverBudget(f"{self.name} took longer than its budget of {self.budget_seconds:g} s")
        self.overran = False
        if call.error is not None:
            raise call.error
        value: T = call.value
        return value

    def _run(self, call: _Call, args: Any, kwargs: Any) -> None:
        try:
            call.value = self._work(*args, **kwargs)
        except BaseException as exc:  # handed to the callers, who log it
            call.error = exc
        finally:
            call.done.set()
