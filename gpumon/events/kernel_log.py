"""XIDs in the kernel log: the line parser, and a one-off read of the log since boot.

The daemon follows the log for as long as it runs (``gpumon.events.kernel_follow``);
``read_boot_xids`` reads it once (tools and tests).

The NVIDIA driver logs every XID as a kernel message, e.g.::

    NVRM: Xid (PCI:0000:06:00): 79, pid=1234, name=python, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): ...
    NVRM: Xid (0000:03:00): 14, Channel 00000001                      (older drivers)

Sources, in order: ``/dev/kmsg`` (the kernel ring buffer, read without blocking
until it is drained; readable by root, or by anyone when ``kernel.dmesg_restrict=0``),
then ``journalctl -k -b -o json`` (members of the ``adm`` / ``systemd-journal``
groups). Which one was used, or why neither could be read, is said in one log line.
The bus id is normalised to NVML's form ``00000000:06:00.0`` so that events can be
matched to a GPU's ``pci_bus_id``.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import logging
import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpumon.model.bus_id import normalize_bus_id
from gpumon.model.xid import XidEvent

log = logging.getLogger(__name__)

DEFAULT_KMSG_PATH = Path("/dev/kmsg")
DEFAULT_JOURNAL_COMMAND: tuple[str, ...] = ("journalctl", "-k", "-b", "-o", "json", "--no-pager")
_MAX_RECORDS = 1_000_000
_READ_SIZE = 64 * 1024

_XID_RE = re.compile(
    r"NVRM: Xid \((?P<bus>(?:PCI:)?(?:[0-9A-Fa-f]{1,8}:)?[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?)\): "
    r"(?P<xid>\d{1,9})(?:,\s?(?P<rest>.*))?$"
)
_PID_RE = re.compile(r"^pid=(?P<pid>'[^']*'|[^,\s]*),\s?(?P<rest>.*)$")
_NAME_RE = re.compile(r"^name=(?P<name>[^,]*),\s?(?P<rest>.*)$")
KMSG_RECORD_RE = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
"""A /dev/kmsg record: priority, sequence number, µs since boot, flags; the message."""
_DMESG_RE = re.compile(r"^\[\s*(?P<sec>\d+)\.(?P<frac>\d+)\]\s?(?P<msg>.*)$")
_ISO_RE = re.compile(
    r"^(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[+-]\d{2}:?\d{2})?)\s(?P<msg>.*)$"
)


@dataclass(frozen=True)
class ParsedXid:
    """One ``NVRM: Xid`` message."""

    xid: int
    pci_bus_id: str
    """NVML form, 00000000:BB:DD.F."""
    pid: int | None
    """The process the driver blamed, when the line names one."""
    process_name: str | None
    detail: str
    """The driver's text after the code (and pid/name)."""
    message: str
    """The whole message from ``NVRM:`` on."""


def parse_xid_message(text: str) -> ParsedXid | None:
    """The XID in one kernel message (any prefix before ``NVRM:`` is ignored); None when there is none."""
    start = text.find("NVRM: Xid (")
    if start < 0:
        return None
    message = text[start:].splitlines()[0].rstrip() if text[start:] else ""
    m = _XID_RE.match(message)
    if m is None:
        return None
    bus = normalize_bus_id(m.group("bus"))
    if bus is None:
        return None
    rest = m.group("rest") or ""
    pid: int | None = None
    name: str | None = None
    pm = _PID_RE.match(rest)
    if pm is not None:
        raw_pid = pm.group("pid").strip("'")
        pid = int(raw_pid) if raw_pid.isdigit() else None
        rest = pm.group("rest")
        nm = _NAME_RE.match(rest)
        if nm is not None:
            raw_name = nm.group("name").strip()
            name = None if raw_name in ("", "<unknown>") else raw_name
            rest = nm.group("rest")
    return ParsedXid(
        xid=int(m.group("xid")),
        pci_bus_id=bus,
        pid=pid,
        process_name=name,
        detail=rest.strip(),
        message=message,
    )


def to_event(
    parsed: ParsedXid, timestamp_seconds: float, kernel_usec: int | None = None, kernel_seq: int | None = None
) -> XidEvent:
    """``kernel_usec``: the record's kernel time (µs since boot), when the source says it."""
    return XidEvent(
        xid=parsed.xid,
        timestamp_seconds=timestamp_seconds,
        source="kernel_log",
        pci_bus_id=parsed.pci_bus_id,
        message=parsed.message,
        kernel_usec=kernel_usec,
        kernel_seq=kernel_seq,
    )


def parse_log_line(line: str, boot_time_seconds: float, now_seconds: float) -> XidEvent | None:
    """An XID event from one line of kernel log text in any common form, or None.

    Handles ``/dev/kmsg`` records (``6,1234,5678901,-;NVRM: ...``, µs since boot),
    ``dmesg`` (``[ 5.678901] NVRM: ...``, s since boot), ``journalctl -o short-iso``
    (``2024-05-01T12:34:56+0000 host kernel: NVRM: ...``) and bare messages (time
    unknown: ``now_seconds``). Never raises.
    """
    try:
        timestamp = now_seconds
        message = line
        usec: int | None = None
        seq: int | None = None
        if m := KMSG_RECORD_RE.match(line):
            usec, seq = int(m.group("usec")), int(m.group("seq"))
            timestamp = boot_time_seconds + usec / 1e6
            message = m.group("msg")
        elif m := _DMESG_RE.match(line):
            usec = int(m.group("sec")) * 1_000_000 + int((m.group("frac") + "000000")[:6])
            timestamp = boot_time_seconds + float(f"{m.group('sec')}.{m.group('frac')}")
            message = m.group("msg")
        elif m := _ISO_RE.match(line):
            parsed_ts = _parse_iso(m.group("ts"))
            if parsed_ts is not None:
                timestamp = parsed_ts
            message = m.group("msg")
        parsed = parse_xid_message(message)
        return None if parsed is None else to_event(parsed, timestamp, usec, seq)
    except (ValueError, OverflowError):
        return None


def parse_journal_json_line(line: str) -> XidEvent | None:
    """An XID event from one line of ``journalctl -o json`` output, or None. Never raises."""
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    message = entry.get("MESSAGE")
    if isinstance(message, list):  # journald stores non-UTF-8 messages as byte arrays
        try:
            message = bytes(message).decode("utf-8", errors="replace")
        except (TypeError, ValueError):
            return None
    if not isinstance(message, str):
        return None
    parsed = parse_xid_message(message)
    if parsed is None:
        return None
    try:
        timestamp = int(entry["__REALTIME_TIMESTAMP"]) / 1e6
    except (KeyError, TypeError, ValueError):
        return None
    try:  # the kernel's own stamp of the record, as /dev/kmsg gives it (journald keeps it for kernel messages)
        kernel_usec: int | None = int(entry["_SOURCE_MONOTONIC_TIMESTAMP"])
    except (KeyError, TypeError, ValueError):
        kernel_usec = None
    return to_event(parsed, timestamp, kernel_usec)


def _parse_iso(text: str) -> float | None:
    text = text.replace(",", ".")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    m = re.match(r"^(.*?)(\.\d+)?([+-]\d{2}):?(\d{2})$", text)
    if m:  # fromisoformat in 3.10 wants at most 6 fraction digits and a colon in the offset
        frac = (m.group(2) or "")[:7]
        text = f"{m.group(1)}{frac}{m.group(3)}:{m.group(4)}"
    else:
        m2 = re.match(r"^(.*?)(\.\d+)?$", text)
        if m2:
            text = f"{m2.group(1)}{(m2.group(2) or '')[:7]}"
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if value.tzinfo is None:
        value = value.astimezone()
    return value.timestamp()


# ---- reading the sources ------------------------------------------------------
@dataclass(frozen=True)
class KernelLogResult:
    """What the start-up read of the kernel log found."""

    events: list[XidEvent]
    source: str | None
    """``/dev/kmsg`` or ``journalctl``; None when neither could be read."""
    problem: str | None
    """Why the log (or the preferred source) could not be read; None when all went well."""

    def summary(self) -> str:
        """The one log line that says what happened."""
        if self.source is None:
            return (
                f"kernel log not readable ({self.problem}): XIDs from before this start are unknown; "
                "add the gpumon user to group systemd-journal (or adm), or set kernel.dmesg_restrict=0"
            )
        note = f" ({self.problem})" if self.problem else ""
        return f"kernel log: {len(self.events)} XID(s) since boot from {self.source}{note}"


class _SourceError(Exception):
    pass


def read_kmsg(path: Path, boot_time_seconds: float) -> list[XidEvent]:
    """XIDs in the kernel ring buffer at ``path`` (read without blocking until drained).

    Raises _SourceError with a short reason when the file cannot be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise _SourceError(f"{path}: {os_error_reason(exc)}") from exc
    chunks: list[bytes] = []
    try:
        for _ in range(_MAX_RECORDS):
            try:
                data = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                break  # EAGAIN: the ring buffer is drained
            except BrokenPipeError:
                continue  # EPIPE: records were overwritten while we read; go on with the next
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise _SourceError(f"{path}: {os_error_reason(exc)}") from exc
            if not data:
                break  # a regular file (tests) ends with EOF
            chunks.append(data)
    finally:
        os.close(fd)
    events = []
    now = boot_time_seconds  # kmsg records always carry a time; this is only a fallback
    for raw in b"".join(chunks).decode("utf-8", errors="replace").split("\n"):
        if not raw or raw.startswith(" "):  # continuation lines (" SUBSYSTEM=pci") carry no message
            continue
        event = parse_log_line(raw, boot_time_seconds, now)
        if event is not None:
            events.append(event)
    return events


def read_journal(command: Sequence[str], timeout_seconds: float) -> list[XidEvent]:
    """XIDs from ``journalctl -k -b -o json``. Raises _SourceError with a short reason."""
    try:
        proc = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout_seconds, check=False, errors="replace"
        )
    except FileNotFoundError as exc:
        raise _SourceError(f"{command[0]}: not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise _SourceError(f"{command[0]}: no answer within {timeout_seconds:g} s") from exc
    except OSError as exc:
        raise _SourceError(f"{command[0]}: {os_error_reason(exc)}") from exc
    stderr = proc.stderr.strip()
    if proc.returncode != 0:
        first = stderr.splitlines()[0] if stderr else f"exit status {proc.returncode}"
        if "permission" in stderr.lower() or "not seeing messages" in stderr.lower():
            first = "no permission"
        raise _SourceError(f"{command[0]}: {first}")
    if not proc.stdout.strip() and "not seeing messages" in stderr.lower():
        # journalctl exits 0 for users outside adm/systemd-journal and just shows nothing
        raise _SourceError(f"{command[0]}: no permission")
    events = []
    for line in proc.stdout.splitlines():
        event = parse_journal_json_line(line)
        if event is not None:
            events.append(event)
    return events


def read_boot_xids(
    kmsg_path: Path = DEFAULT_KMSG_PATH,
    journal_command: Sequence[str] | None = DEFAULT_JOURNAL_COMMAND,
    boot_time: Callable[[], float] | None = None,
    timeout_seconds: float = 10.0,
    logger: logging.Logger | None = None,
) -> KernelLogResult:
    """Read XIDs since boot from /dev/kmsg, else from the journal; log one line saying which.

    ``boot_time`` returns the Unix time the system booted (default psutil.boot_time);
    ``journal_command`` None skips the journal. Never raises.
    """
    logger = logger or log
    if boot_time is None:
        import psutil

        boot_time = psutil.boot_time
    problems: list[str] = []
    result: KernelLogResult | None = None
    try:
        events = read_kmsg(kmsg_path, boot_time())
        result = KernelLogResult(events=events, source=str(kmsg_path), problem=None)
    except _SourceError as exc:
        problems.append(str(exc))
    if result is None and journal_command:
        try:
            events = read_journal(journal_command, timeout_seconds)
            result = KernelLogResult(events=events, source="journalctl", problem="; ".join(problems) or None)
        except _SourceError as exc:
            problems.append(str(exc))
    if result is None:
        result = KernelLogResult(events=[], source=None, problem="; ".join(problems) or "no source configured")
        logger.warning("%s", result.summary())
    else:
        logger.info("%s", result.summary())
    return result


def os_error_reason(exc: OSError) -> str:
    """A short reason for an OSError opening or reading a log: "permission denied", "does not exist", ..."""
    if exc.errno in (errno.EPERM, errno.EACCES):
        return "permission denied"
    if exc.errno == errno.ENOENT:
        return "does not exist"
    return (exc.strerror or str(exc)).lower()
