"""Named fake-backend scenarios shipped with gpumon: ``--backend fake:NAME`` plays ``NAME.yaml`` here.

Each file is an ordinary scenario file (docs/scenarios.md); its first line is a comment that
describes it in one line (``gpumon scenarios`` lists them). What each one shows on /metrics and
in the alerts is documented in docs/scenarios.md, "Named scenarios", and tested.
"""

from __future__ import annotations

from pathlib import Path

SUFFIX = ".yaml"


def directory() -> Path:
    return Path(__file__).resolve().parent


def names() -> list[str]:
    """The named scenarios, sorted."""
    return sorted(p.name[: -len(SUFFIX)] for p in directory().glob("*" + SUFFIX))


def path_of(name: str) -> Path | None:
    """The file of the named scenario ``name``, or None when there is no such name."""
    return directory() / (name + SUFFIX) if name in names() else None


def description(name: str) -> str:
    """The one-line description: the scenario file's first line, without its ``#``."""
    path = path_of(name)
    if path is None:
        raise KeyError(name)
    first = path.read_text(encoding="utf-8").splitlines()[0]
    return first.lstrip("#").strip()
