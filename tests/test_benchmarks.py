"""The benchmarks stay runnable: the bare pynvml reference covers every reader group of the backend."""

from __future__ import annotations

import sys
from pathlib import Path

from gpumon.backends.nvml import NvmlBackend
from gpumon.model.snapshot import Tier
from tests.fake_pynvml import FakeGpu, FakeNvml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def test_bare_reference_replays_the_calls_of_every_backend_reader() -> None:
    import bench_nvml_calls

    nv = FakeNvml([FakeGpu(index=0, fans_percent=[40]), FakeGpu(index=1)])
    backend = NvmlBackend(nv)
    backend.init()
    with bench_nvml_calls.recorded_groups(nv, 2) as groups:
        bench_nvml_calls.replay(groups[-1]["fast"])  # on the raw module
    readers = {name for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC) for name in bench_nvml_calls.reader_names(tier)}
    assert readers == set(groups[0]), "the recorded reference follows the backend's readers"
    recorded = {fn.__name__ for calls in groups[0].values() for fn, _, _ in calls}
    assert {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetP2PStatus"} <= recorded
    fast = {fn.__name__ for fn, _, _ in groups[-1]["fast"]}
    assert "nvmlDeviceGetFanSpeed_v2" in fast and "nvmlDeviceGetTotalEnergyConsumption" not in fast
    backend.shutdown()


def test_nvml_calls_benchmark_runs_on_the_fake() -> None:
    out = _quick("bench_nvml_calls.py")
    assert "full FAST read, 2 GPU(s)" in out and "ratio gpumon / bare pynvml" in out


def test_poll_pieces_benchmark_times_each_piece_and_the_floor_against_the_bare_calls() -> None:
    out = _quick("bench_poll_pieces.py")
    assert "Poller.poll() over a constant backend" in out and "SnapshotStore.publish" in out
    assert "hand-written read of the usual FAST fields" in out and "bare pynvml loop over the same calls" in out


def _quick(script: str, *args: str) -> str:
    import subprocess

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / script
    done = subprocess.run([sys.executable, str(bench), "--quick", *args], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_scale_benchmark_scrapes_a_real_daemon_in_every_variant() -> None:
    out = _quick("bench_fake_scale.py")
    for variant in ("text ", "text+gzip", "openmetrics+gzip", "generate_latest (reference)"):
        assert variant in out


def test_scale_benchmark_runs_with_the_dcgm_names() -> None:
    out = _quick("bench_fake_scale.py", "--compat", "dcgm")
    assert "--compat dcgm" in out and "openmetrics+gzip" in out


def test_daemon_cpu_benchmark_reports_cpu_rss_and_threads() -> None:
    out = _quick("bench_daemon_cpu.py")
    assert "% core/GPU" in out and "RSS MiB" in out and "threads" in out


def test_side_by_side_daemon_benchmark_reports_both_checkouts() -> None:
    this_checkout = str(Path(__file__).resolve().parent.parent)
    out = _quick("bench_daemon_ab.py", this_checkout)
    assert "reference: " in out and "other: " in out and "ratio other / reference: CPU" in out


def test_poll_parts_benchmark_reports_each_part_against_another_checkout() -> None:
    this_checkout = str(Path(__file__).resolve().parent.parent)
    out = _quick("bench_poll_parts.py", "--reference", this_checkout)
    for part in ("poll (reference)", "scrape body", "backend reads", "listener AlertService.on_snapshot", "prepare:"):
        assert part in out, out
    assert "ratio" in out


def test_alert_rules_benchmark_fires_the_alerts_it_times_against_another_checkout() -> None:
    this_checkout = str(Path(__file__).resolve().parent.parent)
    out = _quick("bench_alert_rules.py", "--gpus", "2", "--reference", this_checkout)
    [fired] = [line.split()[-1] for line in out.splitlines() if "firing GpuMemoryHigh: alerts firing" in line]
    assert float(fired) >= 2, out
    assert "simulation" in out and "ratio" in out


def test_memory_benchmark_sums_the_daemon_and_its_reference_by_what_they_hold() -> None:
    import subprocess

    bench = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_memory.py"
    args = ["--backend", "fake", "--fake-gpus", "2", "--seconds", "1", "--libraries", "3"]
    done = subprocess.run([sys.executable, str(bench), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = {line[:56].strip(): line[56:].split() for line in done.stdout.splitlines() if not line.startswith("#")}
    libraries = done.stdout.split("file mapped (largest RSS in gpumon)")[1].strip().splitlines()[1:]
    assert len(libraries) == 3 and all(float(line.split()[1]) > 0 for line in libraries), done.stdout
    gpumon_rss, _, bare_rss, _ = map(float, rows["total"])
    assert gpumon_rss > bare_rss > 0
    assert float(rows["anonymous (Python objects, malloc, thread stacks)"][0]) > 0
    assert "gpumon over the reference" in done.stdout


def test_the_memory_benchmarks_say_when_gpumon_runs_without_its_bytecode(tmp_path: Path) -> None:
    """A copy of the tree without bytecode compiles every module at start: its RSS is not an
    installed daemon's, and the benchmarks that report RSS say so."""
    import compileall

    import daemon_proc

    package = tmp_path / "gpumon"
    (package / "exporter").mkdir(parents=True)
    for module in ("__init__.py", "daemon.py", "exporter/__init__.py"):
        (package / module).write_text("x = 1\n")
    note = daemon_proc.bytecode_note(tmp_path)
    assert note is not None and "3 of gpumon's 3 modules have no compiled bytecode" in note
    assert f"python3 -m compileall -q {package}" in note
    assert compileall.compile_dir(str(package), quiet=1)
    assert daemon_proc.bytecode_note(tmp_path) is None


def test_reuse_benchmark_times_each_step_reused_and_made_again() -> None:
    out = _quick("bench_reuse.py")
    assert "scrape after a poll" in out and "no GPU changed" in out and "every GPU changed" in out
    assert "snapshot scraped before" in out and "fresh collector" in out


def test_side_by_side_ratio_line_is_printed_even_when_a_window_holds_no_clock_tick() -> None:
    import bench_daemon_ab

    assert bench_daemon_ab.ratio(0.0, 0.0) == "n/a"
    assert bench_daemon_ab.ratio(0.5, 0.25) == "2.00"


def test_health_parts_benchmark_times_the_engines_and_the_report_hot_and_cold_against_another_checkout() -> None:
    this_checkout = str(Path(__file__).resolve().parent.parent)
    out = _quick("bench_health_parts.py", "--reference", this_checkout)
    for part in (
        "hot: health engines (on_snapshot)",
        "cold: … observe stragglers",
        "cold: alert tick's findings (_read_findings)",
    ):
        assert part in out, out
    assert "ratio" in out


def test_poll_calls_benchmark_counts_gpumons_calls_apart_from_the_binding() -> None:
    out = _quick("bench_poll_calls.py")
    assert "Python calls, gpumon's own" in out and "binding (tests/fake_pynvml.py)" in out
    assert "gpumon/backends/nvml/core.py" in out and "gpumon/collect/poller.py" in out
