"""The metric vocabulary: a metric family as plain data, shared by every metric source.

gpumon's own table, alerts, burn results, read errors, health and the DCGM names each build
``Family`` objects; gpumon.exposition.text and gpumon.exposition.openmetrics write them.
prometheus_client sees them through gpumon.exposition.registry.FamilyMetric.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

KINDS = ("gauge", "counter", "untyped")


class DuplicateFamilyError(ValueError):
    """Two families of one name in one exposition (as prometheus_client's registry refuses a second
    collector whose names are registered): Prometheus would keep one of them, or refuse the scrape."""


def family_name(name: str, kind: str) -> str:
    """The family a sample name belongs to: a counter's sample name without its ``_total``."""
    return name.removesuffix("_total") if kind == "counter" else name


def refuse_twins(names: Iterable[str], served: Set[str] = frozenset()) -> frozenset[str]:
    """``names`` (family names, ``family_name``) as a set; DuplicateFamilyError naming the first that comes
    twice, or that ``served`` (the names an exposition serves already) holds."""
    seen = set(served)
    for name in names:
        if name in seen:
            raise DuplicateFamilyError(f"metric family {name} is served twice")
        seen.add(name)
    return frozenset(seen - served)


class SealedFamilyError(RuntimeError):
    """A sample was added to a family that is rendered or kept by a cache (``Family.seal``)."""


@dataclass
class Family:
    """One metric family: ``samples`` hold label values in the order of ``label_names``.

    Names (of the family and its labels) are plain Prometheus names, ``[a-zA-Z_][a-zA-Z0-9_]*``.
    A family is not changed once rendered: the renderers and the scrape's caches ``seal`` the
    families they keep, and ``add`` then raises SealedFamilyError.
    """

    name: str
    """Sample name; for counters it ends in ``_total``."""
    kind: str
    """``gauge``, ``counter`` or ``untyped`` (OpenMetrics calls it ``unknown``)."""
    help: str
    label_names: tuple[str, ...] = ()
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)
    plain_labels: bool = False
    """True when no label value can hold a backslash, quote or newline (indices, UUIDs, fixed
    names): rendering then skips escaping."""
    optional_labels: tuple[str, ...] = ()
    """Labels left out of a sample where their value is "" (a family whose samples do not all
    carry the same labels, such as ``peer_gpu`` on p2p bandwidth only)."""
    rendered: str | None = None
    """This family's text, once rendered; families of slow tiers are reused across scrapes.
    A family is not changed once rendered (it is sealed)."""
    rendered_openmetrics: str | None = None
    """The same in OpenMetrics text, once rendered (gpumon.exposition.openmetrics)."""
    _sealed: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"{self.name}: a counter's sample name ends in _total")

    def add(self, labels: Sequence[str], value: float) -> None:
        """Add one sample; SealedFamilyError once the family is sealed."""
        if self._sealed:
            raise SealedFamilyError(f"{self.name}: a family is not changed once rendered or kept by a cache")
        self.samples.append((tuple(labels), float(value)))

    def seal(self) -> None:
        """Make the family read-only for ``add``: its text is kept, or a cache keeps it for reuse."""
        self._sealed = True

    @property
    def sealed(self) -> bool:
        """Whether ``seal`` was called: ``add`` raises."""
        return self._sealed

    @property
    def family_name(self) -> str:
        return family_name(self.name, self.kind)


class FamilySource(Protocol):
    """A metric source: its families for one scrape (built fresh, or reused while unchanged)."""

    def families(self) -> Iterable[Family]: ...
