"""Scenario files and ``gpumon burn --gpus``: bad input is a clear error and exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon import cli
from gpumon.backends.base import ScenarioError
from gpumon.backends.fake import FakeBackend
from gpumon.burn.command import build_options
from tests.helpers import run_cli


def once(scenario: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["once", "--backend", f"fake:{scenario}"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus:\n  - hang_seconds: abc\n", "gpus[0]: hang_seconds must be a number from 0 to 86400, got 'abc'"),
        ("count: abc\n", "count must be a whole number from 0 to 4096, got 'abc'"),
        ("gpus:\n  - raise_at_ticks: 5\n", "gpus[0]: raise_at_ticks must be a list of ticks"),
        ("gpus:\n  - unsupported: 5\n", "gpus[0]: unsupported must be a list of field names, got 5"),
        ("gpus:\n  - hang_seconds: .inf\n", "hang_seconds must be a number from 0 to 86400, got inf"),
        ("gpus:\n  - lost_at_tick: -1\n", "lost_at_tick must be a tick, a whole number from 0"),
        ("gpus:\n  - xid_events: [{tick: 1, xid: 79.9}]\n", "xid must be an XID code or a list of them"),
        ("gpus:\n  - xid_events: [{tick: x, xid: 79}]\n", "tick must be a whole number from 0"),
        ("gpus:\n  - values: {temperature_celsius: abc}\n", "values.temperature_celsius: must be a finite number"),
        ("gpus:\n  - values: {temperature_celsius: [40, .nan]}\n", "values.temperature_celsius[1]: must be a finite"),
        ("gpus:\n  - values: {clocks_hertz: {sm: fast}}\n", "values.clocks_hertz.sm: must be a finite number"),
        ("gpus:\n  - values: {processes: [{name: x}]}\n", "values.processes[0]: pid is required"),
        ("gpus:\n  - values: {processes: 5}\n", "values.processes: must be a list of mappings"),
        ("gpus:\n  - values: {nvlink_up: {'0': maybe}}\n", "values.nvlink_up.0: must be true or false"),
        ("nvml_missing_inits: many\ncount: 1\n", "nvml_missing_inits must be a whole number from 0 to 1000"),
        ("count: 99999\n", "count must be a whole number from 0 to 4096"),
        ("- a list\n", "the top level must be a mapping with gpus or count"),
    ],
)
def test_a_bad_scenario_is_a_usage_error_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    code, err = once(scenario, capsys)
    assert code == 2, err
    assert expected in err and "Traceback" not in err


def test_a_latin1_byte_in_a_scenario_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_bytes(b"gpus:\n  - uuid: GPU-caf\xe9\n")
    code, err = once(scenario, capsys)
    assert code == 2
    assert f"{scenario}: line 2, column 18: byte 0xE9 is not UTF-8" in err


def test_every_problem_of_a_scenario_is_listed_at_once(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "count: 2\nwhat: 1\ngpus:\n  - hang_seconds: abc\n    raise_at_ticks: 5\n    unsupported: 5\n"
        "    values: {temprature_celsius: 3, power_watts: hot}\n"
    )
    with pytest.raises(ScenarioError) as info:
        FakeBackend.from_file(scenario)
    assert len(info.value.problems) == 7, info.value.problems
    for needle in ("'what'", "count 2 does not match", "hang_seconds", "raise_at_ticks", "unsupported", "temprature"):
        assert any(needle in p for p in info.value.problems), needle


def test_the_documented_scenario_plays(tmp_path: Path) -> None:
    text = Path(__file__).resolve().parent.parent.joinpath("docs", "scenarios.md").read_text()
    scenario = tmp_path / "doc.yaml"
    scenario.write_text(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    backend = FakeBackend.from_file(scenario)
    assert backend.device_count() == 2 and backend.nvml_missing_inits == 2


def test_a_bad_scenario_in_a_real_process_is_exit_2_without_traceback(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("count: abc\ngpus:\n  - unsupported: 5\n")
    result = run_cli("once", "--backend", f"fake:{scenario}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "count must be a whole number" in result.stderr and "unsupported must be a list" in result.stderr


# ---- gpumon burn --gpus -------------------------------------------------------------------------
def burn_problems(*argv: str) -> list[str]:
    args = cli.build_parser().parse_args(["burn", "--device", "cpu", *argv])
    _options, backend, problems = build_options(args, {})
    if backend is not None:
        backend.shutdown()
    return problems


def test_gpus_with_thousands_of_digits_is_a_usage_error_not_an_internal_error() -> None:
    (problem,) = burn_problems("--gpus", "9" * 4301)
    assert problem.startswith("--gpus: '9999") and "(4301 characters) is not a GPU index from 0 to 4095" in problem


@pytest.mark.parametrize("gpus", ["0,,1", "0,1,", ",0", ","])
def test_gpus_with_an_empty_entry_is_a_usage_error(gpus: str) -> None:
    assert burn_problems("--gpus", gpus) == [f"--gpus: empty entry in {gpus!r} (use e.g. 0,1 or all)"]


def test_burn_gpus_in_a_real_process_exits_2_with_one_line(tmp_path: Path) -> None:
    result = run_cli("burn", "--device", "cpu", "--state-dir", str(tmp_path), "--gpus", "9" * 4301)
    assert result.returncode == 2, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_control_character_beside_a_gpu_index_is_a_problem() -> None:
    """Found by hypothesis in CI: str.strip() dropped '\\x1f', so '0\\x1f' passed as GPU 0."""
    from gpumon.burn.orchestration.options import parse_gpus

    _, problems = parse_gpus("0\x1f", 2)
    assert problems and "not a GPU index" in problems[0]
    assert parse_gpus(" 0,\t1 ", 2) == ((0, 1), [])
