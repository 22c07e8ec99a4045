"""What /metrics serves when a snapshot's bytes are kept: the same bytes as the families render,
rendered ahead only for scrapers that come every poll, and never staler than the poll in hand."""

from __future__ import annotations

import gzip
import os
import random
import zlib
from collections.abc import Iterator

import pytest
import requests

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition import gzip_parts
from gpumon.exposition.collector import GpumonCollector
from gpumon.http.exchange import coalesced
from gpumon.http.server import MetricsServer
from gpumon.model.families import Family, SealedFamilyError
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import Snapshot
from tests.test_exporter import GOLDEN, golden_collector

VARIANTS = [(False, False), (False, True), (True, False), (True, True)]
"""(openmetrics, gzip)."""


def served(collector: GpumonCollector, *, openmetrics: bool = False, gzip_: bool = False) -> bytes:
    """The exposition as a client reads it (inflated when gzipped)."""
    body = b"".join(collector.body(openmetrics=openmetrics, gzip=gzip_))
    return gzip.decompress(body) if gzip_ else body


def snapshot_timestamp(text: bytes) -> float:
    for line in text.decode().splitlines():
        if line.startswith("gpumon_snapshot_timestamp_seconds "):
            return float(line.split()[1])
    raise AssertionError("no gpumon_snapshot_timestamp_seconds")


class Alerts:
    """An extra source whose one family the test changes."""

    def __init__(self) -> None:
        self.firing = 0
        self.calls = 0

    def families(self) -> Iterator[Family]:
        self.calls += 1
        family = Family("gpumon_test_alerts", "gauge", "Test alerts.", ("alertname",))
        family.add(["GpuHot"], float(self.firing))
        yield family


class Rig:
    """A poller and a collector on one store, with a clock the test moves; the collector's
    ``prepare`` subscribed after ``listener`` (a scrape the test makes while the polling thread
    is in the store's listeners)."""

    def __init__(self, gpus: int = 2) -> None:
        self.now = 100.0
        self.store = SnapshotStore()
        self.alerts = Alerts()
        self.collector = GpumonCollector(
            self.store,
            PollIntervals(),
            monotonic=lambda: self.now,
            processes=True,
            extra=[("alerts", self.alerts)],
        )
        self.poller = Poller(
            FakeBackend.plausible(gpus, clock=lambda: self.now),
            self.store,
            monotonic=lambda: self.now,
            wall_clock=lambda: 1_700_000_000.0 + self.now,
        )
        self.in_listener: list[bytes] = []
        self.ready_in_listener: list[list[bytes] | None] = []
        self.scrape_in_listener = False
        self.listener_delay_seconds = 0.0
        self.store.subscribe(self.listener)
        self.store.subscribe(self.collector.prepare)
        self.builds = 0
        build = self.collector._gpu._new_gpu_metrics

        def counted(snapshot: Snapshot) -> list[Family]:
            self.builds += 1
            return build(snapshot)

        self.collector._gpu._new_gpu_metrics = counted  # type: ignore[method-assign]

    def listener(self, _snapshot: Snapshot) -> None:
        self.now += self.listener_delay_seconds
        if self.scrape_in_listener:
            self.ready_in_listener.append(self.collector.ready_body())
            self.in_listener.append(served(self.collector))

    def poll(self) -> Snapshot:
        self.now += 1.0
        return self.poller.poll()


# --- the bytes served ------------------------------------------------------------------------


def test_every_body_is_the_golden_exposition_byte_for_byte() -> None:
    collector = golden_collector()
    assert served(collector).decode() == GOLDEN.read_text()
    for openmetrics, gz in VARIANTS:
        expected = collector.render_openmetrics() if openmetrics else collector.render()
        for _ in range(2):  # the first scrape of the snapshot, and one that reuses its bytes
            assert served(collector, openmetrics=openmetrics, gzip_=gz) == expected


def test_later_scrapes_of_a_snapshot_send_its_block_without_rendering_it_again() -> None:
    rig = Rig()
    rig.poll()
    for openmetrics, gz in VARIANTS:
        first = rig.collector.body(openmetrics=openmetrics, gzip=gz)
        again = rig.collector.body(openmetrics=openmetrics, gzip=gz)
        assert max(again, key=len) is max(first, key=len)  # the per-GPU families' bytes, kept
    assert rig.builds == 1


def test_a_new_snapshot_is_served_at_its_first_scrape() -> None:
    rig = Rig()
    first = rig.poll()
    assert snapshot_timestamp(served(rig.collector)) == first.timestamp_seconds
    second = rig.poll()
    for openmetrics, gz in VARIANTS:
        text = served(rig.collector, openmetrics=openmetrics, gzip_=gz)
        assert snapshot_timestamp(text) == second.timestamp_seconds
        assert text == (rig.collector.render_openmetrics() if openmetrics else rig.collector.render())


def test_a_changed_extra_family_is_served_at_once_and_an_unchanged_one_keeps_its_bytes() -> None:
    rig = Rig()
    rig.poll()
    before = rig.collector.body()
    assert b'gpumon_test_alerts{alertname="GpuHot"} 0.0' in b"".join(before)
    assert rig.collector.body()[-2] is before[-2]  # same samples: the extra families' bytes are kept
    rig.alerts.firing = 1  # a new alert, same snapshot
    after = rig.collector.body(gzip=True)
    assert b'gpumon_test_alerts{alertname="GpuHot"} 1.0' in gzip.decompress(b"".join(after))
    assert served(rig.collector) == rig.collector.render()


class KeptFamily:
    """An extra source that keeps its one family from scrape to scrape."""

    def __init__(self) -> None:
        self.family = Family("gpumon_test_kept", "gauge", "Kept.", ("n",))
        self.family.add(["0"], 0.0)

    def families(self) -> Iterator[Family]:
        yield self.family


def test_a_family_once_served_is_sealed_and_adding_a_sample_to_it_raises() -> None:
    rig = Rig()
    kept = KeptFamily()
    rig.collector.add("kept", kept)
    rig.poll()
    fresh = Family("gpumon_test_fresh", "gauge", "Not served yet.")
    fresh.add([], 1.0)  # a family not yet rendered nor kept takes samples
    assert not kept.family.sealed
    before = served(rig.collector)
    assert kept.family.sealed
    per_gpu = [family for family in rig.collector.own_families() if "gpu" in family.label_names]
    assert per_gpu and all(family.sealed for family in per_gpu)  # kept for every scrape of the snapshot
    with pytest.raises(SealedFamilyError, match="gpumon_test_kept"):
        kept.family.add(["1"], 1.0)  # the kept bytes would no longer be its text
    assert served(rig.collector) == before == rig.collector.render()


def test_a_reload_with_new_intervals_is_served_at_once() -> None:
    rig = Rig()
    rig.poll()
    assert b"Refreshed every 10s." in served(rig.collector)
    rig.collector.set_options(PollIntervals(slow_seconds=20.0), processes=True)
    text = served(rig.collector)
    assert b"Refreshed every 20s." in text and b"Refreshed every 10s." not in text
    assert text == rig.collector.render()


# --- rendering ahead -------------------------------------------------------------------------


def test_nothing_is_rendered_ahead_while_nobody_scrapes() -> None:
    rig = Rig()
    for _ in range(5):
        rig.poll()
    assert rig.builds == 0


def test_after_a_scrape_the_next_snapshot_is_rendered_ahead_then_no_more_without_one() -> None:
    rig = Rig()
    rig.poll()
    served(rig.collector, openmetrics=True, gzip_=True)
    assert rig.builds == 1
    latest = rig.poll()  # the snapshot before was scraped: this one is rendered on the polling thread
    assert rig.builds == 2
    newest = rig.collector._newest
    assert newest is not None and newest.snapshot is latest
    assert newest.made("openmetrics", True) and not newest.made("text", False)  # what the scrapers asked for
    served(rig.collector, openmetrics=True, gzip_=True)
    assert rig.builds == 2  # the scrape rendered nothing
    rig.poll()  # scraped before: rendered ahead
    rig.poll()  # the one before was not scraped: not rendered ahead
    rig.poll()
    assert rig.builds == 3


def test_for_a_scraper_slower_than_the_polls_the_scrape_renders_the_slow_rows_read_since_the_last() -> None:
    """Prometheus every 15 s: the polling thread renders no slow or static rows after its reads (8 in 10
    polls at 8 GPUs, each making every changed row's family again); the scrape renders them once, and
    serves what a collector rendering that snapshot afresh serves, the slow values just read included."""
    rig = Rig(gpus=8)
    made: list[Snapshot] = []
    prepare_slower = rig.collector._gpu.prepare_slower

    def counted(snapshot: Snapshot) -> None:
        made.append(snapshot)
        prepare_slower(snapshot)

    rig.collector._gpu.prepare_slower = counted  # type: ignore[method-assign]
    for _scrape in range(3):
        for _poll in range(15):
            latest = rig.poll()
        text = served(rig.collector, openmetrics=True, gzip_=True)
        fresh = GpumonCollector(rig.store, PollIntervals(), monotonic=lambda: rig.now, processes=True)
        fresh.add("alerts", rig.alerts)
        assert text == served(fresh, openmetrics=True, gzip_=True)
        assert snapshot_timestamp(text) == latest.timestamp_seconds
    assert len(made) <= 3  # at most the one poll after each scrape, rendered ahead in case scrapes come every poll


def test_a_scrape_while_the_polling_thread_works_on_a_snapshot_serves_the_one_before() -> None:
    rig = Rig()
    first = rig.poll()
    assert snapshot_timestamp(served(rig.collector)) == first.timestamp_seconds
    rig.scrape_in_listener = True
    assert rig.collector.ready_body() is None  # a scrape of the latest asks the sources
    second = rig.poll()  # a scrape comes before prepare() has rendered this snapshot
    assert snapshot_timestamp(rig.in_listener[-1]) == first.timestamp_seconds
    assert rig.ready_in_listener[-1] is not None  # all made already: the event loop serves it itself
    assert b"".join(rig.ready_in_listener[-1]) == rig.in_listener[-1]
    assert snapshot_timestamp(served(rig.collector)) == second.timestamp_seconds  # rendered ahead meanwhile
    calls = rig.alerts.calls
    rig.alerts.firing = 1
    rig.poll()  # the scrape during it serves everything as the last scrape had it
    assert rig.alerts.calls == calls
    assert b'gpumon_test_alerts{alertname="GpuHot"} 0.0' in rig.in_listener[-1]
    assert b'gpumon_test_alerts{alertname="GpuHot"} 1.0' in served(rig.collector)


def test_without_a_scrape_of_the_snapshot_before_a_scrape_serves_the_latest() -> None:
    rig = Rig()
    rig.poll()  # not scraped: nothing will be rendered ahead of the next
    rig.scrape_in_listener = True
    second = rig.poll()
    assert snapshot_timestamp(rig.in_listener[-1]) == second.timestamp_seconds
    assert rig.ready_in_listener == [None]


def test_the_snapshot_before_is_served_for_less_than_one_fast_interval() -> None:
    rig = Rig()
    rig.poll()
    served(rig.collector)
    rig.scrape_in_listener = True
    rig.listener_delay_seconds = 1.0  # the listeners before prepare() take a whole poll interval
    latest = rig.poll()
    assert snapshot_timestamp(rig.in_listener[-1]) == latest.timestamp_seconds


# --- gzip of parts, chunks -----------------------------------------------------------------------


def test_crc32_combine_matches_zlib() -> None:
    rng = random.Random(7)
    for _ in range(100):
        a = rng.randbytes(rng.randint(0, 3000))
        b = rng.randbytes(rng.randint(0, 100_000))
        assert gzip_parts.crc32_combine(zlib.crc32(a), zlib.crc32(b), gzip_parts.crc32_shift(len(b))) == zlib.crc32(
            a + b
        )


def test_a_member_of_deflated_and_stored_parts_inflates_to_the_parts_joined() -> None:
    datas = [b"# HELP x\n" * 30, b"", os.urandom(70_000) + b"a" * 200_000, b"tail\n"]
    for make in (gzip_parts.deflate, gzip_parts.stored):
        parts = [make(d) if i % 2 else gzip_parts.stored(d) for i, d in enumerate(datas)]
        assert gzip.decompress(b"".join(gzip_parts.member(parts))) == b"".join(datas)
        assert zlib.decompress(b"".join(gzip_parts.member(parts)), 31) == b"".join(datas)  # no trailing data


def test_a_member_of_deflated_parts_short_and_long_in_any_order_inflates_to_the_parts_joined() -> None:
    rng = random.Random(11)
    sizes = [0, 1, 12_000, 64 << 10, (64 << 10) + 1, 300_000]  # short parts keep their bytes, long ones not
    for _ in range(20):
        datas = [rng.randbytes(n // 2) + b"gpumon_x 1.0\n" * (n // 26) for n in rng.sample(sizes, k=4)]
        parts = [gzip_parts.deflate(d) if rng.random() < 0.7 else gzip_parts.stored(d) for d in datas]
        member = b"".join(gzip_parts.member(parts))
        assert gzip.decompress(member) == b"".join(datas)
        assert zlib.decompress(member, 31) == b"".join(datas)


def test_small_chunks_go_out_joined_and_large_ones_as_they_are() -> None:
    big = b"x" * (2 << 20)
    assert coalesced([b"a", b"b", b"c"]) == [b"abc"]
    out = coalesced([b"head", b"", big, b"t", b"u"])
    assert out == [b"head", big, b"tu"] and out[1] is big


# --- over HTTP ---------------------------------------------------------------------------------


def test_the_server_sends_the_chunks_as_one_body() -> None:
    collector = golden_collector()
    server = MetricsServer(
        ("127.0.0.1", 0),
        collector,
        SnapshotStore(),
        stale_after_seconds=5,
    )
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        plain = requests.get(url, headers={"Accept-Encoding": "identity"}, timeout=10)
        assert plain.content == collector.render() and "Content-Encoding" not in plain.headers
        zipped = requests.get(url, headers={"Accept-Encoding": "gzip"}, timeout=10)
        assert zipped.headers["Content-Encoding"] == "gzip" and zipped.content == collector.render()
        om = requests.get(
            url, headers={"Accept": "application/openmetrics-text;version=1.0.0", "Accept-Encoding": "gzip"}, timeout=10
        )
        assert om.content == collector.render_openmetrics()
        head = requests.head(url, headers={"Accept-Encoding": "identity"}, timeout=10)
        assert head.content == b"" and int(head.headers["Content-Length"]) == len(collector.render())
    finally:
        server.stop()
