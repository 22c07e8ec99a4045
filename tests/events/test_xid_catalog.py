"""The XID catalog: shipped as data, looked up by code, overridable from the config."""

from __future__ import annotations

import pytest

from gpumon.model.xid_catalog import ACTIONS, SEVERITIES, XidCatalog, XidCatalogError, override_problems

DESIGN_CODES = (13, 31, 43, 45, 46, 48, 62, 63, 64, 74, 79, 92, 94, 95, 109, 119, 120, 140, 154)


def test_every_code_named_in_the_design_is_in_the_shipped_catalog() -> None:
    catalog = XidCatalog.load()
    missing = [code for code in DESIGN_CODES if not catalog.lookup(code).known]
    assert missing == []


def test_shipped_entries_use_known_severities_and_actions() -> None:
    catalog = XidCatalog.load()
    for code in catalog.codes():
        info = catalog.lookup(code)
        assert info.severity in SEVERITIES, code
        assert info.action in ACTIONS, code
        assert info.meaning and not info.meaning.startswith("unknown"), code


@pytest.mark.parametrize(
    ("code", "severity", "action"),
    [
        (79, "critical", "reboot"),
        (13, "warning", "restart_app"),
        (43, "info", "ignore"),
        (45, "info", "follow_other_xid"),
        (48, "critical", "reset_gpu"),
        (74, "critical", "check_nvlink"),
        (95, "critical", "reset_gpu"),
        (154, "critical", "read_recovery_action"),
    ],
)
def test_well_known_codes_carry_the_recommended_action(code: int, severity: str, action: str) -> None:
    info = XidCatalog.load().lookup(code)
    assert (info.code, info.severity, info.action) == (code, severity, action)


def test_an_unknown_code_gets_a_neutral_default() -> None:
    info = XidCatalog.load().lookup(9999)
    assert info.meaning == "unknown XID 9999"
    assert (info.severity, info.action, info.known) == ("warning", "investigate", False)


def test_config_overrides_one_field_and_keeps_the_others() -> None:
    catalog = XidCatalog.load({79: {"action": "contact_support"}})
    info = catalog.lookup(79)
    assert info.action == "contact_support"
    assert info.severity == "critical"
    assert "fallen off the bus" in info.meaning


def test_config_adds_a_code_the_catalog_does_not_know() -> None:
    catalog = XidCatalog.load({999: {"meaning": "site-specific event", "severity": "info", "action": "ignore"}})
    info = catalog.lookup(999)
    assert (info.meaning, info.severity, info.action, info.known) == ("site-specific event", "info", "ignore", True)


def test_bad_overrides_are_all_reported_at_once() -> None:
    overrides = {79: {"severity": "fatal"}, 13: {"colour": "red"}, "x": {"action": "ignore"}}
    with pytest.raises(XidCatalogError) as err:
        XidCatalog.load(overrides)  # type: ignore[arg-type]
    assert len(err.value.problems) == 3
    assert override_problems({31: {"action": "restart_app"}}) == []


def test_docs_list_every_shipped_code_as_the_catalog_has_it() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "xid.md").read_text(encoding="utf-8")
    catalog = XidCatalog.load()
    for code in catalog.codes():
        info = catalog.lookup(code)
        assert f"| {code} | {info.meaning} | {info.severity} | `{info.action}` |" in doc, code
