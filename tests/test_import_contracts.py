"""The import contracts of pyproject.toml refuse what they promise to (docs/architecture.md, "What may import what").

Each case adds one import to a scratch copy of gpumon and runs ``lint-imports`` on it: the contract
named must then fail. The cases are the imports a review found passing when the pynvml and torch
contracts listed forbidden modules one by one (a new module under ``backends/``, ``backends/__init__``,
the top-level modules, a new top-level module), and the rule that a scrape never calls NVML: the
exposition and the HTTP server may import neither a backend nor the poller; and the burn is a feature:
alerts, health, the exposition and the HTTP server read its files through ``gpumon.state``, never
``gpumon.burn``. The untouched copy
passes every contract, so a failure is the added import's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

MODULE_LEVEL = "import {module}\n"
FUNCTION_LEVEL = "\n\ndef _scratch() -> None:\n    import {module}\n"
TYPE_CHECKING_ONLY = "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    import {module}\n"

# (the contract's id in pyproject.toml, the file the import is added to (created when new), the import)
BAD_IMPORTS: list[tuple[str, str, str]] = [
    ("pynvml", "gpumon/backends/__init__.py", MODULE_LEVEL.format(module="pynvml")),
    ("pynvml", "gpumon/backends/new_backend.py", MODULE_LEVEL.format(module="pynvml")),
    ("pynvml", "gpumon/backends/scenarios/__init__.py", FUNCTION_LEVEL.format(module="pynvml")),
    ("pynvml", "gpumon/systemd_notify.py", MODULE_LEVEL.format(module="pynvml")),
    ("pynvml", "gpumon/process_memory.py", FUNCTION_LEVEL.format(module="pynvml")),
    ("pynvml", "gpumon/early_hangup.py", MODULE_LEVEL.format(module="pynvml")),
    ("pynvml", "gpumon/__main__.py", TYPE_CHECKING_ONLY.format(module="pynvml")),
    ("pynvml", "gpumon/new_module.py", MODULE_LEVEL.format(module="pynvml")),
    ("torch", "gpumon/systemd_notify.py", MODULE_LEVEL.format(module="torch")),
    ("torch", "gpumon/process_memory.py", MODULE_LEVEL.format(module="torch")),
    ("torch", "gpumon/early_hangup.py", FUNCTION_LEVEL.format(module="torch")),
    ("torch", "gpumon/__main__.py", MODULE_LEVEL.format(module="torch")),
    ("torch", "gpumon/new_module.py", MODULE_LEVEL.format(module="torch.cuda")),
    ("scrape-never-reads", "gpumon/exposition/text.py", "from gpumon.backends.base import GpuBackend\n"),
    ("scrape-never-reads", "gpumon/exposition/collector.py", FUNCTION_LEVEL.format(module="gpumon.collect.poller")),
    ("scrape-never-reads", "gpumon/http/server.py", "from gpumon.collect.poller import Poller\n"),
    ("scrape-never-reads", "gpumon/http/messages.py", TYPE_CHECKING_ONLY.format(module="gpumon.backends.nvml")),
    ("scrape-never-reads", "gpumon/http/new_route.py", "from gpumon.collect.scheduling import PollJob\n"),
    ("burn-is-a-feature", "gpumon/alerts/engine.py", "from gpumon.burn.verdict.errors import EXIT_USAGE\n"),
    ("burn-is-a-feature", "gpumon/health/service.py", FUNCTION_LEVEL.format(module="gpumon.burn.command")),
    ("burn-is-a-feature", "gpumon/exposition/burn_results.py", TYPE_CHECKING_ONLY.format(module="gpumon.burn")),
    ("burn-is-a-feature", "gpumon/http/new_route.py", "import gpumon.burn.orchestration.options\n"),
]


def _lint_imports() -> str:
    beside_python = Path(sys.executable).parent / "lint-imports"
    found = str(beside_python) if beside_python.is_file() else shutil.which("lint-imports")
    if found is None:
        pytest.skip("lint-imports (import-linter, the test extra) is not installed")
    return found


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpumon and pyproject.toml as they are, copied once."""
    copy = tmp_path_factory.mktemp("pristine")
    shutil.copytree(ROOT / "gpumon", copy / "gpumon", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def _run(root: Path, *contract: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on the copy at ``root`` (only the contracts with these ids, when given)."""
    args = [_lint_imports(), "--no-cache"] + [a for c in contract for a in ("--contract", c)]
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's gpumon, not the checkout's
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_untouched_copy_keeps_every_contract(pristine: Path) -> None:
    result = _run(pristine)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("contract", "path", "line"), BAD_IMPORTS, ids=[f"{c}:{p}" for c, p, _ in BAD_IMPORTS])
def test_a_bad_import_breaks_its_contract(pristine: Path, tmp_path: Path, contract: str, path: str, line: str) -> None:
    scratch = tmp_path / "scratch"
    shutil.copytree(pristine, scratch)
    target = scratch / path
    before = target.read_text(encoding="utf-8") if target.exists() else '"""A module added by the test."""\n'
    target.write_text(before + line, encoding="utf-8")
    result = _run(scratch, contract)
    assert result.returncode != 0, f"lint-imports let {line.strip()!r} in {path} through contract {contract!r}"
    importer = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert importer in result.stdout, result.stdout + result.stderr  # the report names the importer
