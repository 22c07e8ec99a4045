"""Configuration: precedence, every problem at once, check-config's exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.config.file import DEFAULT_PORT, ConfigError, load
from tests.helpers import examples, run_cli


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpumon.yaml"
    path.write_text(text)
    return path


def test_defaults_without_any_source(tmp_path: Path) -> None:
    config = load(write(tmp_path, ""), env={}, flags={})
    assert config.listen == f"0.0.0.0:{DEFAULT_PORT}"
    assert config.backend == "nvml" and config.interval_seconds == 1.0


def test_precedence_is_flags_then_env_then_file_then_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "interval_seconds: 5\nslow_interval_seconds: 30\nlisten: 127.0.0.1:1111\n")
    env = {"GPUMON_INTERVAL_SECONDS": "3", "GPUMON_LISTEN": "127.0.0.1:2222"}
    config = load(path, env=env, flags={"listen": "127.0.0.1:3333"})
    assert config.listen == "127.0.0.1:3333"  # flag beats env and file
    assert config.interval_seconds == 3.0  # env beats file
    assert config.slow_interval_seconds == 30.0  # file beats default
    assert config.static_interval_seconds == 300.0  # default


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "listen: nowhere\ninterval_seconds: -1\nlog_level: loud\nbogus: 1\nfake_gpus: many\n"
        "exporter: {compat: [nvsmi], extra: 1}\n",
    )
    with pytest.raises(ConfigError) as info:
        load(path, env={"GPUMON_NOPE": "1"}, flags={})
    text = "\n".join(info.value.problems)
    for needle in (
        "listen",
        "interval_seconds",
        "log_level",
        "'bogus'",
        "fake_gpus",
        "nvsmi",
        "exporter.extra",
        "GPUMON_NOPE",
    ):
        assert needle in text, needle
    assert len(info.value.problems) >= 8


def test_missing_explicit_file_is_a_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load(tmp_path / "absent.yaml", env={}, flags={}, path_must_exist=True)


def test_check_config_valid_file_exits_0(tmp_path: Path) -> None:
    result = run_cli("check-config", str(write(tmp_path, "interval_seconds: 2\n")))
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout


def test_check_config_lists_every_problem_and_exits_2(tmp_path: Path) -> None:
    result = run_cli("check-config", str(write(tmp_path, "listen: x\ninterval_seconds: 0\nwho: me\n")))
    assert result.returncode == 2
    assert result.stderr.count("  - ") == 3, result.stderr


def test_run_with_bad_config_starts_nothing_and_exits_2(tmp_path: Path) -> None:
    result = run_cli(
        "run", "--config", str(write(tmp_path, "interval_seconds: zero\n")), "--backend", "fake", timeout=20
    )
    assert result.returncode == 2
    assert "interval_seconds" in result.stderr
    assert "listening" not in result.stderr


def test_bad_flag_value_is_a_usage_error() -> None:
    result = run_cli("once", "--backend", "fakes")
    assert result.returncode == 2
    assert "backend must be nvml, fake, fake:NAME, fake:PATH or replay:FILE" in result.stderr


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
documents = st.dictionaries(
    st.sampled_from(
        [
            "listen",
            "backend",
            "interval_seconds",
            "fake_gpus",
            "log_level",
            "exporter",
            "xid_catalog",
            "kernel_log",
            "state_dir",
            "junk",
        ]
    ),
    st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.text(max_size=5), scalars, max_size=3)),
    max_size=6,
)


@settings(max_examples=examples(150), deadline=None)
@given(documents)
def test_any_yaml_document_gives_a_config_or_a_config_error(doc: dict[str, object]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(yaml.safe_dump(doc))
        try:
            config = load(path, env={}, flags={})
        except ConfigError as exc:
            assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        else:
            assert config.interval_seconds > 0


def test_xid_catalog_overrides_are_validated(tmp_path: Path) -> None:
    path = write(tmp_path, "xid_catalog:\n  79: {severity: apocalyptic}\n  abc: {action: reboot}\n")
    with pytest.raises(ConfigError) as info:
        load(path, env={}, flags={})
    text = "\n".join(info.value.problems)
    assert "apocalyptic" in text and "'abc'" in text
    ok = load(write(tmp_path, "xid_catalog:\n  79: {action: contact_support}\n"), env={}, flags={})
    assert ok.xid_catalog == {79: {"action": "contact_support"}}


def test_the_test_suites_strict_fields_switch_is_not_taken_for_configuration(tmp_path: Path) -> None:
    # GPUMON_STRICT_FIELDS=1 (tests/conftest.py) reaches every daemon a test starts; the config must let it by
    config = load(write(tmp_path, ""), env={"GPUMON_STRICT_FIELDS": "1"}, flags={})
    assert config.interval_seconds > 0
