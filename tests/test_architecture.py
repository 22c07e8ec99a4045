"""The shape of the code (docs/architecture.md): small modules with one job, each package saying its job.

* No module under gpumon/ is longer than ``MAX_MODULE_LINES``; a module that must be longer is
  listed in ``ALLOWED_LONGER`` with the reason.
* No function or method under gpumon/ is longer than ``MAX_FUNCTION_LINES`` (its def line, docstring
  and body: ``end_lineno - lineno + 1``); a longer one is split into a helper per step.
* Every package under gpumon/ has a docstring in its ``__init__.py`` that says what it is for.
* The import contracts of pyproject.toml (layers, independent features, who may import pynvml and
  torch) hold, with no exception: ``lint-imports`` (import-linter) passes.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpumon"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60

ALLOWED_LONGER: dict[str, str] = {}
"""Module (relative to gpumon/) -> why it may be longer than MAX_MODULE_LINES for good."""


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_longer_than_the_limit() -> None:
    allowed = ALLOWED_LONGER
    too_long = [
        f"gpumon/{p.relative_to(PACKAGE)}: {_lines(p)} lines"
        for p in _modules()
        if _lines(p) > MAX_MODULE_LINES and str(p.relative_to(PACKAGE)) not in allowed
    ]
    assert not too_long, (
        f"modules over {MAX_MODULE_LINES} lines; split them along a seam (one job per module) "
        "or list them in ALLOWED_LONGER with the reason:\n" + "\n".join(too_long)
    )


def test_every_exception_names_a_module_that_still_needs_it() -> None:
    for name in ALLOWED_LONGER:
        path = PACKAGE / name
        assert path.is_file(), f"gpumon/{name} is gone: remove it from ALLOWED_LONGER"
        assert _lines(path) > MAX_MODULE_LINES, f"gpumon/{name} fits in {MAX_MODULE_LINES} lines: remove the exception"


def _functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method of one module."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                found.append((prefix + child.name, child.end_lineno - child.lineno + 1))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return found


def test_no_function_is_longer_than_the_limit() -> None:
    too_long = [
        f"gpumon/{p.relative_to(PACKAGE)}: {name}, {lines} lines"
        for p in _modules()
        for name, lines in _functions(p)
        if lines > MAX_FUNCTION_LINES
    ]
    assert not too_long, (
        f"functions over {MAX_FUNCTION_LINES} lines; give each step a helper function of its own:\n"
        + "\n".join(too_long)
    )


def _packages() -> list[Path]:
    return sorted(p.parent for p in PACKAGE.rglob("__init__.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_every_package_says_its_job(package: Path) -> None:
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8")))
    assert docstring and docstring.strip(), f"{package.relative_to(PACKAGE.parent)}/__init__.py needs a docstring"
    summary = docstring.strip().split("\n\n")[0]
    assert len(summary.split()) >= 5, f"{package.relative_to(PACKAGE.parent)}: say the package's job in a sentence"


def _lint_imports() -> str | None:
    beside_python = Path(sys.executable).parent / "lint-imports"
    return str(beside_python) if beside_python.is_file() else shutil.which("lint-imports")


def test_the_import_contracts_hold() -> None:
    command = _lint_imports()
    if command is None:
        pytest.skip("lint-imports (import-linter, the test extra) is not installed: the import contracts are unchecked")
    root = PACKAGE.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [command, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    report = result.stdout[result.stdout.find("Contracts") :]  # after import-linter's banner
    assert result.returncode == 0, "lint-imports: an import breaks a contract of pyproject.toml\n" + report


def _tree_names() -> dict[str, set[str]]:
    """docs/architecture.md's folder tree: each package (relative to gpumon/, "" for the root) -> the
    file and folder names its lines give (a line may name several, "a.py, b.py"; "a.py … c.py" names a
    run of one-per-subsystem modules and counts as naming its package's other modules)."""
    import re

    text = (PACKAGE.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = text[text.index("## The folder tree") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    names: dict[str, set[str]] = {}
    stack: list[str] = []
    for line in block.splitlines()[1:]:  # the first line is gpumon/ itself
        m = re.match(r"^( +)(\S.*?)(?:\s{2,}|$)", line)
        if not m or len(m.group(1)) >= 20 or not re.match(r"[\w.]+/?[,…]?", m.group(2)):
            continue  # not a name line: a description carried on to the next line
        depth = len(m.group(1)) // 2 - 1
        if depth < 0:
            continue
        stack = stack[:depth]
        package = "/".join(stack)
        entries = re.findall(r"[\w.]+/?|…", m.group(2))
        names.setdefault(package, set()).update(entries)
        if len(entries) == 1 and entries[0].endswith("/"):
            stack.append(entries[0].rstrip("/"))
    return names


def test_the_architecture_docs_tree_is_the_tree() -> None:
    """Every module and package under gpumon/ has its line in docs/architecture.md's folder tree,
    and every name there exists: the tree a newcomer reads is the tree."""
    documented = _tree_names()
    missing, stale = [], []
    for path in sorted(PACKAGE.rglob("*")):
        if "__pycache__" in path.parts or path.name == "__init__.py" or path.name == "py.typed":
            continue
        if path.suffix not in (".py", ".yaml") and not path.is_dir():
            continue
        if path.parent.name == "scenarios":
            continue  # one YAML file per named scenario, listed by `gpumon scenarios`
        package = str(path.parent.relative_to(PACKAGE)).replace(".", "")
        names = documented.get(package, set())
        if path.name not in names and f"{path.name}/" not in names and "…" not in names:
            missing.append(f"gpumon/{path.relative_to(PACKAGE)}")
    for package, names in documented.items():
        for name in names - {"…"}:
            if not (PACKAGE / package / name.rstrip("/")).exists():
                stale.append(f"gpumon/{package}/{name}".replace("//", "/"))
    assert not missing, "not in docs/architecture.md's folder tree:\n" + "\n".join(missing)
    assert not stale, "named in docs/architecture.md's folder tree but gone:\n" + "\n".join(stale)
