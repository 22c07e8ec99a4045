"""check-config as a gate: every broken file is a list of problem lines and exit 2, never a traceback,
and what ``run`` (or a SIGHUP reload) would reject, check-config rejects first with the same lines."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from gpumon import cli
from gpumon.config.file import ConfigError, load, reloader
from tests.helpers import run_cli

BCRYPT_OF_SECRET = "$2b$04$hgzcSTkbTXedRCfbmcp2F.9mmNX7lKYsVzjPB79EtYqc1XDzRbxeu"


def check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    """``gpumon check-config PATH`` in-process: exit code and the problem lines it printed."""
    code = cli.main(["check-config", str(path)])
    err = capsys.readouterr().err
    return code, [line[4:] for line in err.splitlines() if line.startswith("  - ")]


def rejected_by_every_path(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """check-config, run's loader and the reload loader all reject ``path`` with the same problems."""
    code, lines = check(path, capsys)
    assert code == 2 and lines, "check-config accepted it"
    run_args = cli.build_parser().parse_args(["run", "--config", str(path)])
    with pytest.raises(ConfigError) as run_error:
        load(run_args.config, {}, {}, path_must_exist=True)
    with pytest.raises(ConfigError) as reload_error:
        reloader(path, {}, env=dict)()
    assert run_error.value.problems == reload_error.value.problems == lines
    return lines


def assert_one_positioned_line(line: str, path: Path) -> None:
    """A problem line names the file and where in it (line and column), whoever found the problem:
    gpumon's own shape check or the YAML parser's limits (libyaml's nesting limit comes first in
    PyYAML 6.0.4; its wording is the library's and is not pinned here)."""
    assert re.match(rf"{re.escape(str(path))}: line \d+, column \d+: \S", line), line


def write(tmp_path: Path, content: str | bytes, name: str = "gpumon.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


# ---- files that gave a traceback (exit 1) -------------------------------------------------------
def test_a_latin1_byte_is_a_problem_with_its_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, b"# caf\xe9\ninterval_seconds: 2\n")
    (line,) = rejected_by_every_path(path, capsys)
    assert line == f"{path}: line 1, column 6: byte 0xE9 is not UTF-8; save the file as UTF-8"


def test_a_utf16_file_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "interval_seconds: 2\n".encode("utf-16"))
    (line,) = rejected_by_every_path(path, capsys)
    assert "UTF-16" in line and "save it as UTF-8" in line


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_deep_nesting_is_a_problem_not_a_recursion_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    path = write(tmp_path, "alerting: " + "[" * depth + "]" * depth + "\n")
    (line,) = rejected_by_every_path(path, capsys)
    assert_one_positioned_line(line, path)


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    path = write(tmp_path, "\n".join(lines) + "\nalerting: {rules: *i}\n")
    started = time.monotonic()
    (line,) = rejected_by_every_path(path, capsys)
    assert "more than 200000 values once aliases are expanded" in line
    assert time.monotonic() - started < 30  # the 10^9 values are never built


def test_an_alias_that_contains_itself_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (line,) = rejected_by_every_path(write(tmp_path, "alerting: &a {rules: [*a]}\n"), capsys)
    assert "alias *a refers to the node that contains it" in line


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("interval_seconds: " + "9" * 400 + "\n", "is out of range (at most 2^63 either side of 0)"),
        ("interval_seconds: 0x" + "f" * 400 + "\n", "is out of range"),
        ("interval_seconds: 1e400\n", "interval_seconds must be from 0.1 to 3600 seconds, got inf"),
        ("fake_gpus: .inf\n", "fake_gpus must be a whole number, got inf"),
        ("xid_catalog: {.inf: {action: reboot}}\n", "key inf is not an XID code (a whole number from 1 to 65535)"),
        (
            "alerting:\n  rules:\n    - {name: A, field: temperature_celsius, op: '>', threshold: 1, for: '"
            + "9" * 400
            + "h'}\n",
            "for must be a duration from 0s to 168h",
        ),
        ("alerting: {retry: {timeout: " + "9" * 18 + "}}\n", "timeout must be a duration from 1ms to 5m"),
        ("listen: '0.0.0.0:" + "9" * 5000 + "'\n", "listen must be HOST:PORT with a port 1-65535"),
        ("a: 2024-13-45\n", "line 1, column 4: not valid YAML: cannot read '2024-13-45' as timestamp"),
        ("interval_seconds: !!float abc\n", "cannot read 'abc' as float"),
        ('host: "\\ud800"\n', "holds a lone surrogate|invalid Unicode character escape"),
    ],
)
def test_numbers_too_large_and_unbuildable_values_are_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    lines = rejected_by_every_path(write(tmp_path, text), capsys)
    assert any(alternative in line for line in lines for alternative in expected.split("|")), lines
    assert all(len(line) < 400 for line in lines), "a problem line quotes a value in full"


def test_a_key_given_twice_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "interval_seconds: 1\nlisten: 127.0.0.1:1\ninterval_seconds: 0.5\n")
    (line,) = rejected_by_every_path(path, capsys)
    assert line == f"{path}: line 3, column 1: key 'interval_seconds' is given twice in the same mapping"


# ---- accepted by check-config, then rejected by run -----------------------------------------------
@pytest.mark.parametrize("key", ["interval_seconds", "slow_interval_seconds", "static_interval_seconds"])
def test_infinite_intervals_are_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str) -> None:
    lines = rejected_by_every_path(write(tmp_path, f"{key}: .inf\n"), capsys)
    assert any(f"{key} must be from 0.1 to" in line and "got inf" in line for line in lines), lines


def test_a_state_dir_with_a_nul_byte_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (line,) = rejected_by_every_path(write(tmp_path, 'state_dir: "/var/lib/gpu\\0mon"\n'), capsys)
    assert "state_dir must not contain a NUL byte" in line


def test_check_config_reads_the_web_config_and_lists_its_three_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = write(
        tmp_path,
        "tls_server_config: {cert_file: absent.crt, key_file: absent.key}\n"
        "basic_auth_users: {prometheus: plaintext-password}\nfrobnicate: true\n",
        "web-config.yml",
    )
    lines = rejected_by_every_path(write(tmp_path, f"web_config_file: {web}\n"), capsys)
    text = "\n".join(lines)
    assert "unknown key 'frobnicate'" in text
    assert "absent.crt" in text and "no such file" in text
    assert "basic_auth_users.prometheus: not a bcrypt hash" in text
    assert all(line.startswith(str(web)) for line in lines)


def test_a_valid_web_config_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    web = write(tmp_path, f"basic_auth_users: {{prometheus: '{BCRYPT_OF_SECRET}'}}\n", "web-config.yml")
    code, lines = check(write(tmp_path, f"web_config_file: {web}\n"), capsys)
    assert (code, lines) == (0, [])


def test_a_broken_web_config_file_is_reported_with_its_position(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    web = write(tmp_path, b"basic_auth_users:\n  caf\xe9: x\n", "web-config.yml")
    (line,) = rejected_by_every_path(write(tmp_path, f"web_config_file: {web}\n"), capsys)
    assert line == f"{web}: line 2, column 6: byte 0xE9 is not UTF-8; save the file as UTF-8"
    deep = write(tmp_path, "basic_auth_users: " + "[" * 3000 + "]" * 3000 + "\n", "web-config.yml")
    (line,) = rejected_by_every_path(write(tmp_path, f"web_config_file: {deep}\n"), capsys)
    assert_one_positioned_line(line, deep)


def test_check_config_checks_the_scenario_file_it_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path, "gpus:\n  - hang_seconds: abc\n", "scenario.yaml")
    (line,) = rejected_by_every_path(write(tmp_path, f"backend: 'fake:{scenario}'\n"), capsys)
    assert line == f"{scenario}: gpus[0]: hang_seconds must be a number from 0 to 86400, got 'abc'"


# ---- accepted though meaningless: every number has a range, and the message says it -------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("stale_after_seconds: .nan\n", "stale_after_seconds must be 0 (5 × interval_seconds) or from 0.1 to 86400"),
        ("interval_seconds: 1e-9\n", "interval_seconds must be from 0.1 to 3600 seconds, got 1e-09"),
        ("interval_seconds: 7200\n", "interval_seconds must be from 0.1 to 3600 seconds"),
        ("interval_seconds: 5\nstale_after_seconds: 2\n", "stale_after_seconds must be 0 or at least interval_seconds"),
        ("alerting: {retry: {timeout: 999999999h}}\n", "timeout must be a duration from 1ms to 5m"),
        ("alerting: {retry: {max_backoff: 2h}}\n", "max_backoff must be a duration from 1ms to 1h"),
        ("xid_catalog: {-5: {action: reboot}}\n", "key -5 is not an XID code (a whole number from 1 to 65535)"),
        ("xid_catalog: {79.9: {action: reboot}}\n", "key 79.9 is not an XID code"),
        ("xid_catalog: {79: {action: reboot}, '79': {action: ignore}}\n", "XID 79 is given twice"),
        (
            "alerting: {rules: [{name: X, kind: xid, codes: [-5, 79.9]}]}\n",
            "codes must be a list of XID codes (whole numbers from 1 to 65535)",
        ),
        (
            "alerting: {rules: [{name: S, kind: stale_snapshot, threshold: .inf}]}\n",
            "threshold must be a finite number",
        ),
        ("alerting: {rules: [{name: I, kind: idle_with_memory, threshold: 30}]}\n", "must be from 0 to 1, got 30"),
        ("alerting: {builtin: {GpuXidCritical: {hold: 0}}}\n", "hold must be a duration from 1s to 168h"),
        ("alerting: {rules: [{name: T, field: power_watts, op: '>', threshold: .nan}]}\n", "finite number"),
    ],
)
def test_meaningless_numbers_are_rejected_with_their_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    lines = rejected_by_every_path(write(tmp_path, text), capsys)
    assert any(expected in line for line in lines), lines


def test_the_documented_example_config_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = check(Path(__file__).resolve().parent.parent / "deploy" / "gpumon.example.yaml", capsys)
    assert (code, lines) == (0, [])


# ---- the same through real processes: check-config and run print the same lines, exit 2 ---------
def test_run_rejects_exactly_what_check_config_rejects_in_real_processes(tmp_path: Path) -> None:
    web = write(tmp_path, "basic_auth_users: {prometheus: plaintext}\n", "web-config.yml")
    path = write(tmp_path, f'interval_seconds: .inf\nweb_config_file: {web}\nstate_dir: "a\\0b"\n')
    checked = run_cli("check-config", str(path))
    ran = run_cli("run", "--config", str(path), timeout=30)
    assert checked.returncode == ran.returncode == 2, (checked.stderr, ran.stderr)
    assert "Traceback" not in checked.stderr + ran.stderr

    def lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("  - ")]

    assert lines(checked.stderr) == lines(ran.stderr) and len(lines(ran.stderr)) == 3


def test_check_config_of_a_latin1_file_is_two_lines_and_exit_2_in_a_real_process(tmp_path: Path) -> None:
    result = run_cli("check-config", str(write(tmp_path, b"listen: caf\xe9:80\n")))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 2, result.stderr
