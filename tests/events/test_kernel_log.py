"""Reading XIDs from the kernel log at start: the line parser and the two sources."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumon.events import kernel_log
from gpumon.events.kernel_log import (
    parse_journal_json_line,
    parse_log_line,
    parse_xid_message,
    read_boot_xids,
)
from gpumon.model.bus_id import normalize_bus_id

BOOT = 1_700_000_000.0
NOW = 1_700_100_000.0


@pytest.mark.parametrize(
    ("line", "xid", "bus", "pid", "name"),
    [
        (
            "NVRM: Xid (PCI:0000:06:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
            79,
            "00000000:06:00.0",
            1234,
            "python",
        ),
        (
            "NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
            13,
            "00000000:3B:00.0",
            None,
            None,
        ),
        ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "00000000:03:00.0", None, None),
        (
            "NVRM: Xid (PCI:0000:9b:00): 119, pid='<unknown>', name=<unknown>, Timeout after 6s of waiting for RPC",
            119,
            "00000000:9B:00.0",
            None,
            None,
        ),
        ("NVRM: Xid (PCI:0001:c1:00): 45, pid=77, name=nccl, Ch 00000010", 45, "00000001:C1:00.0", 77, "nccl"),
    ],
)
def test_driver_xid_messages_of_every_era_are_understood(
    line: str, xid: int, bus: str, pid: int | None, name: str | None
) -> None:
    parsed = parse_xid_message(line)
    assert parsed is not None
    assert (parsed.xid, parsed.pci_bus_id, parsed.pid, parsed.process_name) == (xid, bus, pid, name)


def test_kmsg_records_are_timed_from_boot() -> None:
    event = parse_log_line("4,1234,5678901,-;NVRM: Xid (PCI:0000:06:00): 79, pid=1, name=x, gone.", BOOT, NOW)
    assert event is not None
    assert event.timestamp_seconds == pytest.approx(BOOT + 5.678901)
    assert (event.xid, event.pci_bus_id, event.source) == (79, "00000000:06:00.0", "kernel_log")


def test_dmesg_and_short_iso_lines_carry_their_time() -> None:
    dmesg = parse_log_line("[  123.500000] NVRM: Xid (PCI:0000:06:00): 31, pid=5, name=a, fault", BOOT, NOW)
    assert dmesg is not None and dmesg.timestamp_seconds == pytest.approx(BOOT + 123.5)
    iso = parse_log_line("2024-05-01T12:34:56+0000 gpu-node kernel: NVRM: Xid (PCI:0000:06:00): 48, DBE", BOOT, NOW)
    assert iso is not None and iso.timestamp_seconds == pytest.approx(1714566896.0)
    iso_us = parse_log_line("2024-05-01T12:34:56.250000+00:00 n kernel: NVRM: Xid (PCI:0000:06:00): 48, DBE", BOOT, NOW)
    assert iso_us is not None and iso_us.timestamp_seconds == pytest.approx(1714566896.25)


def test_journal_json_entries_use_the_realtime_timestamp() -> None:
    entry = {
        "MESSAGE": "NVRM: Xid (PCI:0000:18:00): 94, pid=9, name=t, Contained",
        "__REALTIME_TIMESTAMP": "1714566896250000",
    }
    event = parse_journal_json_line(json.dumps(entry))
    assert event is not None
    assert (event.xid, event.pci_bus_id) == (94, "00000000:18:00.0")
    assert event.timestamp_seconds == pytest.approx(1714566896.25)
    as_bytes = dict(entry, MESSAGE=list(entry["MESSAGE"].encode()))
    assert parse_journal_json_line(json.dumps(as_bytes)) == event


def test_lines_without_an_xid_are_ignored() -> None:
    assert parse_log_line("6,1,2,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04", BOOT, NOW) is None
    assert parse_log_line("NVRM: Xid (garbage): 79, x", BOOT, NOW) is None
    assert parse_journal_json_line('{"MESSAGE": "usb 1-1: new device"}') is None
    assert parse_journal_json_line("not json") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:06:00", "00000000:06:00.0"),
        ("PCI:0000:3b:00", "00000000:3B:00.0"),
        ("00000000:3B:00.0", "00000000:3B:00.0"),
        ("0000:3b:00.1", "00000000:3B:00.1"),
        ("06:00.0", "00000000:06:00.0"),
        ("nvidia0", None),
    ],
)
def test_bus_ids_are_normalised_to_nvml_form(text: str, expected: str | None) -> None:
    assert normalize_bus_id(text) == expected


# ---- property tests ---------------------------------------------------------
_detail = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=0, max_size=60
).filter(lambda s: not s.startswith(("pid=", "name=")) and s == s.strip())
_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_-.0123456789", min_size=1, max_size=15)


@given(
    xid=st.integers(min_value=1, max_value=999),
    domain=st.integers(min_value=0, max_value=0xFFFF),
    bus=st.integers(min_value=0, max_value=0xFF),
    device=st.integers(min_value=0, max_value=0x1F),
    pid_name=st.one_of(st.none(), st.tuples(st.integers(min_value=1, max_value=4_194_304), _name)),
    detail=_detail,
    prefix=st.sampled_from(["", "kmsg", "dmesg", "iso", "iso-host"]),
    upper=st.booleans(),
    usec=st.integers(min_value=0, max_value=10**12),
)
def test_generated_xid_lines_round_trip(
    xid: int,
    domain: int,
    bus: int,
    device: int,
    pid_name: tuple[int, str] | None,
    detail: str,
    prefix: str,
    upper: bool,
    usec: int,
) -> None:
    bus_text = f"{domain:04x}:{bus:02x}:{device:02x}"
    if upper:
        bus_text = bus_text.upper()
    message = f"NVRM: Xid (PCI:{bus_text}): {xid}"
    if pid_name:
        message += f", pid={pid_name[0]}, name={pid_name[1]}"
    if detail or pid_name:
        message += f", {detail}"
    line = {
        "": message,
        "kmsg": f"4,99,{usec},-;{message}",
        "dmesg": f"[{usec // 10**6:>5}.{usec % 10**6:06d}] {message}",
        "iso": f"2024-05-01T12:34:56+0000 node kernel: {message}",
        "iso-host": f"2024-05-01T12:34:56.123456+02:00 gpu-7 kernel: {message}",
    }[prefix]
    event = parse_log_line(line, BOOT, NOW)
    assert event is not None
    assert event.xid == xid
    assert event.pci_bus_id == f"{domain:08X}:{bus:02X}:{device:02X}.0"
    parsed = parse_xid_message(line)
    assert parsed is not None
    assert parsed.pid == (pid_name[0] if pid_name else None)
    assert parsed.process_name == (pid_name[1] if pid_name else None)
    assert parsed.detail == detail.strip()
    if prefix in ("kmsg", "dmesg"):
        assert event.timestamp_seconds == pytest.approx(BOOT + usec / 1e6)


@given(st.text(max_size=300))
def test_the_parser_never_raises_on_arbitrary_text(text: str) -> None:
    parse_log_line(text, BOOT, NOW)
    parse_log_line("NVRM: Xid (" + text, BOOT, NOW)
    parse_journal_json_line(text)
    normalize_bus_id(text)


# ---- sources -----------------------------------------------------------------
KMSG = (
    "6,100,1000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04\n"
    "4,101,5000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    " SUBSYSTEM=pci\n"
    " DEVICE=+pci:0000:18:00.0\n"
    "4,102,6000000,-;NVRM: Xid (PCI:0000:28:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)\n"
)


def _journal_command(entries: list[dict[str, str]]) -> list[str]:
    script = "import sys\nfor line in sys.argv[1:]:\n    print(line)\n"
    return [sys.executable, "-c", script, *(json.dumps(e) for e in entries)]


def test_kmsg_is_read_first_and_timestamps_use_boot_time(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(KMSG)
    caplog.set_level(logging.INFO)
    result = read_boot_xids(kmsg_path=kmsg, journal_command=None, boot_time=lambda: BOOT)
    assert result.source == str(kmsg) and result.problem is None
    assert [(e.xid, e.pci_bus_id) for e in result.events] == [(79, "00000000:18:00.0"), (13, "00000000:28:00.0")]
    assert result.events[0].timestamp_seconds == pytest.approx(BOOT + 5.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "gpumon.events.kernel_log"]
    assert lines == [f"kernel log: 2 XID(s) since boot from {kmsg}"]


@pytest.fixture
def kmsg_denied(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A /dev/kmsg that refuses to open, as for an unprivileged user with kernel.dmesg_restrict=1."""
    denied = tmp_path / "kmsg-denied"
    real_open = os.open

    def fake_open(path: object, flags: int, *args: int) -> int:
        if Path(str(path)) == denied:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_open(path, flags, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(kernel_log.os, "open", fake_open)
    return denied


def test_journal_is_the_fallback_when_kmsg_is_not_readable(kmsg_denied: Path) -> None:
    entries = [
        {"MESSAGE": "NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, DBE", "__REALTIME_TIMESTAMP": "1714566896000000"},
        {"MESSAGE": "e1000e: link up", "__REALTIME_TIMESTAMP": "1714566897000000"},
    ]
    result = read_boot_xids(kmsg_path=kmsg_denied, journal_command=_journal_command(entries), boot_time=lambda: BOOT)
    assert result.source == "journalctl"
    assert [(e.xid, e.timestamp_seconds) for e in result.events] == [(48, 1714566896.0)]
    assert result.problem == f"{kmsg_denied}: permission denied"


def test_one_clear_line_when_neither_source_can_be_read(kmsg_denied: Path, caplog: pytest.LogCaptureFixture) -> None:
    hint = "Hint: You are currently not seeing messages from other users and the system."
    no_permission = [sys.executable, "-c", f"import sys; sys.stderr.write({hint!r})"]
    caplog.set_level(logging.INFO)
    result = read_boot_xids(kmsg_path=kmsg_denied, journal_command=no_permission, boot_time=lambda: BOOT)
    assert result.source is None and result.events == []
    lines = [r for r in caplog.records if r.name == "gpumon.events.kernel_log"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert lines[0].getMessage() == (
        f"kernel log not readable ({kmsg_denied}: permission denied; {sys.executable}: no permission): "
        "XIDs from before this start are unknown; add the gpumon user to group systemd-journal (or adm), "
        "or set kernel.dmesg_restrict=0"
    )


def test_missing_kmsg_and_missing_journalctl_are_named(tmp_path: Path) -> None:
    result = read_boot_xids(
        kmsg_path=tmp_path / "absent", journal_command=["/nonexistent/journalctl", "-k"], boot_time=lambda: BOOT
    )
    assert result.source is None
    assert result.problem == f"{tmp_path / 'absent'}: does not exist; /nonexistent/journalctl: not installed"
