"""Text from outside gpumon is shown as text (issue 42, items 14 and 15): a GPU model name, a process
name or a node name with rich markup, escape sequences or hyperlinks never styles, breaks or reaches
the terminal raw; and a name the locale cannot encode never fails the output."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from gpumon.burn.verdict import report
from gpumon.commands.table import print_snapshot
from tests.test_once_table import h100_host

REPO = Path(__file__).resolve().parent.parent
HOSTILE = ["[/]", "[bold red]x[/bold red]", "\x1b[2J\x1b[31mred", "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"]


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, force_terminal=True, color_system="truecolor"), out


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # rich's own colours


@pytest.mark.parametrize("name", HOSTILE)
def test_a_gpu_model_name_in_the_burn_table_is_text(name: str) -> None:
    built = {
        "gpus": [{"node": "n1", "gpu": 0, "model": "NVIDIA H200" + name, "tests": {"matmul": True}},
                 {"node": "n2" + name, "gpu": 0, "model": "NVIDIA H200", "tests": {"matmul": True}}],
        "faults": [], "could_not_run": [], "exit_code": 0, "duration_seconds": 1.0,
    }  # fmt: skip
    console, out = terminal()
    report.render(built, console, ("matmul",))
    text = out.getvalue()
    assert "\x1b]8" not in text and "\x1b[2J" not in text
    assert plain(text).count(name.replace("\x1b", "\\x1b")) == 2, plain(text)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_gpu_and_a_process_name_in_the_once_table_are_text(name: str) -> None:
    snapshot = h100_host(names=("NVIDIA H100" + name,) * 2)
    gpus = tuple(
        dataclasses.replace(g, processes=tuple(dataclasses.replace(p, name="train" + name) for p in g.processes or ()))
        for g in snapshot.gpus
    )
    for wide in (False, True):
        console, out = terminal()
        print_snapshot(dataclasses.replace(snapshot, gpus=gpus), console, wide=wide)
        text = out.getvalue()
        assert "\x1b]8" not in text and "\x1b[2J" not in text
        assert name.replace("\x1b", "\\x1b") in plain(text).replace("\n", ""), plain(text)


SCENARIO = """\
count: 1
gpus:
  - values:
      processes: [{pid: 4242, used_memory_bytes: 1073741824, name: "训练-🚀", user: "zoë"}]
"""


@pytest.mark.parametrize("encoding", ["latin-1", "ascii"])
@pytest.mark.parametrize("json_out", [False, True])
def test_output_never_fails_on_the_locale(encoding: str, json_out: bool, tmp_path: Path) -> None:
    """PYTHONIOENCODING gives Python the encoding a Latin-1 (or ASCII) locale would."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    env.update({"PYTHONPATH": str(REPO), "PYTHONIOENCODING": encoding})
    for args in (("once", "--backend", f"fake:{scenario}", *(("--json",) if json_out else ())),
                 ("health", "--backend", "fake:overheating", "--state-dir", str(tmp_path / "st")),
                 ("scenarios",)):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "gpumon", *args], capture_output=True, timeout=120, env=env)
        assert b"Traceback" not in done.stderr and b"UnicodeEncodeError" not in done.stderr, done.stderr.decode()
        assert done.returncode in (0, 1), done.stderr.decode()
        if args[0] == "once" and not json_out:
            assert b"\\u8bad\\u7ec3" in done.stdout, done.stdout
