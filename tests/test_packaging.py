"""A built wheel installs into a clean virtual environment and runs; the burn extra brings torch.

The wheel is built offline from this checkout (``pip wheel --no-build-isolation``, setuptools from
the test's own environment) and installed with ``--no-deps`` into a fresh venv; the runtime
dependencies come from the test environment's site-packages through PYTHONPATH (no network).
The commands run outside the checkout, so ``import gpumon`` can only find the installed wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Build from a copy: an in-tree build leaves build/ behind, whose stale files would leak into later wheels.
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(REPO / "gpumon", src / "gpumon", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out),
         str(src)],
        capture_output=True, text=True, timeout=300, cwd=out,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    wheels = list(out.glob("gpumon_exporter-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """(the venv's bin directory, environment to run it with)."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False, clear=True).create(root / "v")
    python = root / "v" / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=300, cwd=root,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMON_", "PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = sysconfig.get_paths()["purelib"]  # dependencies only: no .pth, so no editable gpumon
    yield root / "v" / "bin", env


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_installed_console_script_reports_its_version(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    bin_dir, env = installed
    result = run([str(bin_dir / "gpumon"), "--version"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("gpumon ")


def test_installed_package_is_the_wheel_not_the_checkout(
    installed: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = installed
    result = run([str(bin_dir / "python"), "-c", "import gpumon; print(gpumon.__file__)"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert str(bin_dir.parent) in result.stdout and str(REPO) not in result.stdout


def test_installed_gpumon_polls_the_fake_backend(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    bin_dir, env = installed
    result = run([str(bin_dir / "gpumon"), "once", "--backend", "fake", "--fake-gpus", "1", "--json"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"gpus"' in result.stdout and '"nvml_up": true' in result.stdout


def test_installed_gpumon_plays_a_named_scenario(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    bin_dir, env = installed
    result = run([str(bin_dir / "gpumon"), "once", "--backend", "fake:gpu-lost", "--json"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert '"nvml_up": true' in result.stdout


def test_wheel_carries_data_files_and_declares_the_burn_extra(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(metadata_name).decode())
        entry_points = zf.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    data_files = ("gpumon/py.typed", "gpumon/model/xid_catalog.yaml", "gpumon/alerts/builtin_rules.yaml")
    scenario_files = tuple(
        f"gpumon/backends/scenarios/{p.name}" for p in (REPO / "gpumon/backends/scenarios").glob("*.yaml")
    )
    assert len(scenario_files) >= 7
    for data_file in data_files + scenario_files:
        assert data_file in names, f"{data_file} missing from the wheel"
    assert not any(n.startswith("tests/") for n in names)
    assert "burn" in metadata.get_all("Provides-Extra", [])
    requires = metadata.get_all("Requires-Dist", [])
    assert any(r.startswith("torch") and 'extra == "burn"' in r for r in requires), requires
    torchless = [r for r in requires if "extra ==" not in r]
    assert not any(r.startswith("torch") for r in torchless), "torch must only come with the burn extra"
    assert "gpumon = gpumon.cli:main" in entry_points


# --- what `make run` and `make test` install ----------------------------------------------------------


def make_dry_run(target: str, tmp_path: Path) -> str:
    """The commands ``make TARGET`` would run on a fresh clone (nothing is run: ``make -n -B``)."""
    result = subprocess.run(
        ["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


LOCK = REPO / "requirements" / "lock.txt"


def locked() -> dict[str, str]:
    """requirements/lock.txt as name -> version (normalised names)."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        if line.strip() and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            assert version, f"the lock pins every package exactly: {line}"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_make_run_installs_only_what_the_daemon_needs_from_the_lock(tmp_path: Path) -> None:
    commands = make_dry_run("run", tmp_path)
    installs = [line for line in commands.splitlines() if "pip install" in line]
    assert installs == [f"{tmp_path / 'venv'}/bin/python -m pip install -q -e . -c requirements/lock.txt"], installs
    assert "torch" not in commands and "[test]" not in commands and "[burn]" not in commands
    assert "gpumon run --backend" in commands


def test_make_test_adds_the_test_extra_and_a_pinned_torch_from_the_lock(tmp_path: Path) -> None:
    commands = make_dry_run("setup", tmp_path)
    installs = [line for line in commands.splitlines() if "pip install" in line]
    assert installs and all(line.endswith(" -c requirements/lock.txt") for line in installs), installs
    assert any("-e '.[test]' -r requirements/torch-cpu.in" in line for line in installs), installs
    torch_in = [
        line for line in (REPO / "requirements" / "torch-cpu.in").read_text().splitlines() if line[:1].isalpha()
    ]
    assert len(torch_in) == 1 and re.fullmatch(r"torch==\d+\.\d+\.\d+", torch_in[0]), torch_in
    assert locked()["torch"].split("+")[0] == torch_in[0].split("==")[1]


def test_the_lock_pins_every_dependency_pyproject_names() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    names = {re.sub(r"[-_.]+", "-", re.split(r"[\[=<>!~ ;]", w, maxsplit=1)[0]).lower() for w in wanted}
    missing = sorted(names - set(locked()))
    assert not missing, f"run make lock: {missing} are not in requirements/lock.txt"
