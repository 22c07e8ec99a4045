"""``gpumon record``: write down what NVML answers on this host, for ``--backend replay:FILE`` anywhere.

gpumon's own NVML backend polls the GPUs (every tier on every poll, through the poller
``gpumon once`` uses) over a recorder standing where the ``pynvml`` module stands
(gpumon.backends.recorder), so the file holds every call gpumon makes and every answer: values,
NOT_SUPPORTED and other errors, the event set's answers (the time between polls is spent waiting
on it), topology, P2P, NVLink, processes. Run it idle, and again while your load runs, with a
``--label`` saying which. The file format is gpumon.backends.recording's.

Exit 0 written, 1 NVML unavailable (nothing written), 2 bad options or the file cannot be written.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpumon import __version__
from gpumon.backends.recording import Recording
from gpumon.model.snapshot import Snapshot

EXIT_OK = 0
EXIT_FAULT = 1
EXIT_USAGE = 2
MAX_POLLS = 10_000


@dataclass(frozen=True)
class RecordRequest:
    """What to record: ``polls`` polls ``interval_seconds`` apart, with a label and redaction."""

    polls: int = 10
    interval_seconds: float = 1.0
    label: str = ""
    redact: bool = False


def configure(parser: argparse.ArgumentParser) -> None:
    """Give ``gpumon record``'s parser (made by gpumon.cli) its options and command."""
    parser.description = (
        "Poll this host's GPUs with gpumon's NVML backend and write every NVML call and answer to a small "
        "text file that --backend replay:FILE plays back anywhere (tests, bug reports). Run it idle and "
        "again under load (--label says which)."
    )
    parser.add_argument(
        "-o", "--output", type=Path, help="the file to write (default gpumon-recording-<UTC time>.json)"
    )
    parser.add_argument("--polls", type=polls_count, default=10, help="how many polls to record (default 10)")
    parser.add_argument(
        "--interval-seconds",
        type=poll_interval_seconds,
        default=1.0,
        dest="interval_seconds",
        help="time between polls (default 1)",
    )
    parser.add_argument("--label", default="", help='what the GPUs were doing, e.g. "idle" or "bf16 matmul"')
    parser.add_argument("--redact", action="store_true", help="replace serial numbers, UUIDs and process ids")
    parser.add_argument(
        "--snapshot-json",
        type=Path,
        dest="snapshot_json",
        help="also write the first poll's snapshot as gpumon once --json prints it (to compare with a replay)",
    )
    parser.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(func=run)


def polls_count(text: str) -> int:
    """``--polls``: a whole number from 1 to MAX_POLLS (argparse type)."""
    value = int(text) if text.isdigit() else 0
    if not 1 <= value <= MAX_POLLS:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_POLLS}, got {text!r}")
    return value


def poll_interval_seconds(text: str) -> float:
    """``--interval-seconds``: seconds from 0 to 3600 (argparse type; NaN and inf refused)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 3600.0:
        raise argparse.ArgumentTypeError(f"must be seconds from 0 to 3600, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """The command: record, write the file, say what was written."""
    logging.basicConfig(level=getattr(logging, (args.log_level or "error").upper()))
    request = RecordRequest(args.polls, args.interval_seconds, args.label, args.redact)
    output = args.output or Path(f"gpumon-recording-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json")
    try:
        recording, first = record(request)
    except RuntimeError as exc:
        print(f"gpumon record: {exc}", file=sys.stderr)
        return EXIT_FAULT
    text = recording.dumps()
    try:
        output.write_text(text, encoding="utf-8")
        if args.snapshot_json is not None:
            from gpumon.model.snapshot import to_jsonable
            from gpumon.util.jsonout import emit_json

            emit_json(to_jsonable(first), str(args.snapshot_json))
    except OSError as exc:
        print(f"gpumon record: cannot write {exc.filename or output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    h = recording.header
    print(
        f"gpumon record: {h['polls']} poll(s) of {h['gpus']} GPU(s) ({', '.join(h['models']) or 'none'}), "
        f"{len(recording.calls)} questions, {len(text.encode()) / 1024:.1f} KiB -> {output}"
    )
    print(f"play it: gpumon once --backend replay:{output}")
    return EXIT_OK


def record(
    request: RecordRequest,
    binding: Any | None = None,
    sleep: Callable[[float], None] | None = None,
) -> tuple[Recording, Snapshot]:
    """Poll ``request.polls`` times over a recorder; the recording and the first poll's snapshot.

    ``binding``: the pynvml module to record (None: the installed nvidia-ml-py; tests pass
    tests/fake_pynvml.py). Between polls the backend waits on NVML's event set (``sleep``
    instead, when given: tests). Raises RuntimeError when NVML is unavailable.
    """
    from gpumon.backends.nvml import NvmlBackend
    from gpumon.backends.recorder import RecordingNvml
    from gpumon.collect.poller import Poller
    from gpumon.collect.processes import enrich
    from gpumon.collect.store import SnapshotStore
    from gpumon.model.poll_intervals import PollIntervals

    recording = Recording()

    def recorder(nv: Any) -> RecordingNvml:
        return RecordingNvml(nv, recording, redact=request.redact)

    backend = NvmlBackend.from_system(wrap=recorder) if binding is None else NvmlBackend(recorder(binding))
    every = max(request.interval_seconds, 0.001)

    poller = Poller(backend, SnapshotStore(), PollIntervals(every, every, every), enrich_processes=enrich)
    first = poller.poll()
    if not first.nvml_up:
        backend.shutdown()
        raise RuntimeError(f"NVML unavailable: {first.nvml_error}; nothing recorded")
    for _ in range(request.polls - 1):
        _wait(backend, request.interval_seconds, sleep)
        poller.poll()
    host = backend.host()
    backend.shutdown()
    recording.header = {
        "made_at": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}",
        "gpumon": __version__,
        "binding": _binding_version(),
        "driver_version": host.driver_version,
        "nvml_version": host.nvml_version,
        "cuda_driver_version": host.cuda_driver_version,
        "models": sorted({g.name for g in first.gpus if g.name}),
        "gpus": len(first.gpus),
        "polls": request.polls,
        "interval_seconds": request.interval_seconds,
        "label": request.label,
        "redacted": request.redact,
        "python": platform.python_version(),
    }
    return recording, first


def _wait(backend: Any, seconds: float, sleep: Callable[[float], None] | None) -> None:
    """``seconds`` spent waiting on NVML's event set (so the recording holds its answers), or ``sleep``."""
    if sleep is not None:
        backend.wait_events(0.0)
        sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        backend.wait_events(left)


def _binding_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        return None
