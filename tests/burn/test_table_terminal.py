"""The burn's verdict table in a real 80-column terminal (tmux): nothing cut, no test name split (issue 46.1)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import REPO, wait_for


def test_a_burn_with_every_test_fits_an_80_column_terminal(tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        pytest.fail("this test runs the burn in a real terminal: install tmux (Debian package tmux)")
    session = f"gpumon-burn-{uuid.uuid4().hex[:8]}"
    done = tmp_path / "done"
    three = tmp_path / "three.yaml"
    three.write_text("count: 3\n")
    command = (
        f"cd {REPO} && GPUMON_BURN_INJECT=sdc:1 {sys.executable} -m gpumon burn --device cpu --backend fake:{three} "
        f"--gpus all --quick --state-dir {tmp_path / 'state'}; echo $? > {done}"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "60", "bash", "-c", f"{command}; sleep 600"],
        check=True,
    )
    try:
        wait_for(done.exists, timeout=240, what="the burn to finish in tmux")
        screen = subprocess.run(
            ["tmux", "capture-pane", "-p", "-J", "-t", session, "-S", "-200"], capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    print(screen)
    assert done.read_text().strip() == "1"
    table = screen[screen.index("gpumon burn — verdict") : screen.index("burn: FAIL")]
    assert "…" not in table, table  # was: mod…, TF…, 0.… at 80 columns
    rows = [line for line in table.splitlines() if line.strip()[:2] in ("0 ", "1 ", "2 ")]
    assert any("PASS" in r for r in rows) and any("FAIL" in r and "fingerprint" in r for r in rows), rows
    words = set(table.replace(",", " ").split())
    assert {"fingerprint", "matmul"} <= words, table  # whole names, never split mid-word
