"""Where ``--compat dcgm-4.9``'s names come from: NVIDIA's own DCGM 4.6.1 field header.

tests/data/dcgm/dcgm-4.6.1-fields-excerpt.txt holds the lines of that header these names rest on (its
first lines say from which repository and commit). A 4.9 name is *confirmed* when the header defines
it as a current field (``#define NAME <id>``) and the legacy name gpumon maps to it is either its
deprecated alias (``#define OLD NAME``: the same field, the same unit) or, for a new unit, a field of
its own whose note says ``Deprecated: Use NAME instead``. The other new-unit names are DCGM 4.7's,
which no NVIDIA file at hand has: they are listed here as unchecked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpumon.exposition.dcgm_sets import CONVERTED_4_9, DCGM_SETS, LABEL_FIELDS, SAME_UNIT_4_9, V4_9
from tests.helpers import DATA

HEADER = DATA / "dcgm" / "dcgm-4.6.1-fields-excerpt.txt"

UNCHECKED_IN_DCGM_4_6_1 = {
    "DCGM_FI_DEV_GPU_UTIL": "GPU_UTIL_RATIO is field 203 itself there (GPU_UTIL's alias, NVML percent)",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "no ratio field in 4.6.1",
    "DCGM_FI_DEV_ENC_UTIL": "no ratio field in 4.6.1",
    "DCGM_FI_DEV_DEC_UTIL": "no ratio field in 4.6.1",
    "DCGM_FI_DEV_FB_TOTAL": "no bytes field in 4.6.1",
    "DCGM_FI_DEV_FB_FREE": "no bytes field in 4.6.1",
    "DCGM_FI_DEV_FB_USED": "no bytes field in 4.6.1",
    "DCGM_FI_DEV_FB_RESERVED": "no bytes field in 4.6.1",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "4.6.1 has only its alias NVLINK_THROUGHPUT_TOTAL, field 449",
}
"""Legacy names whose 4.9 name and unit follow DCGM 4.7's field reference, not an NVIDIA file here."""

UNIT_WORDS = {"hertz": "Hz", "joules": "J"}
"""How the header's notes name the units of dcgm-exporter's help texts."""


@dataclass(frozen=True)
class FieldHeader:
    """What the header's lines say: current fields, deprecated aliases and each field's note."""

    ids: dict[str, int]
    """Current field name -> field id (``#define NAME <id>``)."""
    aliases: dict[str, str]
    """Deprecated name -> the current name it stands for (``#define OLD NEW``)."""
    notes: dict[str, str]
    """Field name -> the text of the doc comment just above its ``#define``."""


def read_header(path: Path) -> FieldHeader:
    ids: dict[str, int] = {}
    aliases: dict[str, str] = {}
    notes: dict[str, str] = {}
    comment: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("//"):
            continue
        define = re.match(r"#define (DCGM_FI_\w+)\s+(\w+)", line)
        if define is None:
            comment.append(line.strip(" /*"))
            continue
        name, value = define.groups()
        if value.isdigit():
            ids[name] = int(value)
        else:
            aliases[name] = value
        notes[name] = " ".join(part for part in comment if part)
        comment = []
    return FieldHeader(ids, aliases, notes)


def new_unit_fields(header: FieldHeader) -> set[str]:
    """The legacy names whose 4.9 name is a field of its own that the legacy field's note points to."""
    return {
        old
        for old, converted in CONVERTED_4_9.items()
        if converted.name in header.ids
        and header.ids[converted.name] != header.ids.get(old)
        and f"Deprecated: Use {converted.name} instead." in header.notes.get(old, "")
    }


def test_each_same_unit_rename_is_the_deprecated_alias_of_a_current_dcgm_field() -> None:
    header = read_header(HEADER)
    assert {old: header.aliases.get(old) for old in SAME_UNIT_4_9} == dict(SAME_UNIT_4_9)
    assert [new for new in SAME_UNIT_4_9.values() if new not in header.ids] == []


def test_the_4_9_label_names_are_current_fields_and_the_old_ones_their_aliases() -> None:
    header = read_header(HEADER)
    renamed = {"DCGM_FI_DRIVER_VERSION": DCGM_SETS[V4_9].driver_label}
    renamed |= {label.legacy: label.renamed for label in LABEL_FIELDS.values() if label.legacy != label.renamed}
    assert {old: header.aliases.get(old) for old in renamed} == renamed
    kept = [label.legacy for label in LABEL_FIELDS.values() if label.legacy == label.renamed]
    assert [name for name in [*renamed.values(), *kept] if name not in header.ids] == []


def test_the_name_left_out_of_4_9_is_a_deprecated_alias_of_another_field() -> None:
    header = read_header(HEADER)
    for name in DCGM_SETS[V4_9].dropped:
        assert header.aliases.get(name) in header.ids


def test_dcgm_4_6_1_has_the_hertz_and_joule_fields_with_the_units_the_4_9_set_serves() -> None:
    header = read_header(HEADER)
    confirmed = new_unit_fields(header)
    assert confirmed == {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}
    for old in confirmed:
        converted = CONVERTED_4_9[old]
        units = [unit for word, unit in UNIT_WORDS.items() if f" in {word}" in header.notes[converted.name]]
        assert units == [converted.unit], converted.name


def test_every_other_new_unit_name_is_marked_unchecked() -> None:
    header = read_header(HEADER)
    assert set(CONVERTED_4_9) - new_unit_fields(header) == set(UNCHECKED_IN_DCGM_4_6_1)


def test_in_dcgm_4_6_1_gpu_util_ratio_is_gpu_utils_own_field() -> None:
    header = read_header(HEADER)
    assert header.aliases["DCGM_FI_DEV_GPU_UTIL"] == "DCGM_FI_DEV_GPU_UTIL_RATIO"
    assert header.ids["DCGM_FI_DEV_GPU_UTIL_RATIO"] == 203
