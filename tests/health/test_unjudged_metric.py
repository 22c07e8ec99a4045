"""Prologs that let a job through unjudged are counted, all of them, even when they run at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpumon.exposition.text import render
from gpumon.health.unjudged import UnjudgedCollector
from tests.helpers import REPO

TYPO = "health:\n  slurm: {enabled: true, max_drained_share: 3}\n"


def _prolog(config: Path, state: Path, job: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    env["SLURM_JOB_ID"] = str(job)
    cmd = [sys.executable, "-m", "gpumon", "health", "--slurm-prolog", "--config", str(config), "--state-dir"]
    return subprocess.Popen(
        [*cmd, str(state)],
        cwd=str(REPO),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_five_prologs_at_once_are_five_counted(tmp_path: Path) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text(TYPO)
    state = tmp_path / "state"
    collector = UnjudgedCollector(state)
    assert 'gpumon_health_unjudged_total{hook="prolog"} 0.0' in render(collector.families())
    runs = [_prolog(config, state, job) for job in range(5)]
    assert [run.wait(120) for run in runs] == [0] * 5  # every job goes through
    text = render(collector.families())
    assert 'gpumon_health_unjudged_total{hook="prolog"} 5.0' in text
    assert 'gpumon_health_unjudged_last_timestamp_seconds{hook="prolog"}' in text
    assert _prolog(config, state, 5).wait(120) == 0  # the next scrape reads on from where the last stopped
    assert 'gpumon_health_unjudged_total{hook="prolog"} 6.0' in render(collector.families())


def test_a_scrape_reads_a_bounded_part_of_the_file_and_never_a_device_put_in_its_place(tmp_path: Path) -> None:
    """The file is read where scrapes come: a device linked in its place (/dev/zero, endless) or a
    file grown by gigabytes must not hold a scrape or fill the daemon's memory. A scrape reads at
    most READ_BYTES of new lines; the rest comes with the next scrapes; a non-regular file is no file."""
    import json

    from gpumon.health import unjudged

    state = tmp_path / "state"
    path = unjudged.unjudged_path(state)
    path.parent.mkdir(parents=True)
    line = json.dumps({"hook": "prolog", "job": "1", "reason": "x" * 200, "time_seconds": 1.0}) + "\n"
    lines = unjudged.READ_BYTES // len(line) * 3  # three scrapes' worth
    path.write_text(line * lines)
    collector = UnjudgedCollector(state)
    counted = []
    for _ in range(4):
        text = render(collector.families())
        counted.append(
            next(v for v in text.splitlines() if v.startswith('gpumon_health_unjudged_total{hook="prolog"}'))
        )
    assert counted[0] != counted[-1], "the first scrape read only a bounded part"
    assert counted[-1] == f'gpumon_health_unjudged_total{{hook="prolog"}} {float(lines)}'
    path.unlink()
    path.symlink_to("/dev/zero")
    text = render(UnjudgedCollector(state).families())  # returns: /dev/zero is not read
    assert 'gpumon_health_unjudged_total{hook="prolog"} 0.0' in text
