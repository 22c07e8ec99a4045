"""Names from outside reach the operator's terminal as text (issue 36, item 5).

Any unprivileged user names their own processes. ``gpumon once`` shows a process named ``[/]``
without crashing, shows rich markup in a name as the characters typed, and never writes an ANSI
escape sequence (or any other control character) from a name to the terminal."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

HOSTILE = {
    "closing tag": "[/]",
    "markup": "[bold red]root[/bold red]",
    "link": "[link=http://evil]x[/link]",
    "escape sequence": "\x1b[2J\x1b]0;pwned\x07evil",
    "bidi override": "abc\u202edcba",
    "backspace": "rm\x08\x08ok",
    "newline": "two\nlines",
}


def _once(tmp_path: Path, names: list[str], gpu_name: str = "H100") -> subprocess.CompletedProcess[bytes]:
    scenario = tmp_path / "scenario.yaml"
    processes = [{"pid": 4_000_000 + i, "used_memory_bytes": 1 << 30, "name": n} for i, n in enumerate(names)]
    gpus = [{"values": {"name": gpu_name, "processes": processes}}]
    scenario.write_text(json.dumps({"gpus": gpus}))  # JSON is YAML
    return subprocess.run(
        [sys.executable, "-m", "gpumon", "once", "--backend", f"fake:{scenario}"],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
        env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "200", "FORCE_COLOR": "1"},
    )


@pytest.mark.parametrize("name", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_process_name_is_shown_as_text(tmp_path: Path, name: str) -> None:
    done = _once(tmp_path, [name, "python3"])
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    out = done.stdout.decode()
    assert "python3" in out, out  # the table was printed, every process in it
    # the only control characters written are rich's own colour sequences and the table's newlines
    plain = _without_colour(out)
    assert not any((c < " " and c != "\n") or c == "\x7f" or "\u202a" <= c <= "\u202e" for c in plain), repr(plain)
    if "[" in name and name.isprintable():
        assert name in plain.replace("\n", ""), plain  # the markup's characters, as typed


def test_a_hostile_gpu_name_is_shown_as_text(tmp_path: Path) -> None:
    done = _once(tmp_path, ["python3"], gpu_name="[/]\x1b]0;title\x07H100")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    plain = _without_colour(done.stdout.decode())
    assert "[/]" in plain and "\x1b" not in plain


def _without_colour(out: str) -> str:
    """``out`` less the SGR colour sequences (ESC [ digits ; m) rich writes itself."""
    return re.sub("\x1b\\[[0-9;]*m", "", out)
