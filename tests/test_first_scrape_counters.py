"""Silent zeros: every counter family gpumon serves has a sample from the first scrape for each GPU it
applies to, 0 where nothing happened, never absent (dcgm-exporter users saw metrics go blank instead of 0,
NVIDIA/dcgm-exporter#646 and #700; a counter that appears at 1 also hides its first event from increase()).

The test walks every per-GPU counter family of the metric table (as served by default) on the first
/metrics a daemon answers, and every counter family that scrape has."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpumon.exposition.metrics import gpu_rows
from tests.helpers import DaemonProcess

GPUS = ("0", "1")


def test_every_counter_family_has_a_sample_for_every_gpu_from_the_first_scrape(start_daemon: Any) -> None:
    daemon: DaemonProcess = start_daemon("--backend", "fake", "--fake-gpus", "2")
    first = daemon.metrics()
    families = {f.name: f for f in text_string_to_metric_families(first)}
    per_gpu = [  # per-link NVLink errors are a link's rows (its GPU's sum is gpumon_nvlink_errors_total)
        row
        for row in gpu_rows()
        if row.kind == "counter" and row.served(frozenset()) is not None and row.detail != "nvlink_per_link"
    ]
    assert {"gpumon_xid_errors_total", "gpumon_energy_joules_total", "gpumon_throttle_seconds_total"} <= {
        r.name for r in per_gpu
    }
    blank = []
    for row in per_gpu:
        family = families.get(row.name.removesuffix("_total"))
        served = {s.labels.get("gpu") for s in family.samples} if family is not None else set()
        blank += [f"{row.name} GPU {gpu}" for gpu in GPUS if gpu not in served]
    assert blank == [], f"absent on the first scrape: {blank}"
    for family in families.values():  # and no counter family is served without a sample
        if family.type == "counter":
            assert family.samples, family.name
    xid = [(s.labels["gpu"], s.labels["xid"], s.value) for s in families["gpumon_xid_errors"].samples]
    assert sorted(xid) == [("0", "", 0.0), ("1", "", 0.0)]
