"""The web config in force: re-read when its files change, and the per-request gate it sets.

``WebConfigWatcher(path)`` holds the current ``WebConfig`` and re-reads it when the file or
any certificate, key or CA file it names changes (checked at most every
``check_interval_seconds`` when a request asks). A new file with problems is logged and the
old configuration kept. ``reload()`` forces a re-read (SIGHUP). Per request it answers the
SSLContext for the next connection, the extra headers, basic auth (bcrypt in a
``BcryptPool``) and the ``rate_limit`` token bucket.

gpumon.http.server applies it: the current ``SSLContext`` to each new connection, so a
renewed certificate applies without a restart, and a plain HTTP request on a TLS port gets
``400 Client sent an HTTP request to an HTTPS server.``, like Go's servers.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from gpumon.http.basic_auth import DECOY_HASH, AuthCache, BcryptPool, parse_basic
from gpumon.http.webconfig import WebConfig, WebConfigError
from gpumon.util.file_stamp import FileStamp, file_stamp

LOGGER_NAME = __name__


Fingerprint = tuple[tuple[str, FileStamp | None], ...]
"""Each watched file with its stamp (None: absent)."""


def _fingerprint(files: tuple[Path, ...]) -> Fingerprint:
    """Each of ``files`` with its stamp (None: absent): differs once any of them was written, made or removed."""
    return tuple((str(f), file_stamp(f)) for f in files)


class WebConfigWatcher:
    """The current web config, re-read when its files change; thread-safe.

    Construction loads the file and raises WebConfigError if it is unusable (at start,
    a bad web config is a configuration error). Later, a changed file that cannot be
    used, for whatever reason, is logged once in one line and the previous
    configuration stays in force.
    """

    def __init__(
        self,
        path: str | Path,
        check_interval_seconds: float = 1.0,
        auth_cache_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
        bcrypt_pool: BcryptPool | None = None,
        reread_in_background: bool = False,
    ) -> None:
        """``reread_in_background``: a changed file is read on a thread of its own, and until it is
        read the configuration in force is answered (the server's event loop asks, and must never
        wait on a file); False reads it in the caller (tools, tests)."""
        self._path = Path(path).absolute()
        self._background = reread_in_background
        self._reading = threading.Lock()
        """Held while the files are read (never while ``_lock`` is): one re-read at a time."""
        self._rereading = False
        """A background re-read is under way."""
        self._interval = check_interval_seconds
        self._clock = clock
        self._log = logger or logging.getLogger(LOGGER_NAME)
        self._lock = threading.Lock()
        self._config = WebConfig.load(self._path)
        self._fingerprint = _fingerprint(self._config.watched_files())
        self._rejected: Fingerprint | None = None
        self._next_check = clock() + check_interval_seconds
        # Good verdicts stay for an hour (the hash in the key changes with the file); wrong ones a minute.
        self._cache = AuthCache(max(auth_cache_seconds, 3600.0), auth_cache_seconds, 4096, clock)
        self._cache_key = os.urandom(32)
        self._refused = AuthCache(300.0, 300.0, 4096, clock)
        """Credentials (by the same HMAC) whose check was refused as one too many, for 5 minutes."""
        self._bcrypt = bcrypt_pool or BcryptPool(clock=clock)
        self._tokens = float(self._config.rate_limit.burst) if self._config.rate_limit else 0.0
        self._tokens_at = clock()

    @property
    def path(self) -> Path:
        return self._path

    def current(self) -> WebConfig:
        """The configuration in force, after re-reading the files if they changed (with
        ``reread_in_background``, the one in force until the re-read on its own thread is done)."""
        with self._lock:
            now = self._clock()
            config = self._config
            if now < self._next_check:
                return config
            self._next_check = now + self._interval
            known = (self._fingerprint, self._rejected)
            if self._rereading:
                return config
        # The fingerprint covers the files the *current* config names plus the config file;
        # a new config may name other files, which then join the fingerprint.
        if _fingerprint(config.watched_files()) in known:  # a few stat calls: they never wait on a reader
            return config
        if not self._background:
            self._reload_if_changed(force=False)
            with self._lock:
                return self._config
        with self._lock:
            if self._rereading:
                return config
            self._rereading = True
        threading.Thread(target=self._reread, name="gpumon-webconfig", daemon=True).start()
        return config

    def _reread(self) -> None:
        try:
            self._reload_if_changed(force=False)
        finally:
            with self._lock:
                self._rereading = False

    def reload(self) -> bool:
        """Re-read now (SIGHUP). True when the file is valid (and now in force)."""
        return self._reload_if_changed(force=True)

    def _reload_if_changed(self, force: bool) -> bool:
        with self._reading:
            return self._reread_files(force)

    def _reread_files(self, force: bool) -> bool:
        fingerprint = _fingerprint(self._config.watched_files())
        if not force and (fingerprint == self._fingerprint or fingerprint == self._rejected):
            return True
        try:
            config = WebConfig.load(self._path)
        except Exception as exc:
            problems = exc.problems if isinstance(exc, WebConfigError) else [f"{self._path}: cannot be used: {exc!r}"]
            if force or fingerprint != self._rejected:
                self._log.error(
                    "web config %s has problems; keeping the previous one: %s",
                    self._path,
                    "; ".join(problems)[:4000],
                )
            self._rejected = fingerprint
            return False
        with self._lock:
            self._config = config
            self._fingerprint = _fingerprint(config.watched_files())
            self._rejected = None
        self._log.info("web config %s loaded (tls: %s)", self._path, "on" if config.tls else "off")
        return True

    def ssl_context(self) -> ssl.SSLContext | None:
        """The SSLContext for the next connection; None means serve plain HTTP."""
        return self.current().context

    def extra_headers(self) -> dict[str, str]:
        """Headers to add to every response (http_server_config.headers)."""
        return dict(self.current().headers)

    def authenticate(self, authorization: str | None, client: str = "") -> Future[bool | None]:
        """Whether the ``Authorization`` header value lets the request in, as a future.

        Done at once without basic_auth_users, for malformed headers and for cached
        verdicts (keyed by an HMAC of user, password and hash: never the password);
        otherwise bcrypt runs in the BcryptPool, where ``client`` (the peer address)
        decides the queue: a client that failed recently waits behind those that did not.
        None: not checked, ``client`` has too many checks waiting (answer 429).
        """
        users = self.current().basic_auth_users
        done: Future[bool | None] = Future()
        if not users:
            done.set_result(True)
            return done
        credentials = parse_basic(authorization)
        if credentials is None:
            done.set_result(False)
            return done
        import hmac  # here, like bcrypt: hmac loads OpenSSL's digests, which only basic auth needs

        user, password = credentials
        known = user in users
        hashed = users[user] if known else DECOY_HASH.decode()
        key = hmac.new(self._cache_key, b"\0".join((user.encode(), hashed.encode(), password)), "sha256").digest()
        verdict = self._cache.get(key)
        if verdict is not None:
            if not (known and verdict):
                self._bcrypt.mark_failed(client)
            done.set_result(known and verdict)
            return done
        if self._refused.get(key) is not None:  # refused as one too many before: a second try
            checked = self._bcrypt.check(password, hashed.encode(), client, retried=True)
        else:
            checked = self._bcrypt.check(password, hashed.encode(), client)

        def finish(result: Future[bool | None]) -> None:
            ok = result.result()
            if ok is None:
                self._refused.put(key, True)
                done.set_result(None)
                return
            self._cache.put(key, ok)
            if not (known and ok):
                self._bcrypt.mark_failed(client)
            done.set_result(known and ok)

        checked.add_done_callback(finish)
        return done

    def check_basic_auth(self, authorization: str | None, client: str = "") -> bool:
        """``authenticate`` waited for; False also when the check was refused as too many."""
        return self.authenticate(authorization, client).result() is True

    def allow_request(self) -> bool:
        """Token bucket of ``rate_limit``; False means answer 429. Always True without one."""
        limit = self.current().rate_limit
        if limit is None:
            return True
        with self._lock:
            now = self._clock()
            self._tokens = min(float(limit.burst), self._tokens + (now - self._tokens_at) / limit.interval_seconds)
            self._tokens_at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False
