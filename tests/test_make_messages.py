"""``make test`` as root says which Debian packages it is about to install, and how to skip that,
before apt-get runs; ``APT=no`` installs none (issue 46, item 8). A stand-in apt-get records its
calls: nothing is installed by this test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None or os.geteuid() != 0, reason="needs make and root (as make test's installs)")


def make_test_deps(tmp_path: Path, *args: str) -> tuple[str, list[str]]:
    """``make test-deps`` with a PATH where no test tool is found and apt-get is a stand-in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-calls"
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"apt-get $*\" >> {calls}\necho apt-get ran\n")
    (bin_dir / "apt-get").chmod(0o755)
    for tool in ("id", "sh"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    assert MAKE is not None
    done = subprocess.run([MAKE, "--no-print-directory", "-C", str(REPO), "test-deps", *args],
                          capture_output=True, text=True, timeout=60, env={"PATH": str(bin_dir)})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, calls.read_text().splitlines() if calls.exists() else []


def test_as_root_it_says_what_it_installs_and_how_to_skip_before_apt_get_runs(tmp_path: Path) -> None:
    out, calls = make_test_deps(tmp_path)
    assert any(call.startswith("apt-get install") and "prometheus" in call for call in calls), calls
    said = out.index("installing Debian packages")
    assert said < out.index("apt-get ran"), out
    assert "APT=no" in out[: out.index("apt-get ran")], out


def test_apt_no_installs_nothing_and_says_the_tests_skip(tmp_path: Path) -> None:
    out, calls = make_test_deps(tmp_path, "APT=no")
    assert calls == [] and "skipped" in out, out
