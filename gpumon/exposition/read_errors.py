"""``gpumon_read_errors_total{gpu, uuid, reader}``: which reads of which GPU failed, and how often.

A reader is one group of backend calls (``memory``, ``temperature``, ``nvlink_errors``, ...).
An error of one reader (NVML UNKNOWN, TIMEOUT, ...) leaves that reader's fields out of the
snapshot and is counted here; the GPU stays up and its other fields are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from gpumon.model.families import Family

ReadErrors = Callable[[], Mapping[tuple[int, str, str], int]]
"""() -> {(gpu index, uuid, reader name): errors since start}."""


class ReadErrorsCollector:
    """A metric source over a backend's ``read_errors()``."""

    def __init__(self, read_errors: ReadErrors) -> None:
        self._read_errors = read_errors

    def families(self) -> Iterator[Family]:
        family = Family(
            "gpumon_read_errors_total",
            "counter",
            "Failed reads of one group of fields (reader) of a GPU since start, e.g. NVML answering UNKNOWN; "
            "the reader's fields are left out of that poll, the GPU stays up.",
            ("gpu", "uuid", "reader"),
        )
        for (index, uuid, reader), count in sorted(self._read_errors().items()):
            family.add([str(index), uuid, reader], count)
        yield family
