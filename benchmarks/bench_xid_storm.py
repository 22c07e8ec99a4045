"""An XID storm through the real kernel-log follower: memory, CPU time, state file size and log lines.

NVIDIA/NVSentinel#1120: one node logged about 800,000 XID 95 lines for 29 distinct events. Here the
storm is ``--lines`` kmsg records (default 1,000,000) of 29 distinct faults (GPU and code) on 8 GPUs,
about 80 % of them XID 95, written into a file that ``KernelLogFollower`` follows live (as it follows
/dev/kmsg), through the ``XidTracker`` and the ``HealthService`` (XID lifecycle, ``xid.json``) wired as
the daemon wires them; a thread asks for the verdict once a second as the poll and the scrapes do
(each of those saves the lifecycle when it changed).

Reference measured in the same run: the same storm of ``--reference-lines`` (10,000) lines. Each run
is a child process of its own, so its peak RSS is its own. Printed per run: peak RSS above the RSS
before the storm, CPU seconds of the process during the storm (µs per line), ``xid.json``'s size, the
log lines written, the verdict; then the ratios of the big run to the reference.

Run: .venv/bin/python benchmarks/bench_xid_storm.py [--lines 1000000] [--reference-lines 10000]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from gpumon.events.kernel_follow import KernelLogFollower
from gpumon.events.tracker import XidTracker
from gpumon.events.xid_log import XidLog
from gpumon.health.config import HealthConfig
from gpumon.health.service import HealthService
from gpumon.model.findings import HealthReport
from gpumon.model.xid_catalog import XidCatalog

GPUS = 8
FAULTS: tuple[tuple[int, int, int], ...] = (
    # (gpu, xid, weight): 29 distinct faults; XID 95 storms on GPUs 0-5, the rest around them
    *((g, 95, 130) for g in range(6)),
    *((g, 43, 4) for g in range(6)),  # follows 95: defers to it
    *((g, 45, 2) for g in range(6)),  # cleanup after another XID
    (6, 79, 3),
    (6, 154, 1),  # recovery action changed after 79
    (7, 13, 6),
    (7, 31, 6),
    (7, 48, 2),
    (0, 63, 2),  # info: a row remap recorded
    (1, 92, 2),
    (2, 94, 2),
    (3, 119, 2),
    (4, 74, 2),
    (5, 61, 1),
)
assert len(FAULTS) == 29


def bus(gpu: int) -> str:
    return f"0000:{0x18 + gpu * 0x10:02x}:00"


def storm_lines(lines: int) -> Iterator[str]:
    """``lines`` kmsg records: the faults in weighted turn, each GPU's first record its first fault."""
    cycle = [(g, x) for g, x, w in FAULTS for _ in range(w)]
    order = sorted(range(len(cycle)), key=lambda i: (i * 7919) % len(cycle))  # interleaved, fixed
    turn = [cycle[i] for i in order]
    firsts = [(g, x) for g, x, _ in FAULTS if x in (95, 79, 13)]  # the causes come first on their GPU
    for seq in range(lines):
        gpu, xid = firsts[seq] if seq < len(firsts) else turn[seq % len(turn)]
        yield f"3,{1000 + seq},{5_000_000 + seq},-;NVRM: Xid (PCI:{bus(gpu)}): {xid}, pid=4242, name=train.py, storm\n"


def expected_counts(lines: int) -> Counter[tuple[int, int]]:
    """How many records of each (gpu, xid) ``storm_lines(lines)`` writes."""
    counts: Counter[tuple[int, int]] = Counter()
    for line in storm_lines(lines):
        xid = int(line.split("): ")[1].split(",")[0])
        gpu = (int(line.split("PCI:0000:")[1][:2], 16) - 0x18) // 0x10
        counts[gpu, xid] += 1
    return counts


@dataclass(frozen=True)
class Figures:
    lines: int
    counted: int
    rss_growth_mib: float
    cpu_seconds: float
    state_bytes: int
    log_lines: int
    status: str
    findings: int


class _Counting(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage())


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def run_storm(
    lines: int, workdir: Path, *, xid_log: XidLog | None = None, handler: logging.Handler | None = None
) -> tuple[Figures, HealthService, XidTracker, list[str]]:
    """Write the storm into a followed file and wait until the follower handed every record over."""
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / "storm.kmsg"
    with source.open("w") as out:
        out.writelines(storm_lines(lines))
    kmsg = workdir / "kmsg"
    kmsg.write_text("")
    counting = _Counting()
    logger = logging.getLogger("gpumon")
    logger.addHandler(counting)
    if handler is not None:
        logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    boot_id = workdir / "boot_id"
    boot_id.write_text("storm-boot\n")
    health = HealthService(
        workdir / "state", XidCatalog.load(), HealthConfig(sysfs_root=workdir / "sys", boot_id_path=boot_id)
    )
    extra = {} if xid_log is None else {"xid_log": xid_log}
    tracker = XidTracker(time.time(), logger=logging.getLogger("gpumon.events.tracker"), **extra)
    tracker.set_gpus({bus(g): g for g in range(GPUS)})
    tracker.subscribe(health.on_xid, attributed=True)
    tracker.subscribe_paired(health.on_xid_paired)
    follower = KernelLogFollower(
        tracker.record_all, tracker.record, kmsg_path=kmsg, journal_command=None, boot_time=lambda: time.time() - 100
    )
    done = threading.Event()
    follower.start()
    while follower.source is None:
        time.sleep(0.01)
    rss_before, cpu_before = _rss_kib(), time.process_time()

    def scrape() -> None:  # the poll's and the scrapes' saves
        while not done.wait(1.0):
            health.report()

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    with source.open("rb") as src, kmsg.open("ab") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
            dst.flush()
    while follower.events_total < lines:
        time.sleep(0.05)
    report: HealthReport = health.report()
    cpu = time.process_time() - cpu_before
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    done.set()
    follower.stop()
    scraper.join(5)
    logger.removeHandler(counting)
    logger.setLevel(level)
    if handler is not None:
        logger.removeHandler(handler)
    state = health.folder / "xid.json"
    figures = Figures(
        lines=lines,
        counted=sum(sum(tracker.counts(g).values()) for g in range(GPUS)),
        rss_growth_mib=max(0, peak_kib - rss_before) / 1024,
        cpu_seconds=cpu,
        state_bytes=state.stat().st_size,
        log_lines=len(counting.records),
        status=report.status,
        findings=len(report.findings),
    )
    return figures, health, tracker, counting.records


def _child(lines: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        figures, _, _, _ = run_storm(lines, Path(tmp))
    print(json.dumps(asdict(figures)))


def _measure(lines: int) -> Figures:
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(lines)], capture_output=True, text=True, check=True, env=os.environ
    )
    return Figures(**json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--reference-lines", type=int, default=10_000)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    runs = [_measure(args.reference_lines), _measure(args.lines)]
    for f in runs:
        print(
            f"{f.lines:>9,} XID lines: counted {f.counted:,}; peak RSS +{f.rss_growth_mib:.1f} MiB; "
            f"CPU {f.cpu_seconds:.1f} s ({f.cpu_seconds / f.lines * 1e6:.0f} µs/line); xid.json {f.state_bytes:,} B; "
            f"{f.log_lines} log lines; verdict {f.status} with {f.findings} findings"
        )
    ref, big = runs
    print(
        f"ratio {big.lines // ref.lines}x lines / reference: RSS growth {big.rss_growth_mib / max(ref.rss_growth_mib, 0.1):.1f}x, "
        f"CPU {big.cpu_seconds / ref.cpu_seconds:.1f}x, xid.json {big.state_bytes / ref.state_bytes:.2f}x, "
        f"log lines {big.log_lines / max(ref.log_lines, 1):.2f}x"
    )


if __name__ == "__main__":
    main()
