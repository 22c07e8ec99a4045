"""Every exposition gpumon serves passes the validators scrapers and CI use.

* OpenMetrics (``Accept: application/openmetrics-text``): prometheus_client's strict OpenMetrics
  parser, and the rule of the official validator (prometheus/OpenMetrics, src/validator) that
  prometheus_client does not apply: metadata (HELP/TYPE/UNIT) of a family must be followed by a
  sample of it before the next family's metadata, else it reports "metric name changed". A
  family with HELP and TYPE and no sample (no alert held back, no burn running, no finding) is
  therefore left out of both formats.
* Prometheus text: ``promtool check metrics`` on gpumon's own families (the DCGM_FI_* families
  keep dcgm-exporter's naming, which promtool lints; see docs/dcgm-compat.md), and no family
  without samples there either.

The official Go validator is not packaged for Debian (it needs Prometheus' textparse, which
bookworm has no -dev package of); where a built one is on PATH as ``openmetricsvalidator``
(or named by $OPENMETRICS_VALIDATOR), it is run as well. The two checks above together agree
with all 211 text cases of the official validator's own test data (run with
$OPENMETRICS_TESTDATA pointing at them); the real Prometheus of the dashboard tests parses the
same OpenMetrics exposition with its own parser on every scrape.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from tests.helpers import DaemonProcess, wait_for

pytestmark = pytest.mark.integration

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
_METADATA = re.compile(r"^# (?:HELP|TYPE|UNIT) (\S+)")
_SAMPLE_NAME = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)")
_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_gcount", "_gsum", "_info")


def families_without_samples(text: str, *, last_too: bool = True) -> list[str]:
    """Families whose metadata is not followed by one of their samples. Before another family's
    metadata that is the official OpenMetrics validator's "metric name changed"; a trailing one it
    lets pass (``last_too=False`` does the same), though gpumon serves none."""
    empty: list[str] = []
    current: str | None = None
    sampled = True
    for line in text.splitlines():
        if m := _METADATA.match(line):
            name = m.group(1)
            if name != current:
                if current is not None and not sampled:
                    empty.append(current)
                current, sampled = name, False
        elif line and not line.startswith("#") and (m := _SAMPLE_NAME.match(line)):
            sample = m.group(1)
            if current is not None and (sample == current or any(sample == current + s for s in _SUFFIXES)):
                sampled = True
    if last_too and current is not None and not sampled:
        empty.append(current)
    return empty


def official_validator_accepts(text: str) -> bool:
    """prometheus_client's strict parser and the official validator's "metric name changed" rule
    (together they agree with all 211 text cases of prometheus/OpenMetrics tests/testdata/parsers)."""
    try:
        list(text_string_to_metric_families(text))
    except ValueError:
        return False
    return not families_without_samples(text, last_too=False)


def test_the_rule_finds_a_family_without_samples() -> None:
    text = "# HELP a x\n# TYPE a gauge\n# HELP b y\n# TYPE b counter\nb_total 1\n# HELP c z\n# TYPE c gauge\n# EOF\n"
    assert families_without_samples(text) == ["a", "c"]
    assert families_without_samples(text, last_too=False) == ["a"]
    assert not official_validator_accepts(text)


def test_the_checks_agree_with_the_official_validators_own_cases() -> None:
    """Where $OPENMETRICS_TESTDATA names a checkout's tests/testdata/parsers (prometheus/OpenMetrics)."""
    where = os.environ.get("OPENMETRICS_TESTDATA")
    if not where or not Path(where).is_dir():
        pytest.skip("set $OPENMETRICS_TESTDATA to prometheus/OpenMetrics' tests/testdata/parsers to compare")
    disagree = []
    for case in sorted(Path(where).iterdir()):
        spec = json.loads((case / "test.json").read_text())
        if spec.get("type") == "text":
            text = (case / spec["file"]).read_text(errors="replace")
            if official_validator_accepts(text) != spec["shouldParse"]:
                disagree.append(case.name)
    assert disagree == []


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """gpumon with every optional source: both DCGM sets, alerts, burn results, health."""
    tmp = tmp_path_factory.mktemp("validators")
    gpumon = DaemonProcess(["--backend", "fake", "--fake-gpus", "2", "--compat", "dcgm,dcgm-4.9"], tmp)
    try:
        gpumon.wait_ready()
        wait_for(lambda: "DCGM_FI_DEV_GPU_TEMP{" in gpumon.metrics(), 10, 0.2, "DCGM_FI_* series")
        yield gpumon
    finally:
        gpumon.stop()


def openmetrics_text(daemon: DaemonProcess) -> str:
    response = daemon.get("/metrics", headers={"Accept": OPENMETRICS})
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    return response.text


def test_openmetrics_has_no_family_without_samples(daemon: DaemonProcess) -> None:
    assert families_without_samples(openmetrics_text(daemon)) == []


def test_text_format_has_no_family_without_samples(daemon: DaemonProcess) -> None:
    assert families_without_samples(daemon.metrics()) == []


def test_openmetrics_parses_strictly(daemon: DaemonProcess) -> None:
    assert official_validator_accepts(openmetrics_text(daemon))
    names = [f.name for f in text_string_to_metric_families(openmetrics_text(daemon))]
    assert "gpumon_temperature_celsius" in names
    assert len(names) == len(set(names)), "a family appears twice"


def test_promtool_check_metrics_is_clean_on_gpumons_own_families(daemon: DaemonProcess) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); CI installs it")
    own: list[str] = []
    keep = True
    for line in daemon.metrics().splitlines(keepends=True):
        if m := _METADATA.match(line):
            keep = not m.group(1).startswith("DCGM_")
        if keep:
            own.append(line)
    result = subprocess.run([promtool, "check", "metrics"], input="".join(own), capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


def _official_validator() -> str | None:
    named = os.environ.get("OPENMETRICS_VALIDATOR")
    if named and Path(named).is_file():
        return named
    return shutil.which("openmetricsvalidator")


def test_the_official_openmetrics_validator_accepts_it(daemon: DaemonProcess) -> None:
    validator = _official_validator()
    if validator is None:
        pytest.skip(
            "the official OpenMetrics validator (prometheus/OpenMetrics src/cmd/openmetricsvalidator) is not "
            "built here: Debian packages no Prometheus textparse to build it from; set $OPENMETRICS_VALIDATOR"
        )
    result = subprocess.run([validator], input=openmetrics_text(daemon), capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
