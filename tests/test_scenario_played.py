"""``gpumon once`` and ``gpumon health`` with a scenario show it where its faults have happened (its last
scripted event), or the tick asked with ``--tick`` (0: the first poll), and say which tick they show."""

from __future__ import annotations

import json
from pathlib import Path

from gpumon.backends.fake import FakeBackend
from gpumon.backends.scenarios import path_of
from tests.helpers import run_cli


def test_once_of_gpu_lost_shows_the_gpu_lost() -> None:
    result = run_cli("once", "--backend", "fake:gpu-lost", "--json")
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)["gpus"]
    assert [g["up"] for g in gpus] == [True, False]
    table = run_cli("once", "--backend", "fake:gpu-lost")
    assert "LOST" in table.stdout and "tick 5" in table.stdout


def test_once_tick_0_is_the_first_poll() -> None:
    result = run_cli("once", "--backend", "fake:gpu-lost", "--json", "--tick", "0")
    assert [g["up"] for g in json.loads(result.stdout)["gpus"]] == [True, True]


def test_tick_needs_a_scenario() -> None:
    result = run_cli("once", "--backend", "nvml", "--tick", "3")
    assert result.returncode == 2 and "--tick" in result.stderr


def test_health_of_gpu_lost_is_critical_and_says_it_is_simulated(tmp_path: Path) -> None:
    result = run_cli("health", "--local", "--backend", "fake:gpu-lost", "--state-dir", str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr  # CRITICAL
    assert "CRITICAL" in result.stdout.splitlines()[0]
    assert "simulated GPUs (fake:gpu-lost)" in result.stderr


def test_health_of_a_real_backend_says_nothing_of_simulation(tmp_path: Path) -> None:
    result = run_cli("health", "--local", "--state-dir", str(tmp_path))
    assert "simulated" not in result.stdout + result.stderr


def test_the_last_scripted_tick_of_each_named_scenario() -> None:
    expected = {"gpu-lost": 5, "overheating": 4, "xid-storm": 7, "healthy": 0}
    for name, tick in expected.items():
        path = path_of(name)
        assert path is not None
        assert FakeBackend.from_file(path).last_scripted_tick() == tick, name


def test_a_scripted_hang_is_not_played() -> None:
    backend = FakeBackend.from_mapping({"gpus": [{"hang_at_tick": 3, "lost_at_tick": 9}]})
    assert backend.last_scripted_tick() == 2


def test_a_scenario_whose_nvml_comes_later_is_played_until_its_gpus_appear(tmp_path: Path) -> None:
    """fake:nvml-missing (the first 3 NVML initialisations fail): the GPUs appear, with or without --tick,
    as they do in gpumon run; gpumon health judges them (issue 46, item 5)."""
    for tick in (None, 0, 5):
        args = ("once", "--backend", "fake:nvml-missing", "--json", *(() if tick is None else ("--tick", str(tick))))
        result = run_cli(*args)
        assert result.returncode == 0, result.stderr
        snapshot = json.loads(result.stdout)
        assert snapshot["nvml_up"] is True and len(snapshot["gpus"]) == 2
    health = run_cli("health", "--local", "--backend", "fake:nvml-missing", "--state-dir", str(tmp_path))
    assert health.returncode == 0 and "OK" in health.stdout, health.stdout + health.stderr
