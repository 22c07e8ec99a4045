"""Basic-auth password checks: the ``Authorization`` header, bcrypt off the event loop, recent verdicts.

``BcryptPool`` runs the checks on a few threads, so that a flood of wrong passwords does not
delay a client that knows the right one; ``AuthCache`` remembers recent verdicts (keyed by an
HMAC, never the password); ``DECOY_HASH`` is checked for unknown users so timing does not tell
which user names exist. ``gpumon.http.webconfig_watcher`` puts them together.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field


class AuthCache:
    """Recent bcrypt verdicts keyed by an HMAC of the credentials (never the password); bounded, with expiry."""

    def __init__(self, good_seconds: float, bad_seconds: float, max_entries: int, clock: Callable[[], float]) -> None:
        self._good = good_seconds
        self._bad = bad_seconds
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[bool, float]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: bytes) -> bool | None:
        with self._lock:
            hit = self._entries.get(key)
            if hit is None or hit[1] < self._clock():
                return None
            return hit[0]

    def put(self, key: bytes, ok: bool) -> None:
        with self._lock:
            self._entries[key] = (ok, self._clock() + (self._good if ok else self._bad))
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)


DECOY_HASH = b"$2b$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"
"""Checked for unknown users, so timing does not reveal which user names exist."""


@dataclass(order=True)
class _BcryptJob:
    priority: int
    """0: a client with no recent failed login; 1: a suspect."""
    seq: int
    client: str = field(compare=False)
    password: bytes = field(compare=False, repr=False)
    hashed: bytes = field(compare=False, repr=False)
    future: Future[bool | None] = field(compare=False, repr=False)


class BcryptPool:
    """bcrypt checks on a few threads, so that a correct password never queues behind a flood of wrong ones.

    A client (an IP address) whose password was wrong in the last ``suspect_seconds``
    is a suspect: its checks wait until no other client's check is waiting. Every client
    has at most ``max_pending_per_client`` checks queued; more are refused at once (the
    future gives None: answer 429). So 50 attackers from one address leave a new client
    waiting for at most the checks already running and two more. Threads start on demand
    and end after ``idle_seconds`` without work.

    ``check(..., retried=True)`` (credentials refused before, asked again) may take one more
    place than the limit: a client behind the same address as a password-guesser (one NAT, one
    proxy) gets its check at its second try instead of 429 for as long as the guessing lasts.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        suspect_seconds: float = 300.0,
        max_pending_per_client: int = 2,
        max_queued: int = 256,
        idle_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._workers = workers
        self._suspect_seconds = suspect_seconds
        self._max_pending_per_client = max_pending_per_client
        self._max_queued = max_queued
        self._idle_seconds = idle_seconds
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: list[_BcryptJob] = []
        self._seq = 0
        self._running = 0
        self._idle = 0
        self._pending: dict[str, int] = {}
        self._suspects: OrderedDict[str, float] = OrderedDict()
        """client -> suspect until (clock seconds); bounded."""

    def mark_failed(self, client: str) -> None:
        with self._cond:
            self._suspects[client] = self._clock() + self._suspect_seconds
            self._suspects.move_to_end(client)
            while len(self._suspects) > 65536:
                self._suspects.popitem(last=False)

    def _suspect_until(self, client: str) -> float:
        return self._suspects.get(client, 0.0)

    def check(self, password: bytes, hashed: bytes, client: str, *, retried: bool = False) -> Future[bool | None]:
        """A future for ``bcrypt.checkpw(password, hashed)`` (False for an over-long password),
        or None at once when ``client`` has too many checks queued already (one more place when
        ``retried``: these credentials were refused that way before)."""
        future: Future[bool | None] = Future()
        with self._cond:
            suspect = self._suspect_until(client) > self._clock()
            pending = self._pending.get(client, 0)
            limit = self._max_pending_per_client + (1 if retried else 0)
            if len(self._queue) >= self._max_queued or pending >= limit:
                future.set_result(None)
                return future
            self._pending[client] = pending + 1
            self._seq += 1
            heapq.heappush(self._queue, _BcryptJob(1 if suspect else 0, self._seq, client, password, hashed, future))
            if self._idle == 0 and self._running < self._workers:
                self._running += 1
                threading.Thread(target=self._work, name="gpumon-bcrypt", daemon=True).start()
            else:
                self._cond.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                if not self._queue:
                    self._cond.wait(self._idle_seconds)
                self._idle -= 1
                if not self._queue:
                    self._running -= 1
                    return
                job = heapq.heappop(self._queue)
                left = self._pending.get(job.client, 1) - 1
                if left:
                    self._pending[job.client] = left
                else:
                    self._pending.pop(job.client, None)
            import bcrypt  # here, not with the module: a daemon without basic auth never loads it

            try:
                ok = bcrypt.checkpw(job.password, job.hashed)
            except ValueError:  # longer than bcrypt's 72 bytes, or a malformed hash
                ok = False
            job.future.set_result(ok)


def parse_basic(authorization: str | None) -> tuple[str, bytes] | None:
    """(user, password) from an ``Authorization: Basic ...`` value; None when it is not one."""
    if not authorization:
        return None
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    return user.decode("utf-8", "replace"), password
