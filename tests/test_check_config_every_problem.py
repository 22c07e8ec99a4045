"""``gpumon check-config`` lists every problem of a file at once, each with the line and column of the
setting it is about (docs/install.md): a key given twice does not hide the others, and a value out of
its range says where it is."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.config.positions import with_positions
from tests.helpers import run_cli

BAD = """\
listen: "0.0.0.0:10480"
interval_seconds: 0.001
log_level: loud
listen: "0.0.0.0:10481"
bogus: 1
exporter:
  compat: [dcgm, nope]
  processez: true
health:
  nothing: 1
"""


def problems_of(tmp_path: Path, text: str) -> list[str]:
    config = tmp_path / "gpumon.yaml"
    config.write_text(text)
    result = run_cli("check-config", str(config))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = [line.removeprefix("  - ") for line in result.stderr.splitlines() if line.startswith("  - ")]
    return [line.removeprefix(f"{config}: ") for line in lines]


def test_a_key_given_twice_does_not_hide_the_other_problems(tmp_path: Path) -> None:
    problems = problems_of(tmp_path, BAD)
    expected = {
        "listen": "line 4, column 1:",
        "bogus": "line 5, column 1:",
        "interval_seconds": "line 2, column 19:",
        "log_level": "line 3, column 12:",
        "nope": "line 7,",
        "processez": "line 8, column 3:",
        "nothing": "line 10, column 3:",
    }
    for word, where in expected.items():
        [line] = [p for p in problems if word in p]
        assert line.startswith(where), (word, line)
    assert len(problems) == len(expected), problems


def test_every_problem_about_a_setting_in_the_file_says_where(tmp_path: Path) -> None:
    for problem in problems_of(tmp_path, BAD):
        assert re.match(r"line \d+, column \d+: ", problem), problem


def test_a_value_out_of_range_in_a_section_says_where(tmp_path: Path) -> None:
    text = "interval_seconds: 1\nslow_interval_seconds: 999999\n"
    [problem] = problems_of(tmp_path, text)
    assert problem.startswith("line 2, column 24: slow_interval_seconds"), problem


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.dictionaries(st.text(max_size=6), st.integers(), max_size=4))
def test_placing_any_problem_in_any_file_ends_and_keeps_the_problem(problem: str, doc: dict[str, int]) -> None:
    text = yaml.safe_dump(doc)
    [placed] = with_positions([f"f.yaml: {problem}"], "f.yaml", text)
    assert placed.startswith("f.yaml: ") and placed.endswith(problem)
