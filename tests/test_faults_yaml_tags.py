"""YAML explicit tags on values they cannot build (``!!bool maybe``, ``!!int ''``) are one problem
line and exit 2 in check-config, run and once, never a traceback (issue 36, item 4).

The generated configs of tests/test_property_inputs.py are reused here with every YAML tag put on
every kind of scalar, and passed through the same three gates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import free_port
from tests.test_property_inputs import CONFIG_KEYS, VALID_CONFIG, _dump, assert_one_gate, cases, documents

pytestmark = pytest.mark.faults

TAGS = [
    "!!bool",
    "!!int",
    "!!float",
    "!!null",
    "!!str",
    "!!binary",
    "!!timestamp",
    "!!set",
    "!!map",
    "!!omap",
    "!!pairs",
    "!!seq",
    "!!merge",
    "!!value",
    "!!yaml",
    "!",
    "!local",
    "!!python/none",
    "!<tag:yaml.org,2002:int>",
]
TAGGED_VALUES = [
    "''",
    '""',
    "maybe",
    "-",
    "+",
    "0x",
    "0b",
    "_",
    ":",
    "1:",
    ".",
    "e",
    "x",
    "[1]",
    "[x]",
    "[[1]]",
    "[{}]",
    "{}",
    "{a: 1}",
    "~",
    "1",
    "yes",
    "2024-13-45",
]
ONE_LINERS = ["a: !!bool maybe", "a: !!int ''", "a: !!float ''", "!!int ''", "a: !!bool ''", "a: !!int '-'"]


def _gpumon(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


@pytest.mark.parametrize("line", ONE_LINERS)
def test_a_tag_on_a_value_it_cannot_build_is_one_line_and_exit_2_in_every_command(tmp_path: Path, line: str) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text(line + "\n")
    for args in (
        ("check-config", str(config)),
        ("once", "--config", str(config), "--backend", "fake"),
        ("run", "--config", str(config), "--backend", "fake", "--listen", f"127.0.0.1:{free_port()}"),
    ):
        done = _gpumon(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        problems = [x for x in done.stderr.splitlines() if x.startswith("  - ")]
        assert len(problems) == 1 and str(config) in problems[0], done.stderr


@cases(600)
@given(
    doc=documents(VALID_CONFIG),
    key=st.sampled_from([*CONFIG_KEYS[:12], "alerting", "unknown"]),
    tag=st.sampled_from(TAGS),
    tagged=st.sampled_from(TAGGED_VALUES),
    where=st.sampled_from(["append", "nested", "top"]),
)
def test_any_config_with_any_tag_on_any_value_passes_all_three_gates_alike(
    tmp_path_factory: pytest.TempPathFactory, doc: object, key: str, tag: str, tagged: str, where: str
) -> None:
    text = _dump(doc)
    snippet = f"{tag} {tagged}"
    if where == "append":
        text += f"\n{key}: {snippet}\n"
    elif where == "nested":
        text += f"\n{key}:\n  inner: [{snippet}]\n"
    else:
        text = snippet + "\n"
    path = tmp_path_factory.getbasetemp() / "tagged.yaml"
    path.write_text(text)
    assert_one_gate(path)
