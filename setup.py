"""The build also ships the deployment files (dashboards, Prometheus rules, systemd unit, deploy/
examples) inside the package, as gpumon/deploy_assets/ (``gpumon assets``); everything else is in
pyproject.toml."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _assets_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpumon_assets_for_build", ROOT / "gpumon" / "commands" / "assets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithAssets(build_py):
    """build_py, then the deployment files copied into the built package."""

    def run(self) -> None:
        super().run()
        assets = _assets_module()
        target = Path(self.build_lib) / "gpumon" / assets.PACKAGED_DIR
        for name, path in assets.asset_files(ROOT).items():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / name)


setup(cmdclass={"build_py": BuildPyWithAssets})
