"""Families a scrape builds anew that hold what the scrape before gave: the earlier objects are
served instead, so their text, rendered once, is reused (a Family keeps its own text)."""

from __future__ import annotations

from gpumon.model.families import Family


def same_text(a: Family, b: Family) -> bool:
    """Whether two families render to the same text."""
    return (
        a.samples == b.samples
        and a.name == b.name
        and a.kind == b.kind
        and a.help == b.help
        and a.label_names == b.label_names
        and a.plain_labels == b.plain_labels
        and a.optional_labels == b.optional_labels
    )


class FamilyReuse:
    """The families of the last scrape by name. Scrapes may run at once: the worst a race does is
    render a family's text one more time."""

    def __init__(self) -> None:
        self._seen: dict[str, Family] = {}

    def reuse(self, families: list[Family]) -> list[Family]:
        """``families`` with each one not yet rendered replaced by the family of that name the
        previous scrape gave, when it holds the same samples; the others are sealed and kept."""
        seen = self._seen
        for i, family in enumerate(families):
            if family.rendered is not None or family.rendered_openmetrics is not None:
                continue  # its source keeps its text itself
            before = seen.get(family.name)
            if before is not None and same_text(before, family):
                families[i] = before
            else:
                family.seal()  # kept for the next scrape
                seen[family.name] = family
        return families
