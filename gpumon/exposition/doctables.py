"""The field tables of docs/nvml-notes.md and docs/dcgm-compat.md, generated from the field declarations.

``make docs`` (``python -m gpumon.exposition.doctables``) rewrites the text between ``<!-- generated: NAME ... -->``
and ``<!-- end generated -->`` in each page and leaves the prose around it alone; ``--check`` only
says which page differs (tests/test_fields.py fails when a checked-in page is not what this gives).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gpumon.exposition.dcgm_table import dcgm_fields
from gpumon.model.fields.spec import Dcgm
from gpumon.model.snapshot import GpuSnapshot, field_specs

REPO = Path(__file__).resolve().parents[2]


def _smi(text: str) -> str:
    if "`" in text or text.startswith("—"):
        return text
    if text.startswith("-q "):
        return f"`-q` {text[3:]}"
    return ", ".join(f"`{part}`" for part in text.split(", "))


def fields_table() -> str:
    """docs/nvml-notes.md: every field read from NVML, with its call, tier, conversion and nvidia-smi field."""
    lines = ["| field | NVML call | tier | conversion | nvidia-smi |", "|---|---|---|---|---|"]
    for name, spec in field_specs():
        if spec.nvml:
            lines.append(f"| `{name}` | {spec.nvml} | {spec.tier.value} | {spec.conversion} | {_smi(spec.smi)} |")
    return "\n".join(lines)


def _times(scale: float) -> str:
    if scale == 1:
        return ""
    if scale > 1:
        powers = {1e6: " × 10⁶", 1e9: " × 10⁹"}
        return powers.get(scale, f" × {scale:g}")
    inverse = round(1 / scale)
    return " / 10⁶" if inverse == 10**6 else f" / {inverse}"


def _source(field: str, twin: Dcgm, is_bool: bool) -> str:
    if twin.source:
        return twin.source if twin.source.startswith("the same") else f"`{twin.source}`"
    if twin.whole_mib:
        return f"`{field} / 2²⁰` (whole MiB)"
    of = field if twin.key is None else f"{field}[{twin.key}]"
    return f"`{of}{_times(twin.scale)}`" + (" (0/1)" if is_bool else "")


def dcgm_table() -> str:
    """docs/dcgm-compat.md: every DCGM_FI_* family, its type, unit and the field it is computed from."""
    kinds = {f.name: str(f.type) for f in dataclasses.fields(GpuSnapshot)}
    from gpumon.exposition.dcgm_sets import DCGM_SETS, V4_9

    new = DCGM_SETS[V4_9]

    def in_4_9(name: str) -> str:
        if name in new.dropped:
            return "— (DCGM's alias of the one above)"
        if (converted := new.converted.get(name)) is not None:
            return f"`{converted.name}` ({converted.unit})"
        renamed = new.same_unit.get(name)
        return "same" if renamed is None else f"`{renamed}`"

    rows = {
        twin.name: f"| `{twin.name}` | {twin.kind} | {twin.unit} | {_source(field, twin, kinds[field] == 'bool | None')}"
        f" | {in_4_9(twin.name)} |"
        for field, spec in field_specs()
        for twin in spec.dcgm
    }
    lines = ["| DCGM name (`dcgm`) | type | unit | from | `dcgm-4.9` name (unit when new) |", "|---|---|---|---|---|"]
    lines += [rows[f.name] for f in dcgm_fields()]
    lines.append(
        "| `DCGM_FI_DEV_XID_ERRORS` | gauge | XID code | code of the most recent XID (0 when none),"
        " labels `err_code`, `err_msg` | `DCGM_FI_DEV_XID_ERROR` |"
    )
    return "\n".join(lines)


PAGES: dict[str, tuple[str, Callable[[], str]]] = {
    "docs/nvml-notes.md": ("fields table", fields_table),
    "docs/dcgm-compat.md": ("DCGM name mapping", dcgm_table),
}


def render(text: str, name: str, table: str) -> str:
    """``text`` with the block between the markers of ``name`` replaced by ``table``."""
    pattern = re.compile(rf"(<!-- generated: {re.escape(name)}, `make docs` -->\n).*?(<!-- end generated -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"no '<!-- generated: {name}, `make docs` -->' ... '<!-- end generated -->' markers")
    return pattern.sub(lambda m: f"{m.group(1)}{table}\n{m.group(2)}", text, count=1)


def expected(root: Path = REPO) -> dict[Path, str]:
    """Each page as ``make docs`` would write it."""
    out = {}
    for page, (name, table) in PAGES.items():
        path = root / page
        out[path] = render(path.read_text(encoding="utf-8"), name, table())
    return out


def main(argv: Sequence[str] | None = None) -> int:
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    stale = []
    for path, text in expected().items():
        if path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not check:
                path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{path.relative_to(REPO)}: {'differs from `make docs`' if check else 'regenerated'}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
