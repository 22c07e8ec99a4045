"""docs/architecture.md names only paths that exist: every file, folder and module it names, not only
its folder tree (``tests/test_architecture.py`` checks the tree both ways).

A name in backticks that looks like a path (``gpumon/daemon.py``, ``alerts/config.py``,
``core.py``, ``model/fields/``, ``tests/fake_pynvml.py``, ``gpumon.state.burn_marker``) must exist: as
written from the checkout's root or from gpumon/, as the tail of a path under gpumon/ (``nvml/ecc.py``)
or, for a bare file name, somewhere in the checkout. A link to another page must reach a file.
The few names of other projects' files, or of files gpumon writes at run time, are listed in
``NOT_IN_THIS_CHECKOUT``, each with where it is.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
PATH_LIKE = re.compile(r"^[\w./-]*\w(\.(py|yaml|yml|md|txt|csv|json|toml)|/)$")
MODULE_LIKE = re.compile(r"^gpumon(\.\w+)+$")
SKIPPED_PARTS = {".git", ".venv", "__pycache__", "node_modules", ".dev"}

NOT_IN_THIS_CHECKOUT: dict[str, str] = {
    "collector/": "node_exporter's folder of collectors",
    "etc/default-counters.csv": "dcgm-exporter's metric list",
    "nvitop/api/libnvml.py": "nvitop's NVML wrapper",
    "last.json": "written by gpumon burn under the state directory",
    "NAME.yaml": "a placeholder for a named scenario's file",
}


def _named() -> set[str]:
    text = PAGE.read_text(encoding="utf-8")
    return {t for t in re.findall(r"`([^`\s]+)`", text) if PATH_LIKE.match(t) or MODULE_LIKE.match(t)}


def _checkout_names() -> tuple[set[str], list[Path]]:
    """Every file and folder name in the checkout, and gpumon/'s paths."""
    names: set[str] = set()
    for path in ROOT.rglob("*"):
        if not SKIPPED_PARTS.intersection(path.relative_to(ROOT).parts):
            names.add(path.name)
    package = [p for p in (ROOT / "gpumon").rglob("*") if "__pycache__" not in p.parts]
    return names, package


def _exists(name: str, names: set[str], package: list[Path]) -> bool:
    if MODULE_LIKE.match(name):
        as_path = ROOT / name.replace(".", "/")
        return as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file()
    path = name.rstrip("/")
    if (ROOT / path).exists() or (ROOT / "gpumon" / path).exists():
        return True
    if "/" in path:  # a path within a package: nvml/ecc.py, fields/gpm.py, alerts/config.py
        return any(p.as_posix().endswith("/" + path) for p in package)
    return path in names


def test_every_path_the_architecture_page_names_exists() -> None:
    names, package = _checkout_names()
    gone = sorted(n for n in _named() - set(NOT_IN_THIS_CHECKOUT) if not _exists(n, names, package))
    assert not gone, "docs/architecture.md names paths that do not exist:\n" + "\n".join(gone)


def test_every_exception_is_still_named() -> None:
    named = _named()
    assert not set(NOT_IN_THIS_CHECKOUT) - named, "no longer named on the page: drop them from NOT_IN_THIS_CHECKOUT"


def test_every_link_of_the_page_reaches_a_file() -> None:
    text = PAGE.read_text(encoding="utf-8")
    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)]
    broken = [t for t in targets if t and "://" not in t and not (PAGE.parent / t).exists()]
    assert not broken, "docs/architecture.md links to files that do not exist:\n" + "\n".join(broken)
