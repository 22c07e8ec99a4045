"""Following the kernel log for XIDs for as long as gpumon runs.

One stream from start to stop, so nothing falls between "read at start" and "watched
live": the records already in the log (since boot) are handed over as one backfill, every
record written afterwards as it comes, within ``poll_seconds``. While NVML's event API is
unavailable (not supported by the GPU, or NVML down), this is what counts XIDs; where both
see an XID, ``XidTracker`` counts it once.

Sources, in order:

* ``/dev/kmsg``: the kernel ring buffer (root, or anyone with ``kernel.dmesg_restrict=0``).
  Backfilled records are stamped with boot time + their kernel time; records read live are
  stamped with the time they were read (the kernel's clock drifts from the wall clock over a
  long uptime, and a live record is read within ``poll_seconds``). Either way each event also
  carries the kernel's own time of the record (``XidEvent.kernel_usec``), which names it the same
  on every read, so a restart that reads it again does not count it again. Record sequence numbers
  guard against reading a record twice after the file is reopened.
* ``journalctl -k -b -f --no-tail -o json`` (groups ``systemd-journal`` / ``adm``), stamped
  with the journal's own receive time; restarted after the last cursor if it ends.

Which source is followed, or why none can be, is said in one log line. ``stop`` ends the
thread within ``poll_seconds`` (and terminates journalctl).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gpumon.events.kernel_log import (
    DEFAULT_KMSG_PATH,
    KMSG_RECORD_RE,
    KernelLogResult,
    os_error_reason,
    parse_journal_json_line,
    parse_xid_message,
    to_event,
)
from gpumon.model.xid import XidEvent

log = logging.getLogger(__name__)

DEFAULT_JOURNAL_FOLLOW_COMMAND: tuple[str, ...] = (
    "journalctl",
    "-k",
    "-b",
    "-f",
    "--no-tail",
    "-o",
    "json",
    "--no-pager",
)
_READ_SIZE = 64 * 1024
_MAX_PARTIAL_LINE = 1024 * 1024
_JOURNAL_RESTART_SECONDS = 30.0
_JOURNAL_QUIET_SECONDS = 2.0
"""A journalctl that printed nothing for this long has no backfill to give."""


class KernelLogFollower:
    """A thread that reads the kernel log from boot on and keeps reading it until ``stop``."""

    def __init__(
        self,
        on_backfill: Callable[[list[XidEvent]], object],
        on_event: Callable[[XidEvent], object],
        *,
        kmsg_path: Path = DEFAULT_KMSG_PATH,
        journal_command: Sequence[str] | None = DEFAULT_JOURNAL_FOLLOW_COMMAND,
        boot_time: Callable[[], float] | None = None,
        clock: Callable[[], float] = time.time,
        poll_seconds: float = 0.25,
        logger: logging.Logger | None = None,
    ) -> None:
        """``on_backfill(events)``: XIDs already in the log at start (once); ``on_event(event)``: each later one."""
        self._on_backfill = on_backfill
        self._on_event = on_event
        self._kmsg_path = kmsg_path
        self._journal_command = list(journal_command) if journal_command else None
        self._boot_time = boot_time
        self._clock = clock
        self._poll = poll_seconds
        self._log = logger or log
        self._stop = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="gpumon-kmsg", daemon=True)
        self.source: str | None = None
        """What is being followed (``/dev/kmsg`` or ``journalctl``), None before start or when nothing can be."""
        self.events_total = 0
        """XIDs handed over so far (backfill and live): gpumon_kernel_log_xids_total."""
        self._wake_r, self._wake_w = os.pipe()
        """Written once by request_stop: the thread's select() waits on it beside the log, so it
        sleeps until a record comes or it is stopped (no timer wakes it)."""

    def start(self) -> None:
        self._thread.start()

    def request_stop(self) -> None:
        """Ask the thread to end without waiting; journalctl is terminated."""
        if not self._stop.is_set():
            self._stop.set()
            if self._wake_w >= 0:
                with contextlib.suppress(OSError):
                    os.write(self._wake_w, b"x")
        with self._proc_lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()

    def stop(self, timeout: float = 1.0) -> None:
        """End the thread and wait for it, at most ``timeout`` seconds."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._thread.is_alive() and self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    # ---- the thread ----------------------------------------------------------
    def _run(self) -> None:
        try:
            problem = self._follow_kmsg()
            if problem is None or self._stop.is_set():
                return
            if self._journal_command is None:
                self._unreadable(problem)
                return
            journal_problem = self._follow_journal(problem)
            if journal_problem is not None:
                self._unreadable(f"{problem}; {journal_problem}")
        except Exception:  # a bug must not go unnoticed, nor take the daemon down
            self._log.exception("following the kernel log failed; XIDs are counted from NVML events only")

    def _unreadable(self, problem: str) -> None:
        summary = KernelLogResult(events=[], source=None, problem=problem).summary()
        self._log.warning("%s; while NVML events are unavailable, XIDs are not seen", summary)

    def _hand_over(self, event: XidEvent) -> None:
        self.events_total += 1
        try:
            self._on_event(event)
        except Exception:
            self._log.exception("handling XID %d from the kernel log failed", event.xid)

    def _backfill(self, events: list[XidEvent], source: str, note: str | None = None) -> None:
        self.source = source
        self.events_total += len(events)
        summary = KernelLogResult(events=events, source=source, problem=note).summary()
        self._log.info("%s; following it for new XIDs", summary)
        try:
            self._on_backfill(events)
        except Exception:
            self._log.exception("handling the kernel log backfill failed")

    # ---- /dev/kmsg -------------------------------------------------------------
    def _follow_kmsg(self) -> str | None:
        """Follow ``kmsg_path`` until stopped; the reason it cannot be read (None once it was)."""
        try:
            fd = os.open(self._kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            return f"{self._kmsg_path}: {os_error_reason(exc)}"
        boot = self._boot()
        reader = _KmsgReader(boot)
        try:
            backfill: list[XidEvent] = []
            while not self._stop.is_set():  # drain what is there: the backfill
                try:
                    data = _read(fd)
                except OSError as exc:  # opened but not readable: let the journal try
                    return f"{self._kmsg_path}: {os_error_reason(exc)}"
                if not data:
                    break
                backfill += reader.feed(data, None)
            self._backfill(backfill, str(self._kmsg_path))
            while not self._stop.is_set():
                try:
                    ready, _, _ = select.select([fd, self._wake_r], [], [])
                except (OSError, ValueError):
                    ready = []
                    self._stop.wait(self._poll)
                if fd not in ready:
                    continue
                try:
                    data = _read(fd)
                except OSError as exc:
                    self._log.warning("reading %s failed (%s); reopening it", self._kmsg_path, os_error_reason(exc))
                    os.close(fd)
                    fd = -1
                    self._stop.wait(1.0)
                    fd = os.open(self._kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
                    reader.reopened()  # records already read are skipped by sequence number
                    continue
                if not data:  # end of a regular file or of a FIFO without a writer: wait for more
                    self._stop.wait(self._poll)
                    continue
                for event in reader.feed(data, self._clock()):
                    self._hand_over(event)
        except OSError as exc:
            self._log.warning("kernel log %s cannot be read any more: %s", self._kmsg_path, os_error_reason(exc))
        finally:
            if fd >= 0:
                os.close(fd)
        return None

    def _boot(self) -> float:
        if self._boot_time is not None:
            return self._boot_time()
        import psutil

        return float(psutil.boot_time())

    # ---- journalctl ----------------------------------------------------------------
    def _follow_journal(self, kmsg_problem: str) -> str | None:
        """Follow journalctl until stopped; the reason it cannot be read (None once it was)."""
        assert self._journal_command is not None
        cursor: str | None = None
        first = True
        while not self._stop.is_set():
            command = list(self._journal_command)
            if cursor is not None:  # after it ended: go on from the last entry seen, none twice
                command.append(f"--after-cursor={cursor}")
            try:
                proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            except FileNotFoundError:
                return f"{command[0]}: not installed"
            except OSError as exc:
                return f"{command[0]}: {os_error_reason(exc)}"
            with self._proc_lock:
                self._proc = proc
            try:
                cursor, got_any, problem = self._read_journal(proc, cursor, first, kmsg_problem)
            finally:
                if proc.poll() is None:
                    proc.terminate()
                try:
                    proc.wait(1.0)
                except subprocess.TimeoutExpired:
                    proc.kill()
            if first and not got_any and problem is not None:
                return problem
            first = False
            if not self._stop.is_set():
                self._log.warning("journalctl ended (%s); following it again", problem or "no reason given")
                self._stop.wait(_JOURNAL_RESTART_SECONDS)
        return None

    def _journal_name(self) -> str:
        return self._journal_command[0] if self._journal_command else "journalctl"

    def _read_journal(
        self, proc: subprocess.Popen[bytes], cursor: str | None, first: bool, kmsg_problem: str
    ) -> tuple[str | None, bool, str | None]:
        """Read journal lines until the process ends or we stop: (last cursor, any line seen, why it ended).

        The entries journalctl prints before its first pause are the backfill (on the first run)."""
        assert proc.stdout is not None and proc.stderr is not None
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        fds = [out_fd, err_fd]
        backfill: list[XidEvent] = []
        backfilling = first
        got_any = False
        pending = errors = b""
        started = time.monotonic()
        try:
            while not self._stop.is_set():
                # while backfilling, a pause of journalctl's ends the backfill; afterwards it prints
                # as entries come and ends (EOF) when request_stop terminates it
                ready, _, _ = select.select(fds, [], [], self._poll if backfilling else None)
                if not ready:
                    # journalctl printed what it had and waits (or printed nothing for a while): backfill done
                    if backfilling and (got_any or time.monotonic() - started > _JOURNAL_QUIET_SECONDS):
                        backfilling = False
                        self._backfill(backfill, "journalctl", kmsg_problem)
                    continue
                if err_fd in ready:
                    chunk = os.read(err_fd, 4096)
                    if not chunk:
                        fds.remove(err_fd)
                    errors = (errors + chunk)[-4096:]
                    if b"not seeing messages" in errors.lower() and not got_any:
                        return cursor, False, f"{self._journal_name()}: no permission"
                if out_fd not in ready:
                    continue
                chunk = os.read(out_fd, _READ_SIZE)
                if not chunk:
                    text = errors.decode("utf-8", errors="replace").strip()
                    return cursor, got_any, (text.splitlines()[0] if text else f"exit status {proc.wait()}")
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()[-_MAX_PARTIAL_LINE:]
                for raw in lines:
                    line = raw.decode("utf-8", errors="replace")
                    if not line.strip():
                        continue
                    got_any = True
                    cursor = _cursor(line) or cursor
                    event = parse_journal_json_line(line)
                    if event is None:
                        continue
                    if backfilling:
                        backfill.append(event)
                    else:
                        self._hand_over(event)
            return cursor, got_any, None
        finally:
            if backfilling and got_any:
                self._backfill(backfill, "journalctl", kmsg_problem)


class _KmsgReader:
    """Splits kmsg data into records, skips records already seen (by sequence number), parses XIDs."""

    def __init__(self, boot_time_seconds: float) -> None:
        self._boot = boot_time_seconds
        self._partial = b""
        self._last_seq = -1

    def reopened(self) -> None:
        """The file was opened again: a partial record is void; the sequence numbers still hold."""
        self._partial = b""

    def feed(self, data: bytes, read_at: float | None) -> list[XidEvent]:
        """XIDs in ``data``; stamped ``read_at`` when given (live), else boot time + kernel time."""
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > _MAX_PARTIAL_LINE:
            self._partial = b""
        events = []
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if not line or line.startswith(" "):  # continuation lines (" SUBSYSTEM=pci") carry no message
                continue
            m = KMSG_RECORD_RE.match(line)
            if m is None:
                continue
            seq = int(m.group("seq"))
            if seq <= self._last_seq:
                continue  # already read before a reopen
            self._last_seq = seq
            parsed = parse_xid_message(m.group("msg"))
            if parsed is None:
                continue
            usec = int(m.group("usec"))
            stamp = read_at if read_at is not None else self._boot + usec / 1e6
            events.append(to_event(parsed, stamp, usec, seq))
        return events


def _read(fd: int) -> bytes:
    """One read; b"" when nothing is there now (EAGAIN) or at the end. Raises OSError on real errors."""
    while True:
        try:
            return os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return b""
        except BrokenPipeError:
            continue  # EPIPE: records were overwritten while we read; go on with the next
        except InterruptedError:
            continue
        except OSError as exc:
            if exc.errno == errno.EINTR:
                continue
            raise


def _cursor(line: str) -> str | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    value = entry.get("__CURSOR") if isinstance(entry, dict) else None
    return value if isinstance(value, str) else None
