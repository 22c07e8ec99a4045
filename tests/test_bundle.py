"""gpumon bundle: one archive for a bug report, secrets out, playable with --backend replay:."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpumon.backends.replay import replay_backend
from gpumon.commands import bundle
from gpumon.model.snapshot import Tier
from tests.fake_pynvml import h200_pair

SECRETS = ("hunter2", "s3cr3t-token", "AKIA-abc", "XYZ-webhook-token", "op:pw")
CONFIG = """
backend: nvml
state_dir: {state}
alerting:
  alertmanagers:
    - http://op:pw@alertmanager-1:9093/
  webhooks:
    - https://hooks.slack.example/services/XYZ-webhook-token
    - url: https://hooks.internal/gpu
      bearer_token: s3cr3t-token
      headers: {{X-Api-Key: AKIA-abc}}
  password: hunter2
  host_label: host
"""


def make_bundle(tmp_path: Path, *extra: str) -> tuple[int, Path]:
    state = tmp_path / "state"
    (state / "health").mkdir(parents=True)
    (state / "health" / "inventory.json").write_text('{"gpus": 2}')
    (state / "burn").mkdir()
    (state / "burn" / "last.json").write_text('{"verdict": "fail"}')
    config = tmp_path / "gpumon.yaml"
    config.write_text(CONFIG.format(state=state))
    parser = argparse.ArgumentParser()
    bundle.configure(parser)
    out = tmp_path / "bug.tar.gz"
    args = parser.parse_args(
        ["-o", str(out), "--config", str(config), "--polls", "3", "--interval-seconds", "0", *extra]
    )
    return bundle.run(args, binding=h200_pair()), out


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_the_bundle_holds_recording_config_health_burn_and_facts(tmp_path: Path) -> None:
    code, out = make_bundle(tmp_path)
    assert code == 0
    got = members(out)
    assert set(got) == {"recording.json", "config.yaml", "health/inventory.json", "burn-last.json", "facts.json"}
    assert json.loads(got["burn-last.json"]) == {"verdict": "fail"}
    facts = json.loads(got["facts.json"])
    assert facts["gpumon"] and facts["python"] and facts["problems"] == []
    assert json.loads(got["recording.json"])["redacted"] is True


def test_no_secret_of_the_config_reaches_the_bundle(tmp_path: Path) -> None:
    _, out = make_bundle(tmp_path)
    text = b"".join(members(out).values()).decode()
    for secret in SECRETS:
        assert secret not in text
    config = members(out)["config.yaml"].decode()
    assert "alertmanager-1:9093" in config and "host_label: host" in config  # what is no secret stays


def test_replay_plays_the_bundle_as_it_plays_a_recording(tmp_path: Path) -> None:
    _, out = make_bundle(tmp_path)
    backend = replay_backend(out)
    backend.init()
    assert backend.device_count() == 2
    assert backend.read(0, Tier.FAST)["power_watts"] == 75.5
    backend.shutdown()
    once = subprocess.run(
        [sys.executable, "-m", "gpumon", "once", "--backend", f"replay:{out}", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert once.returncode == 0, once.stderr
    assert [g["serial"] for g in json.loads(once.stdout)["gpus"]] == ["REDACTED-0", "REDACTED-1"]


def test_a_bundle_is_written_without_nvml_and_says_why(tmp_path: Path) -> None:
    nv = h200_pair()
    nv.init_error = 12  # NVML_ERROR_LIBRARY_NOT_FOUND
    parser = argparse.ArgumentParser()
    bundle.configure(parser)
    out = tmp_path / "b.tar.gz"
    args = parser.parse_args(["-o", str(out), "--config", str(tmp_path / "none.yaml"), "--state-dir", str(tmp_path)])
    assert bundle.run(args, binding=nv) == 0
    got = members(out)
    assert "recording.json" not in got
    problems = " ".join(json.loads(got["facts.json"])["problems"])
    assert "no recording" in problems and "none.yaml" in problems


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://op:pw@am:9093/api", "http://am:9093/<path removed>"),
        ("http://am:9093", "http://am:9093"),
        ({"token": "x", "url": "https://h/p?k=1"}, {"token": bundle.REMOVED, "url": "https://h/<path removed>"}),
        ({"password": "", "interval_seconds": 1}, {"password": "", "interval_seconds": 1}),
    ],
)
def test_scrub_removes_what_could_be_a_secret(value: object, expected: object) -> None:
    assert bundle.scrub(value) == expected


def test_gpumon_bundle_on_a_host_without_nvml_still_writes_the_archive(tmp_path: Path) -> None:
    out = tmp_path / "b.tar.gz"
    result = subprocess.run(
        [sys.executable, "-c", "import sys, gpumon.cli; sys.modules['pynvml'] = None; sys.exit(gpumon.cli.main())",
         "bundle", "-o", str(out), "--state-dir", str(tmp_path), "--config", str(tmp_path / "none.yaml")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout and "no recording" in result.stdout
    assert set(members(out)) == {"facts.json"}


@pytest.mark.parametrize(("option", "value"), [("--polls", "-3"), ("--polls", "0"), ("--interval-seconds", "nan"),
                                               ("--interval-seconds", "inf"), ("--interval-seconds", "-1")])  # fmt: skip
def test_gpumon_bundle_refuses_polls_or_intervals_it_cannot_record_and_writes_nothing(
    tmp_path: Path, option: str, value: str
) -> None:
    out = tmp_path / "bundle.tar.gz"
    result = subprocess.run(
        [sys.executable, "-m", "gpumon", "bundle", "-o", str(out), option, value],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2 and option in result.stderr
    assert not out.exists()
