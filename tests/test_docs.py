"""The docs, examples and messages tell the truth a user can act on.

* Every ``pip install`` line names this project's own distribution (``gpumon-exporter``), the
  checkout (``.``, ``'.[burn]'``), a path or a wheel: never another project's name.
* The docs speak of the project, never of internal work items ("issue 7").
* Every file a doc links to or cites exists.
* Measured figures live in docs/benchmarks.md (per-call NVML costs also in docs/nvml-notes.md);
  other pages link there instead of repeating them.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import tomllib

from tests.helpers import REPO

DISTRIBUTION = "gpumon-exporter"
"""This project on the package index. ``gpumon`` there is an unrelated project (a GPUtil wrapper)."""
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
INSTALL_SOURCES = [
    *DOCS,
    *sorted(p for p in (REPO / "deploy").rglob("*") if p.is_file()),
    *sorted((REPO / "gpumon").rglob("*.py")),
    *sorted((REPO / "scripts").glob("*")),
    REPO / "systemd" / "gpumon.service",
    REPO / "Makefile",
]
FIGURE_PAGES = {"benchmarks.md", "nvml-notes.md"}
_OPTIONS_WITH_VALUE = {"-t", "--target", "-d", "--dest", "-r", "--requirement", "-c", "--constraint", "--python",
                       "-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--prefix", "--root"}  # fmt: skip


def test_the_distribution_is_not_the_unrelated_gpumon_on_the_package_index() -> None:
    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"] == DISTRIBUTION


def requirements_in(line: str) -> list[str]:
    """What a ``pip install ...`` command on ``line`` asks for (options dropped)."""
    command = line.split("pip install", 1)[1]
    command = re.split(r"\s#|\s\(|&&|;|\||`|\)\s|\"\)", command)[0]
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in _OPTIONS_WITH_VALUE:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


def allowed(requirement: str) -> bool:
    if requirement.startswith((".", "/", "$", '"$')) or requirement.endswith(".whl"):
        return True  # the checkout, a path, a wheel, a variable holding one of those
    name = re.split(r"[\[=<>!~ ]", requirement, maxsplit=1)[0]
    if name == DISTRIBUTION:
        return True
    return name == "torch" and "==" in requirement  # the pinned CPU torch of the dev setup


def install_lines() -> list[tuple[str, int, str]]:
    out = []
    for path in INSTALL_SOURCES:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "pip install" in line:
                out.append((str(path.relative_to(REPO)), number, line))
    return out


def test_there_are_install_lines_to_check() -> None:
    assert len(install_lines()) >= 5


@pytest.mark.parametrize(("where", "number", "line"), install_lines(), ids=lambda v: str(v)[:40])
def test_every_install_line_names_the_projects_own_distribution(where: str, number: int, line: str) -> None:
    requirements = requirements_in(line)
    assert requirements, f"{where}:{number}: cannot tell what this installs: {line.strip()}"
    wrong = [r for r in requirements if not allowed(r)]
    assert not wrong, f"{where}:{number} tells users to install {wrong} (the project is {DISTRIBUTION}): {line}"


def test_docs_speak_of_the_project_not_of_work_items() -> None:
    for path in [*DOCS, *sorted(p for p in (REPO / "deploy").rglob("*") if p.is_file())]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = re.search(r"\bissues?\s*#?\d+|\b(first|second|third|last|previous) session\b", line, re.I)
            assert not found, f"{path.relative_to(REPO)}:{number} names a work item: {line.strip()}"


def test_docs_cite_only_files_the_project_has() -> None:
    for path in DOCS:
        text = path.read_text()
        assert "DESIGN.md" not in text, f"{path.name} cites DESIGN.md, which the project does not have"
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" in target:
                continue
            assert (path.parent / target).exists(), f"{path.name} links to {target}, which does not exist"


def _prose(text: str) -> str:
    """Text without fenced code blocks and inline code (config examples like `500ms` are not figures)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`]*`", "", text)


FIGURE = re.compile(r"(?<![\w/.])\d[\d.,]*\s?(?:ms|µs|ns|GB/s|TB/s|TFLOP/s)(?![\w/])")


@pytest.mark.parametrize("path", [p for p in DOCS if p.name not in FIGURE_PAGES], ids=lambda p: p.name)
def test_measured_figures_live_in_benchmarks_md(path: Path) -> None:
    figures = FIGURE.findall(_prose(path.read_text()))
    assert not figures, f"{path.name} states {figures}: put them in docs/benchmarks.md with the command, and link"


def test_benchmarks_md_gives_a_command_for_each_section() -> None:
    sections = re.split(r"^## ", (REPO / "docs" / "benchmarks.md").read_text(), flags=re.M)[1:]
    assert sections
    for section in sections:
        assert re.search(r"`(python3?|scripts/|make|git clone|time )", section), section.splitlines()[0]


_SKIP_RE = re.compile(r"(?:pytest\.skip|skipif|importorskip)\((?:[^()]|\([^()]*\))*?(?:reason=)?f?\"([^\"]+)\"", re.S)
SKIP_TOPICS = ("promtool", "amtool", "prometheus", "alertmanager", "systemd-analyze", "openssl", "root",
               "PR_SET_MDWE", "kubernetes", "gpu", "nvidia-smi", "nvml", "torch", "import-linter", "tmux")  # fmt: skip


def skip_reasons() -> list[tuple[str, str]]:
    out = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for reason in _SKIP_RE.findall(path.read_text()):
            out.append((str(path.relative_to(REPO)), reason))
    return out


def test_the_readme_says_what_make_test_may_skip_and_why() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme.split("What `make test` may skip", 1)[1].split("\n## ", 1)[0].lower()
    reasons = skip_reasons()
    assert len(reasons) >= 8
    for where, reason in reasons:
        topics = [t for t in SKIP_TOPICS if t.lower() in reason.lower()]
        assert topics, f"{where}: skip reason {reason!r} names no topic the README's skip table covers"
        assert any(t.lower() in section for t in topics), f"{where}: README does not explain the skip {reason!r}"
        for variable in re.findall(r"\$([A-Z][A-Z0-9_]+)", reason):  # a skip a variable lifts: the table names it
            assert variable.lower() in section, f"{where}: README's skip table does not name ${variable} ({reason!r})"


def test_no_doc_installs_gpumon_from_the_package_index_it_is_not_on() -> None:
    """gpumon-exporter is not on PyPI: an install line names the checkout ('.' or '.[burn]') instead."""
    for path in [REPO / "README.md", *DOCS]:
        found = re.findall(r"pip install[^`\n]*gpumon-exporter", path.read_text())
        assert not found, f"{path.name}: {found}"
