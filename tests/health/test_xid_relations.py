"""An XID that cancels another (the catalog's ``resolves``) and XID 74's NVLink classes, as the verdict shows them.

NVIDIA/NVSentinel#1252: XID 163 (PSHC disengaged) asks for a GPU reset; a later XID 162 (PSHC re-engaged)
makes that reset unnecessary. NVSentinel decodes XID 74's registers into signal integrity, ECC/parity,
hardware or unexpected, each with its own action; gpumon does too, and an unknown layout keeps the
catalog's action."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpumon.health.xid_lifecycle import XidLifecycle
from gpumon.model.findings import CRITICAL
from gpumon.model.xid import XidEvent
from gpumon.model.xid74 import decode_xid74
from gpumon.model.xid_catalog import XidCatalog

T0 = 1_800_000_000.0
LINE74 = "NVRM: Xid (PCI:0000:d8:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14({})"


def xid(code: int, ts: float, gpu: int = 0, message: str | None = None) -> XidEvent:
    return XidEvent(xid=code, timestamp_seconds=ts, source="nvml", gpu_index=gpu, uuid=f"GPU-{gpu}", message=message)


def shown(lc: XidLifecycle, now: float = T0 + 60) -> list[tuple[int | None, str, str, str]]:
    return [(f.gpu, f.severity, f.action, f.summary) for f in lc.findings(now)]


def test_a_pending_reset_is_cleared_by_the_xid_that_resolves_it() -> None:
    lc = XidLifecycle(XidCatalog.load())
    lc.record(xid(163, T0, gpu=1))
    lc.record(xid(163, T0, gpu=2))
    assert [(g, s, a) for g, s, a, _ in shown(lc)] == [(1, CRITICAL, "reset_gpu"), (2, CRITICAL, "reset_gpu")]
    lc.urgent = False
    lc.record(xid(162, T0 + 5, gpu=1))
    assert [g for g, *_ in shown(lc)] == [2]  # GPU 1's reset is void; GPU 2's stays
    assert lc.urgent  # written at once: the verdict changed
    assert lc.resolved[-1]["xid"] == 163 and "resolved by XID 162" in lc.resolved[-1]["resolved_by"]


def test_a_resolving_xid_before_the_fault_cancels_nothing() -> None:
    lc = XidLifecycle(XidCatalog.load())
    lc.record(xid(162, T0))
    lc.record(xid(163, T0 + 5))
    assert [a for _, _, a, _ in shown(lc)] == ["reset_gpu"]


def test_xid_74_names_its_nvlink_problem_and_takes_its_action() -> None:
    cases = {
        "0x200000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0": ("signal integrity, link 14", "inspect_hardware"),
        "0x10, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0": ("ecc parity, link 14", "inspect_hardware"),
        "0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0": ("hardware, link 14", "inspect_hardware"),
        "0x2, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0": ("unexpected, link 14", "inspect_hardware"),
        "0x40000000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0": (None, None),  # bit 30: can be ignored
    }
    for values, (words, action) in cases.items():
        lc = XidLifecycle(XidCatalog.load())
        lc.record(xid(74, T0, message=LINE74.format(values)))
        found = lc.findings(T0 + 60)
        if words is None:
            assert found == [], values
            continue
        assert [(f.action, f.summary) for f in found] == [(action, f"xid 74 NVLink error ({words})")], values
        assert found[0].evidence["nvlink"]["link"] == 14


def test_xid_74_classes_by_the_catalog_action_they_map_to() -> None:
    decoded = {
        v: decode_xid74(LINE74.format(f"{v}, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0"))
        for v in ("0x200000", "0x10", "0x10000", "0x2", "0x400000 ", "0x80000000", "0x100012")
    }
    assert {v: (d.kind, d.action) for v, d in decoded.items() if d} == {
        "0x200000": ("signal_integrity", "check_nvlink"),
        "0x10": ("ecc_parity", "contact_support"),
        "0x10000": ("hardware", "check_hardware"),
        "0x2": ("unexpected", "contact_support"),  # bit 1 alone: a secondary error with no primary
        "0x400000 ": ("signal_integrity", "check_nvlink"),
        "0x80000000": ("unexpected", "contact_support"),  # bit 31: not one NVIDIA lists
        "0x100012": ("ecc_parity", "contact_support"),  # bits 1 and 20 beside ECC: its secondary errors
    }


def test_an_xid_74_line_of_another_layout_keeps_the_catalogs_action() -> None:
    for message in (
        None,
        "NVRM: Xid (PCI:0000:d8:00): 74, NVLink error",
        LINE74.format("0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x1"),
    ):
        assert decode_xid74(message) is None
        lc = XidLifecycle(XidCatalog.load())
        lc.record(xid(74, T0, message=message))
        assert [(a, s) for _, _, a, s in shown(lc)] == [("inspect_hardware", "xid 74 NVLink error")]


@given(st.text(max_size=300))
def test_the_xid_74_decoder_never_raises(text: str) -> None:
    decoded = decode_xid74(LINE74.format(text))
    assert decoded is None or decoded.kind in ("signal_integrity", "ecc_parity", "hardware", "unexpected", "benign")
