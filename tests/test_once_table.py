"""``gpumon once`` in an 80-column terminal: every GPU's figures are readable, as nvidia-smi's are;
the wide table comes on request (--wide) or in a wide terminal; simulated GPUs say so."""

from __future__ import annotations

import dataclasses
import io
import re
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.commands.table import print_snapshot
from gpumon.model.snapshot import ProcessSnapshot, Snapshot

REPO = Path(__file__).resolve().parent.parent
H100 = "NVIDIA H100 80GB HBM3"
CONTAINER = "3f4e9a0c1b2d" * 5 + "abcd"


def h100_host(names: tuple[str, ...] = (H100,) * 8, simulated: bool = False) -> Snapshot:
    """Eight H100s, one power-capped and thermally slowed, each with a process in a container."""
    snapshot = Poller(FakeBackend.plausible(len(names)), SnapshotStore()).poll()
    gpus = tuple(
        dataclasses.replace(
            gpu,
            name=names[gpu.index],
            clock_events_active={"sw_power_cap": gpu.index == 3, "hw_thermal_slowdown": gpu.index == 3},
            processes=(
                ProcessSnapshot(
                    pid=120_000 + gpu.index,
                    used_memory_bytes=(gpu.index + 1) << 33,
                    name="python3 train_llama.py --config big.yaml",
                    user="alice",
                    container_id=CONTAINER,
                ),
            ),
        )
        for gpu in snapshot.gpus
    )
    return dataclasses.replace(snapshot, gpus=gpus, host=dataclasses.replace(snapshot.host, simulated=simulated))


def render(snapshot: Snapshot, width: int, wide: bool | None = None, terminal: bool = True) -> str:
    out = io.StringIO()
    print_snapshot(snapshot, Console(file=out, width=width, force_terminal=terminal, color_system=None), wide=wide)
    return out.getvalue()


def gpu_rows(text: str) -> dict[int, str]:
    return {int(m.group(1)): line for line in text.splitlines() if (m := re.match(r"\s*│?\s*(\d)\s", line))}


def test_the_default_table_of_eight_h100s_fits_80_columns_with_every_figure_readable() -> None:
    text = render(h100_host(), 80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
    assert H100 in text, "the GPUs' name is shown whole"
    rows = gpu_rows(text.split("Compute processes")[0])
    assert sorted(rows) == list(range(8)), text
    for row in rows.values():  # temperature, power / cap, utilisation, one process each
        assert re.search(r"\d+°C .* \d+/700 .* \d+% .* \b1\s*$", row), row
    assert "sw_power_cap" in rows[3]
    assert CONTAINER[:12] in text and CONTAINER not in text.replace("\n", "") and "120003" in text, (
        "the processes table shows who holds each GPU"
    )


def test_gpus_of_different_names_get_a_name_column_in_80_columns() -> None:
    names = (H100,) * 4 + ("NVIDIA A100-SXM4-80GB",) * 4
    text = render(h100_host(names), 80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "…" not in text, text
    assert "Name" in text and "A100" in text and "H100" in text
    rows = gpu_rows(text.split("Compute processes")[0])
    assert sorted(rows) == list(range(8)), text
    for row in rows.values():
        assert re.search(r"\d+°C .* \d+/700 .* \d+% .* \b1\s*$", row), row


def test_a_lost_gpu_says_lost_in_80_columns() -> None:
    snapshot = h100_host()
    lost = dataclasses.replace(snapshot.gpus[5], up=False, lost_reason="GPU is lost")
    snapshot = dataclasses.replace(snapshot, gpus=(*snapshot.gpus[:5], lost, *snapshot.gpus[6:]))
    text = render(snapshot, 80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "LOST" in gpu_rows(text.split("Compute processes")[0])[5] and "GPU is lost" in text


def test_wide_detail_on_request_or_in_a_wide_terminal() -> None:
    for text in (render(h100_host(), 200, wide=True), render(h100_host(), 200)):
        assert "Bus-Id" in text and "NVLink" in text and "ECC" in text, text
    assert "Bus-Id" not in render(h100_host(), 120), "a 120-column terminal gets the narrow table"
    assert "Bus-Id" not in render(h100_host(), 200, terminal=False), "a pipe gets the narrow table"


def test_simulated_gpus_say_so_and_real_ones_do_not() -> None:
    for wide in (False, True):
        assert "simulated" in render(h100_host(simulated=True), 200, wide=wide)
        assert "simulated" not in render(h100_host(simulated=False), 200, wide=wide)


def test_once_of_the_fake_backend_in_a_pipe_is_80_columns_and_marked_simulated() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpumon", "once", "--backend", "fake", "--fake-gpus", "8"],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 80, result.stdout
    assert "(simulated)" in result.stdout and "NVIDIA H200" in result.stdout
    wide = subprocess.run(
        [sys.executable, "-m", "gpumon", "once", "--backend", "fake", "--fake-gpus", "2", "--wide"],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert wide.returncode == 0 and "Bus-Id" in wide.stdout, wide.stderr
