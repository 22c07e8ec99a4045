"""The last ``gpumon burn`` results as metric families (no torch; the daemon adds it to its collector).

Reads ``<state_dir>/burn/last.json`` (re-read only when its mtime changes) and
``<state_dir>/burn/running.json`` at each scrape, and yields:

* ``gpumon_burn_last_run_timestamp_seconds`` — Unix time the last burn finished
* ``gpumon_burn_last_run_exit_code`` — 0 pass, 1 fault, 3 could not run
* ``gpumon_burn_passed{gpu,uuid,test}`` — 1 passed, 0 failed (tests not run are absent)
* ``gpumon_burn_tflops{gpu,uuid,dtype}`` — sustained (median) matmul TFLOP/s
* ``gpumon_burn_bandwidth_bytes_per_second{gpu,uuid,test,peer_gpu}`` — memory (device copy,
  read+write), p2p (to ``peer_gpu``), allreduce (busbw at the largest size); only p2p
  series carry ``peer_gpu`` (no empty label on the others)
* ``gpumon_burn_fingerprint_info{gpu,uuid,model,software,dtype,digest}`` — 1 per digest of the
  fleet-wide SDC fingerprint (seeded GEMMs per dtype, ``memory``: a pattern read back): GPUs of one
  model and software must show the same ``digest``, in this run and in any other
* ``gpumon_burn_running{gpu,uuid}`` — 1 while a burn runs on the GPU (from the marker)

A missing or unreadable file yields no series; a scrape never fails because of it, nor waits: both are
read only as regular files of at most ``MAX_BURN_FILE_BYTES`` (a FIFO or /dev/zero in their place is not
read).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpumon.model.families import Family
from gpumon.state.burn_record import LAST_NAME, MARKER_NAME, MAX_BURN_FILE_BYTES, burn_dir, pid_alive
from gpumon.util.state.files import DamagedFile, read_state_json


class BurnResultsCollector:
    """``BurnResultsCollector(state_dir)``: a metric source (``families()``) of the burn's files."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = burn_dir(state_dir)
        self._last_path = self.dir / LAST_NAME
        self._marker_path = self.dir / MARKER_NAME
        """Joined once: both are looked at by every scrape."""
        self._mtime: float | None = None
        self._report: dict[str, Any] | None = None

    def _load_report(self) -> dict[str, Any] | None:
        path = self._last_path
        try:
            mtime = path.stat().st_mtime
        except OSError:
            self._mtime, self._report = None, None
            return None
        if mtime != self._mtime:
            try:
                data = read_state_json(path, MAX_BURN_FILE_BYTES)
                self._report = data if isinstance(data, dict) else None
            except (OSError, DamagedFile):
                self._report = None
            self._mtime = mtime
        return self._report

    def _load_marker(self) -> dict[str, Any] | None:
        try:
            data = read_state_json(self._marker_path, MAX_BURN_FILE_BYTES)
        except (OSError, DamagedFile):
            return None
        return data if isinstance(data, dict) and pid_alive(data.get("pid")) else None

    def families(self) -> Iterator[Family]:
        report = self._load_report()
        marker = self._load_marker()
        running = Family(
            "gpumon_burn_running",
            "gauge",
            "1 while gpumon burn runs on the GPU (burn/running.json).",
            ("gpu", "uuid"),
        )
        seen: set[str] = set()
        if marker is not None:
            for gpu, uuid in zip(marker.get("gpus") or [], marker.get("uuids") or [], strict=False):
                running.add([str(gpu), str(uuid)], 1)
                seen.add(str(gpu))
        if report is not None:
            yield from self._report_families(report, running, seen)
            yield _fingerprints(report)
        yield running

    def _report_families(self, report: dict[str, Any], running: Family, seen: set[str]) -> Iterator[Family]:
        node = report.get("node", 0)
        gpus = [g for g in report.get("gpus") or [] if isinstance(g, dict) and g.get("node", 0) == node]
        finished = report.get("finished_at")
        if isinstance(finished, (int, float)):
            ts = Family("gpumon_burn_last_run_timestamp_seconds", "gauge", "Unix time the last gpumon burn finished.")
            ts.add([], float(finished))
            yield ts
        code = report.get("exit_code")
        if isinstance(code, int):
            ec = Family(
                "gpumon_burn_last_run_exit_code",
                "gauge",
                "Exit code of the last gpumon burn: 0 pass, 1 fault, 3 could not run.",
            )
            ec.add([], code)
            yield ec
        passed = Family(
            "gpumon_burn_passed",
            "gauge",
            "1 if the GPU passed the test in the last gpumon burn, 0 if it failed.",
            ("gpu", "uuid", "test"),
        )
        tflops = Family(
            "gpumon_burn_tflops",
            "gauge",
            "Sustained (median) matmul throughput of the last gpumon burn, TFLOP/s.",
            ("gpu", "uuid", "dtype"),
        )
        bandwidth = Family(
            "gpumon_burn_bandwidth_bytes_per_second",
            "gauge",
            "Bandwidth in the last gpumon burn: memory (device copy, read+write), p2p (to peer_gpu), "
            "allreduce (busbw at the largest size).",
            ("gpu", "uuid", "test", "peer_gpu"),
            optional_labels=("peer_gpu",),
        )
        for g in gpus:
            gpu, uuid = str(g.get("gpu")), str(g.get("uuid") or "")
            for test, ok in (g.get("tests") or {}).items():
                if isinstance(ok, bool):
                    passed.add([gpu, uuid, str(test)], 1 if ok else 0)
            mm = g.get("matmul") or {}
            if isinstance(mm.get("tflops"), (int, float)):
                tflops.add([gpu, uuid, str(mm.get("dtype"))], float(mm["tflops"]))
            mem = (g.get("memory") or {}).get("bandwidth_bytes_per_second")
            if isinstance(mem, (int, float)):
                bandwidth.add([gpu, uuid, "memory", ""], float(mem))
            for peer, bw in (g.get("p2p") or {}).items():
                if isinstance(bw, (int, float)):
                    bandwidth.add([gpu, uuid, "p2p", str(peer)], float(bw))
            ar = (g.get("allreduce") or {}).get("busbw_bytes_per_second")
            if isinstance(ar, (int, float)):
                bandwidth.add([gpu, uuid, "allreduce", ""], float(ar))
            if gpu not in seen:
                running.add([gpu, uuid], 0)
                seen.add(gpu)
        yield passed
        yield tflops
        yield bandwidth


def _fingerprints(report: dict[str, Any]) -> Family:
    """This node's GPUs' digests (other nodes' are exported by their own daemons)."""
    node = report.get("node", 0)
    gpus = [g for g in report.get("gpus") or [] if isinstance(g, dict) and g.get("node", 0) == node]
    family = Family(
        "gpumon_burn_fingerprint_info",
        "gauge",
        "1 per digest of the last gpumon burn's SDC fingerprint: the same model and software must give the "
        "same digest for each dtype, on every GPU and in every run.",
        ("gpu", "uuid", "model", "software", "dtype", "digest"),
    )
    for g in gpus:
        fp = g.get("fingerprint")
        if not isinstance(fp, dict) or not isinstance(fp.get("digests"), dict):
            continue
        gpu, uuid, model = str(g.get("gpu")), str(g.get("uuid") or ""), str(g.get("model") or "")
        software = str(fp.get("software") or "")
        for dtype, digest in fp["digests"].items():
            family.add([gpu, uuid, model, software, str(dtype), str(digest)], 1)
    return family
