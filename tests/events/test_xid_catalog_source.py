"""The shipped XID catalog against a stored copy of NVIDIA's Xid Catalog (tests/data/nvidia_xid_catalog.csv:
code, mnemonic, resolution bucket, fatal or not, and which document said so).

Non-fatal means non-fatal, by source: NVSentinel drained 77 nodes across 11 racks after treating XID 45 as
fatal (NVIDIA/NVSentinel#1629). Every shipped entry names the NVIDIA bucket it follows; its severity and
action are that bucket's, and a code NVIDIA marks non-fatal opens no fault (drains nothing), unless the
entry says why gpumon differs."""

from __future__ import annotations

import csv
from pathlib import Path

from gpumon.model.findings import LIFECYCLE_OF_ACTION, ladder_action
from gpumon.model.xid_catalog import XidCatalog

STORED = Path(__file__).resolve().parents[1] / "data" / "nvidia_xid_catalog.csv"
BUCKETS = {
    "RESTART_APP": ("warning", "restart_app"),
    "IGNORE": ("info", "ignore"),
    "RESET_GPU": ("critical", "reset_gpu"),
    "RESTART_BM": ("critical", "reboot"),
    "RESTART_VM": ("critical", "reboot"),
    "UNEXPECTED_ERR_REPORT_ISSUE": ("critical", "contact_support"),
    "CHECK_MECHANICALS": ("critical", "check_hardware"),
    "WORKFLOW_NVLINK_ERR": ("critical", "check_nvlink"),
    "WORKFLOW_NVLINK5_ERR": ("critical", "check_nvlink"),
    "WORKFLOW_XID_45": ("info", "follow_other_xid"),
    "WORKFLOW_XID_48": ("critical", "reset_gpu"),
    "UPDATE_SWFW": ("critical", "update_software"),
    "XID_154_EVAL": ("info", "follow_other_xid"),
}
"""NVIDIA's resolution buckets in gpumon's words (docs/xid.md, "Where the catalog comes from")."""


def _stored() -> dict[int, dict[str, str]]:
    lines = [line for line in STORED.read_text().splitlines() if not line.startswith("#")]
    return {int(row["code"]): row for row in csv.DictReader(lines)}


def _drains(action: str) -> bool:
    return ladder_action(action) in LIFECYCLE_OF_ACTION


def test_every_shipped_entry_names_the_nvidia_bucket_and_source_it_follows() -> None:
    catalog, stored = XidCatalog.load(), _stored()
    for code in catalog.codes():
        info = catalog.lookup(code)
        assert code in stored, f"XID {code} is not in the stored copy of NVIDIA's catalog"
        assert info.nvidia_source == stored[code]["source"] and info.nvidia_source in catalog.sources, code
        assert (info.nvidia_bucket or "") in (stored[code]["bucket"], "none" if not stored[code]["bucket"] else ""), code


def test_severity_and_action_follow_nvidias_bucket_unless_the_entry_says_why_not() -> None:
    catalog, stored = XidCatalog.load(), _stored()
    for code in catalog.codes():
        info, bucket = catalog.lookup(code), stored[code]["bucket"]
        if not bucket or info.differs:
            continue
        assert (info.severity, info.action) == BUCKETS[bucket], f"XID {code}: NVIDIA's bucket is {bucket}"


def test_a_code_nvidia_marks_non_fatal_never_drains_and_a_fatal_one_does_unless_the_entry_says_why() -> None:
    catalog, stored = XidCatalog.load(), _stored()
    wrong = []
    for code in catalog.codes():
        info, fatal = catalog.lookup(code), stored[code]["fatal"]
        if fatal and not info.differs and _drains(info.action) != (fatal == "yes"):
            wrong.append((code, stored[code]["mnemonic"], fatal, info.action))
    assert wrong == []
    assert not _drains(catalog.lookup(45).action)  # NVSentinel's 77 drained nodes


def test_a_difference_is_said_in_words_and_only_where_there_is_one() -> None:
    catalog, stored = XidCatalog.load(), _stored()
    for code in catalog.codes():
        info, bucket = catalog.lookup(code), stored[code]["bucket"]
        if info.differs is not None:
            assert len(info.differs.split()) >= 8, code
            same = (info.severity, info.action) == BUCKETS.get(bucket) and (
                not stored[code]["fatal"] or _drains(info.action) == (stored[code]["fatal"] == "yes")
            )
            assert not same, f"XID {code} says it differs from {bucket} but does not"


def test_the_resolving_pairs_are_the_ones_nvidia_documents() -> None:
    catalog, stored = XidCatalog.load(), _stored()
    shipped = {(code, r) for code in catalog.codes() for r in catalog.lookup(code).resolves}
    documented = {(code, int(row["resolves"])) for code, row in stored.items() if row["resolves"]}
    assert shipped == documented == {(162, 163)}
