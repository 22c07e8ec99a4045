"""A scrape keeps what did not change since the last one (the head's parts, each extra source's
families, the collectors' success rows) and still serves what its families render, byte for byte,
and still refuses a twin: as the daemon's counters, the snapshots and the sources move, scrape by
scrape, in every format."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.own_families import SelfStats
from gpumon.model.families import Family
from gpumon.model.poll_intervals import PollIntervals

VARIANTS = [(False, False), (False, True), (True, False), (True, True)]
"""(openmetrics, gzip)."""


class Source:
    """An extra source that serves the families the test gives it, made anew at every ask."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.value = 1.0

    def families(self) -> Iterator[Family]:
        for name in self.names:
            family = Family(name, "gauge", f"{name} of the test.", ("what",))
            family.add(['a "quoted" one'], self.value)
            yield family


class Rig:
    def __init__(self) -> None:
        self.now = 100.0
        self.stats = SelfStats()
        self.store = SnapshotStore()
        self.first, self.second = Source("gpumon_test_first"), Source("gpumon_test_second")
        self.collector = GpumonCollector(
            self.store,
            PollIntervals(),
            monotonic=lambda: self.now,
            self_stats=lambda: self.stats,
            extra=[("first", self.first), ("second", self.second)],
        )
        self.poller = Poller(
            FakeBackend.plausible(2, clock=lambda: self.now),
            self.store,
            monotonic=lambda: self.now,
            wall_clock=lambda: 1_700_000_000.0 + self.now,
        )

    def served(self, openmetrics: bool, gzip_: bool) -> bytes:
        body = b"".join(self.collector.body(openmetrics=openmetrics, gzip=gzip_))
        return gzip.decompress(body) if gzip_ else body

    def rendered(self, openmetrics: bool) -> bytes:
        return self.collector.render_openmetrics() if openmetrics else self.collector.render()


def success_rows(text: bytes) -> dict[str, str]:
    prefix = 'gpumon_collector_success{collector="'
    return {
        line[len(prefix) :].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in text.decode().splitlines()
        if line.startswith(prefix)
    }


def test_each_scrape_serves_what_its_families_render_as_the_head_and_the_sources_move() -> None:
    rig = Rig()
    steps = [
        lambda: None,  # no snapshot yet
        rig.poller.poll,
        lambda: None,  # the same snapshot, scraped again
        lambda: setattr(rig, "now", rig.now + 0.5),  # older: only its age moves
        lambda: setattr(rig, "stats", SelfStats(http_connections_open=3)),
        lambda: setattr(rig, "stats", SelfStats(http_connections_open=3, kernel_log_xids_total=2)),
        lambda: setattr(rig.first, "value", 2.0),
        rig.poller.poll,
        lambda: setattr(rig.second, "names", ["gpumon_test_second", "gpumon_test_third"]),
        lambda: setattr(rig, "stats", SelfStats()),
        rig.poller.poll,
    ]
    for step in steps:
        step()
        rig.now += 1.0
        for openmetrics, gz in VARIANTS:
            assert rig.served(openmetrics, gz) == rig.rendered(openmetrics)
            assert rig.served(openmetrics, gz) == rig.rendered(openmetrics)  # served again, from what is kept


def test_an_unchanged_source_is_refused_while_an_earlier_one_serves_its_family_and_served_again_after() -> None:
    rig = Rig()
    rig.poller.poll()
    assert success_rows(rig.served(True, False)) == {"gpumon": "1.0", "first": "1.0", "second": "1.0"}
    rig.first.names.append("gpumon_test_second")  # the second source gives what it gave before
    text = rig.served(True, False)
    assert success_rows(text) == {"gpumon": "1.0", "first": "1.0", "second": "0.0"}
    assert text.decode().count("# TYPE gpumon_test_second ") == 1
    rig.first.names.pop()
    text = rig.served(False, True)
    assert success_rows(text) == {"gpumon": "1.0", "first": "1.0", "second": "1.0"}
    assert text == rig.rendered(False)


def test_a_source_that_serves_a_family_of_gpumons_own_head_is_refused_when_the_head_comes_to_serve_it() -> None:
    rig = Rig()
    rig.second.names = ["gpumon_kernel_log_xids"]  # a gauge, named as gpumon's own counter family
    rig.poller.poll()
    assert success_rows(rig.served(False, False))["second"] == "1.0"  # not followed: no such family
    rig.stats = SelfStats(kernel_log_xids_total=4)
    text = rig.served(False, False)
    assert success_rows(text)["second"] == "0.0"
    assert text.decode().count("# TYPE gpumon_kernel_log_xids") == 1
