"""The Prometheus alert rules and the built-in pack differ only as docs/alerting.md says: a test that
fails on an alert added to one set and not listed in the table of differences."""

from __future__ import annotations

import re

import yaml

from gpumon.alerts.builtin import builtin_rules_raw
from tests.helpers import REPO

SECTION = "## The Prometheus rules and the built-in pack"


def documented() -> dict[str, str]:
    text = (REPO / "docs" / "alerting.md").read_text()
    assert SECTION in text
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `(\w+)` \| (Prometheus rules|built-in pack) \|", section, re.M))


def test_every_difference_between_the_two_alert_sets_is_documented() -> None:
    builtin = {rule["name"] for rule in builtin_rules_raw()}
    rules = yaml.safe_load((REPO / "prometheus" / "gpumon-alerts.rules.yml").read_text())
    prometheus = {r["alert"] for group in rules["groups"] for r in group["rules"] if "alert" in r}
    actual = {name: "Prometheus rules" for name in prometheus - builtin}
    actual |= {name: "built-in pack" for name in builtin - prometheus}
    assert documented() == actual


def test_no_doc_says_the_two_sets_are_equal() -> None:
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        text = " ".join(path.read_text().split())
        for claim in (
            "equal to the built-in pack",
            "same conditions as gpumon's built-in",
            "counts every occurrence",  # an XID both sources report counts once; one neither saw is not seen
            "every dashboard panel has data",  # process, DCGM, burn and fault panels need more than the demo
        ):
            assert claim not in text, (path.name, claim)
