"""Every path a config names is checked the same way by check-config and by run (issue 42, item 4).

``health.boot_id_path: /dev/zero`` crashed ``gpumon run``; a FIFO there hung ``run``, ``gpumon health`` and
the Slurm prolog for over 60 s; both passed check-config. Now a file setting must name a regular file of
a sane size and a folder setting a folder, or check-config lists it (exit 2) and ``run`` refuses to start
with the same line; ``gpumon health`` cannot judge (UNKNOWN) instead of hanging. A file swapped after
the check is still read only as a regular file of bounded size."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumon.health.health_files import read_boot_id
from tests.helpers import run_cli

pytestmark = pytest.mark.faults


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def a_folder(tmp_path: Path) -> Path:
    path = tmp_path / "folder"
    path.mkdir()
    return path


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "file"
    path.write_text("x\n")
    return path


BAD: dict[str, Callable[[Path], Path]] = {
    "fifo": fifo,
    "dev-zero": lambda _tmp: Path("/dev/zero"),
    "folder": a_folder,
}

SETTINGS: dict[str, tuple[str, str]] = {
    "health.boot_id_path": ("health:\n  boot_id_path: {path}\n", "file"),
    "health.slurm.slurm_conf": ("health:\n  slurm:\n    slurm_conf: {path}\n", "file"),
    "ca_file": (
        "alerting:\n  webhooks:\n    - url: https://hooks.example:8443/x\n      ca_file: {path}\n",
        "file",
    ),
    "bearer_token_file": (
        "alerting:\n  webhooks:\n    - url: https://hooks.example:8443/x\n      bearer_token_file: {path}\n",
        "file",
    ),
    "health.sysfs_root": ("health:\n  sysfs_root: {path}\n", "folder"),
    "state_dir": ("state_dir: {path}\n", "folder"),
}


WRONG_KINDS = [
    (setting, bad)
    for setting, (_text, kind) in sorted(SETTINGS.items())
    for bad in ("fifo", "dev-zero", "folder", "file")
    if bad != kind
]


@pytest.mark.parametrize(("setting", "bad"), WRONG_KINDS)
def test_check_config_and_run_refuse_a_path_setting_that_names_the_wrong_kind_of_file(
    tmp_path: Path, setting: str, bad: str
) -> None:
    text, _kind = SETTINGS[setting]
    path = a_file(tmp_path) if bad == "file" else BAD[bad](tmp_path)
    config = tmp_path / "gpumon.yaml"
    config.write_text(text.format(path=path))
    checked = run_cli("check-config", str(config), timeout=30)
    assert checked.returncode == 2, checked.stdout + checked.stderr
    line = next(line for line in checked.stderr.splitlines() if setting in line and str(path) in line)
    run = run_cli("run", "--config", str(config), "--backend", "fake", "--listen", "127.0.0.1:0", timeout=30)
    assert run.returncode == 2 and line.strip() in run.stderr, run.stderr


def test_gpumon_health_with_a_fifo_as_boot_id_path_is_unknown_at_once(tmp_path: Path) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"health:\n  boot_id_path: {fifo(tmp_path)}\n")
    done = run_cli(
        "health",
        "--config",
        str(config),
        "--local",
        "--backend",
        "fake",
        "--state-dir",
        str(tmp_path / "s"),
        timeout=30,
    )
    assert done.returncode == 3 and "UNKNOWN" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("bad", ["fifo", "dev-zero", "folder"])
def test_a_boot_id_swapped_after_the_check_is_no_boot_id(tmp_path: Path, bad: str) -> None:
    assert read_boot_id(BAD[bad](tmp_path)) is None


def test_the_kernels_boot_id_is_read() -> None:
    boot_id = read_boot_id(Path("/proc/sys/kernel/random/boot_id"))
    assert boot_id is not None and len(boot_id) == 36
