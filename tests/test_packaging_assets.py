"""What ``pip install gpumon-exporter`` brings is enough to deploy: the wheel and the sdist carry the
dashboards, Prometheus rules, systemd unit and deploy/ examples, and ``gpumon assets`` lists, prints
and writes them from the installed package; both carry the Apache-2.0 LICENSE that pyproject declares.

Built offline from a copy of the checkout's shipped files (setuptools of the test's environment).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from gpumon.commands.assets import PACKAGED_DIR, asset_files

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("gpumon", "dashboards", "prometheus", "systemd", "deploy")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist) built from a copy: an in-tree build would leave build/ behind."""
    src = tmp_path_factory.mktemp("src")
    for name in SHIPPED:
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "LICENSE", "setup.py", "MANIFEST.in"):
        shutil.copy(REPO / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    code = (
        "import sys; from setuptools import build_meta as b; "
        "out = sys.argv[1]; print(b.build_wheel(out)); print(b.build_sdist(out))"  # setuptools rewrites sys.argv
    )
    build = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300, cwd=src)
    assert build.returncode == 0, build.stdout + build.stderr
    [wheel] = out.glob("*.whl")
    sdists = list(out.glob("*.tar.gz"))
    assert len(sdists) == 1, sorted(out.iterdir())
    [sdist] = sdists
    return wheel, sdist


def test_there_are_assets_to_ship() -> None:
    names = set(asset_files(REPO))
    for expected in (
        "dashboards/gpumon-fleet.json",
        "prometheus/gpumon-alerts.rules.yml",
        "prometheus/gpumon-recording.rules.yml",
        "systemd/gpumon.service",
        "deploy/gpumon.example.yaml",
        "deploy/kubernetes/gpumon-daemonset.yaml",
        "deploy/federation/prometheus-global.example.yml",
        "prometheus/tests/alerts_test.yml",
        "LICENSE",
    ):
        assert expected in names
    assert not any(name.endswith(".py") for name in names), names


def test_every_deployment_file_of_the_checkout_is_an_asset() -> None:
    """Whatever deploy/, prometheus/ and systemd/ hold (a new folder too) ships, and every dashboard."""
    names = set(asset_files(REPO))
    files = [p for top in ("deploy", "prometheus", "systemd") for p in (REPO / top).rglob("*") if p.is_file()]
    files += list((REPO / "dashboards").glob("*.json"))
    missing = sorted(p.relative_to(REPO).as_posix() for p in files if "__pycache__" not in p.parts)
    assert [m for m in missing if m not in names] == []


def test_the_wheel_carries_every_asset_and_the_license(built: tuple[Path, Path]) -> None:
    wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        for name, path in asset_files(REPO).items():
            packaged = f"gpumon/{PACKAGED_DIR}/{name}"
            assert packaged in names, f"{packaged} missing from the wheel"
            assert zf.read(packaged) == path.read_bytes()
        licenses = [n for n in names if n.endswith("LICENSE") and ".dist-info/" in n]
        assert licenses, sorted(names)
        assert b"Apache License" in zf.read(licenses[0]) and b"Version 2.0" in zf.read(licenses[0])


def test_the_sdist_carries_every_asset_and_the_license(built: tuple[Path, Path]) -> None:
    _, sdist = built
    with tarfile.open(sdist) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    missing = [name for name in [*asset_files(REPO), "LICENSE", "setup.py"] if name not in names]
    assert not missing, missing


def test_gpumon_assets_lists_shows_and_writes_them_from_the_installed_wheel(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    wheel, _ = built
    venv.EnvBuilder(with_pip=False, clear=True).create(tmp_path / "v")
    python = tmp_path / "v" / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # the dependencies only, not the checkout
    gpumon = str(tmp_path / "v" / "bin" / "gpumon")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([gpumon, *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    listed = run("assets", "list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == list(asset_files(REPO))
    shown = run("assets", "show", "prometheus/gpumon-alerts.rules.yml")
    assert shown.returncode == 0 and shown.stdout == (REPO / "prometheus/gpumon-alerts.rules.yml").read_text()
    assert run("assets", "show", "no/such.yml").returncode == 2
    licence = run("assets", "show", "LICENSE")
    assert licence.returncode == 0 and "Apache License" in licence.stdout
    written = run("assets", "write", str(tmp_path / "out"))
    assert written.returncode == 0, written.stderr
    for name, path in asset_files(REPO).items():
        assert (tmp_path / "out" / name).read_bytes() == path.read_bytes()
    promtool = shutil.which("promtool")
    if promtool is not None:  # the rule tests run where they are written, beside the rules they test
        tests = sorted(str(p) for p in (tmp_path / "out" / "prometheus" / "tests").glob("*.yml"))
        done = subprocess.run([promtool, "test", "rules", *tests], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr


def test_write_leaves_a_changed_file_alone_unless_forced(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "gpumon", "assets", "write", str(tmp_path)]
    assert subprocess.run(command, capture_output=True, env=env, timeout=120).returncode == 0
    edited = tmp_path / "systemd" / "gpumon.service"
    edited.write_text("# mine\n")
    refused = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert refused.returncode == 2 and str(edited) in refused.stderr
    assert edited.read_text() == "# mine\n", "nothing lost"
    forced = subprocess.run([*command, "--force"], capture_output=True, env=env, timeout=120)
    assert forced.returncode == 0 and edited.read_bytes() == (REPO / "systemd/gpumon.service").read_bytes()
