"""gpumon record and --backend replay:FILE: what is recorded is what the replay answers.

The recordings here are made from tests/fake_pynvml.py (a two-GPU H200 board with NVLink, P2P,
processes, GPM, fields NVML refuses, XID events), so every kind of answer is covered; the
recordings of real hosts are replayed by tests/test_replay_real_hosts.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.backends.base import ScenarioError
from gpumon.backends.nvml import NvmlBackend
from gpumon.backends.recorder import RecordingNvml
from gpumon.backends.recording import Recording, RecordingError, load, loads
from gpumon.backends.replay import ReplayBackend, ReplayNvml, replay_backend
from gpumon.commands.record import RecordRequest, record
from gpumon.model.snapshot import Tier, to_jsonable
from tests.fake_pynvml import NOT_SUPPORTED, FakeNvml, h200_pair
from tests.helpers import examples

TIERS = (Tier.STATIC, Tier.SLOW, Tier.FAST)


def busy_pair() -> FakeNvml:
    """Two H200s with a job, GPM figures, a field that fails, a P2P capability that raises, no fan."""
    nv = h200_pair()
    gpu0, gpu1 = nv.gpus
    gpu0.processes = [(4242, 3 << 30), (4243, None)]
    gpu0.process_samples = [(4242, 10, 97)]
    gpu0.gpm_metrics = {2: 95.0, 5: 88.0, 10: 40.0, 20: 12.5}
    gpu1.gpm_supported = False
    gpu1.field_errors = {230: 999}  # the recovery action answers UNKNOWN
    gpu0.p2p_errors = {0}
    gpu1.memory_temperature = None
    return nv


def read_all(backend: Any, polls: int, between: Any = None) -> list[dict[tuple[int, str], dict[str, Any]]]:
    """Every tier of every GPU, ``polls`` times; ``between(poll)`` runs after each poll."""
    reads = []
    for poll in range(polls):
        reads.append({(i, t.value): dict(backend.read(i, t)) for i in range(backend.device_count()) for t in TIERS})
        if between is not None:
            between(poll)
    return reads


def recorded(nv: FakeNvml, polls: int = 3, redact: bool = False) -> tuple[Recording, list[Any], list[Any]]:
    """Record ``polls`` reads of every tier (the GPUs warming up between polls); the recording, the reads
    and the XID events the recording saw."""
    recording = Recording()
    backend = NvmlBackend(RecordingNvml(nv, recording, redact=redact))
    backend.init()
    events: list[Any] = []

    def warm_up(poll: int) -> None:
        for g in nv.gpus:
            g.power_mw += 150_000
            g.energy_mj += 40_000
            g.temperature += 3
        if poll == 0:
            nv.push_event(1, 79)
        events.extend(backend.wait_events(0.05))

    reads = read_all(backend, polls, warm_up)
    backend.shutdown()
    return recording, reads, events


def replayed(recording: Recording) -> ReplayBackend:
    backend = ReplayBackend(ReplayNvml(loads(recording.dumps())))
    backend.init()
    return backend


def test_the_replay_reads_what_the_recorded_gpus_read_poll_by_poll() -> None:
    recording, reads, _ = recorded(busy_pair())
    backend = replayed(recording)
    assert read_all(backend, len(reads)) == reads
    assert backend.replay.unanswered == set()
    assert reads[0][(1, "slow")] != reads[2][(1, "slow")]  # the values moved: the order of answers is kept


def test_after_the_last_poll_the_gpus_keep_their_last_answers() -> None:
    recording, reads, _ = recorded(busy_pair(), polls=3)  # GPM's third poll asks only for the metrics it has
    backend = replayed(recording)
    later = read_all(backend, 5)
    assert later[3] == later[4] == reads[-1]


def test_an_xid_event_recorded_is_replayed_once_then_the_wait_times_out() -> None:
    recording, _, events = recorded(busy_pair())
    assert [(e.gpu_index, e.xid) for e in events] == [(1, 79)]
    backend = replayed(recording)
    read_all(backend, 1)
    seen = [(e.gpu_index, e.xid, e.uuid) for _ in range(4) for e in backend.wait_events(0.01)]
    assert seen == [(1, 79, backend.uuid(1))]


def test_what_nvml_refused_is_refused_again() -> None:
    recording, _, _ = recorded(busy_pair(), polls=1)
    text = recording.dumps()
    assert '"nvmlDeviceGetFanSpeed_v2' not in text  # no fan: NumFans answered 0, nothing more asked
    assert json.dumps({"error": NOT_SUPPORTED}) in text
    assert '"raise": "ArgumentError"' in text  # P2P read capability, as DESIGN.md saw it
    backend = replayed(recording)
    (read,) = read_all(backend, 1)
    assert "memory_temperature_celsius" not in read[(1, "fast")]
    assert "recovery_action" not in read[(1, "slow")]
    assert backend.read_errors() == {(1, backend.uuid(1), "recovery_action"): 1}


def test_the_file_is_versioned_text_naming_the_host(tmp_path: Path) -> None:
    nv = busy_pair()
    recording, first = record(
        RecordRequest(polls=3, interval_seconds=0.0, label="idle"), binding=nv, sleep=lambda s: None
    )
    path = tmp_path / "rec.json"
    path.write_text(recording.dumps())
    raw = json.loads(path.read_text())
    assert (raw["format"], raw["version"]) == ("gpumon-nvml-recording", 1)
    assert raw["driver_version"] == nv.driver_version and raw["nvml_version"] == nv.nvml_version
    assert raw["models"] == ["NVIDIA H200"] and raw["gpus"] == 2 and raw["polls"] == 3
    assert raw["label"] == "idle" and raw["redacted"] is False and raw["made_at"].endswith("Z")
    assert first.gpus[0].power_watts == 75.5 and len(first.gpus) == 2


def test_record_through_the_poller_replays_to_the_same_snapshot(tmp_path: Path) -> None:
    recording, first = record(RecordRequest(polls=2, interval_seconds=0.0), binding=busy_pair(), sleep=lambda s: None)
    path = tmp_path / "rec.json"
    path.write_text(recording.dumps())
    once = subprocess.run(
        [sys.executable, "-m", "gpumon", "once", "--backend", f"replay:{path}", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert once.returncode == 0, once.stderr
    shown, expected = json.loads(once.stdout), to_jsonable(first)
    for gpu, want in zip(shown["gpus"], expected["gpus"], strict=True):
        for p in (*gpu.get("processes", ()), *want.get("processes", ())):  # names come from this host's /proc
            for key in ("name", "user", "launcher_pid", "systemd_unit", "slurm_job_id", "container_id", "pod_uid"):
                p.pop(key, None)
        assert gpu == want


def test_redact_replaces_serials_uuids_and_pids_the_same_way_everywhere() -> None:
    nv = busy_pair()
    recording, _, _ = recorded(nv, redact=True)
    text = recording.dumps()
    for secret in [g.serial for g in nv.gpus] + [g.uuid for g in nv.gpus] + ["4242", "4243"]:
        assert secret not in text
    backend = replayed(recording)
    (read,) = read_all(backend, 1)
    uuids = {backend.uuid(i) for i in range(2)}
    assert len(uuids) == 2 and all(u.startswith("GPU-") for u in uuids)
    assert read[(0, "static")]["serial"] == "REDACTED-0"
    pids = [p.pid for p in read[(0, "fast")]["processes"]]
    assert pids == [100001, 100002]
    assert read[(0, "fast")]["processes"][0].sm_utilization_ratio == 0.97  # the share follows its pid


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not JSON"),
        ('{"format": "something else"}', "not a gpumon NVML recording"),
        ('{"format": "gpumon-nvml-recording", "version": 99, "attributes": {}, "calls": {"f()": [[1, 0]]}}', "version"),
        ('{"format": "gpumon-nvml-recording", "version": 1, "attributes": {}, "calls": {"f()": [[0, 1]]}}', "count"),
        ('{"format": "gpumon-nvml-recording", "version": 1, "calls": {}}', "attributes"),
    ],
)
def test_a_file_that_is_no_recording_is_refused_with_the_reason(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(RecordingError) as caught:
        load(path)
    assert isinstance(caught.value, ScenarioError) and str(path) in str(caught.value)
    assert says in str(caught.value)


def test_gpumon_once_and_check_config_refuse_a_bad_recording(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "gpumon-nvml-recording", "version": 2}')
    once = subprocess.run(
        [sys.executable, "-m", "gpumon", "once", "--backend", f"replay:{bad}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert once.returncode == 2 and str(bad) in once.stderr
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"backend: replay:{tmp_path / 'missing.json'}\n")
    check = subprocess.run(
        [sys.executable, "-m", "gpumon", "check-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 2 and "missing.json" in check.stderr


def test_replay_backend_is_another_hosts_gpus(tmp_path: Path) -> None:
    recording, _, _ = recorded(busy_pair(), polls=1)
    path = tmp_path / "rec.json"
    path.write_text(recording.dumps())
    backend = replay_backend(path)
    assert backend.simulated and backend.name == "replay"


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["f(gpu0)", "g(gpu1, 2)"]), st.one_of(st.integers(), st.text(max_size=5))),
        min_size=1,
        max_size=30,
    )
)
def test_answers_are_played_back_in_the_order_they_were_recorded(calls: list[tuple[str, Any]]) -> None:
    recording = Recording(attributes={"f": "function"})
    for key, answer in calls:
        recording.add(key, answer)
    replay = ReplayNvml(loads(recording.dumps()))
    for key, answer in calls:
        assert replay.answer(key) == answer


def test_gpumon_record_without_nvml_writes_nothing_and_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    result = subprocess.run(
        [sys.executable, "-c", "import sys, gpumon.cli; sys.modules['pynvml'] = None; sys.exit(gpumon.cli.main())",
         "record", "-o", str(out), "--polls", "2"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1 and "NVML unavailable" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("polls", ["0", "x", "10001"])
def test_gpumon_record_refuses_a_number_of_polls_it_cannot_make(polls: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpumon", "record", "--polls", polls], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "--polls" in result.stderr


def test_a_question_the_recording_never_saw_leaves_its_field_out() -> None:
    """A newer gpumon asking something an older recording lacks: that field is absent, the rest is read."""
    recording, reads, _ = recorded(busy_pair(), polls=1)
    del recording.calls["nvmlDeviceGetPowerUsage(gpu0)"]
    backend = replayed(recording)
    (read,) = read_all(backend, 1)
    assert "power_watts" not in read[(0, "fast")] and read[(1, "fast")]["power_watts"] == 75.5
    assert read[(0, "fast")]["temperature_celsius"] == reads[0][(0, "fast")]["temperature_celsius"]
    assert backend.replay.unanswered == {"nvmlDeviceGetPowerUsage(gpu0)"}


ANSWERS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["struct", "error", "x"]), inner, max_size=2)
    ),
    max_leaves=12,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.dictionaries(st.text(min_size=1, max_size=12), st.lists(ANSWERS, min_size=1, max_size=5), min_size=1, max_size=6)
)
def test_a_recording_survives_its_own_text(calls: dict[str, list[Any]]) -> None:
    recording = Recording(header={"label": "x"}, attributes={"nvmlInit": "function"})
    for key, answers in calls.items():
        for answer in answers:
            recording.add(key, answer)
    again = loads(recording.dumps())
    assert (again.calls, again.attributes, again.header) == (recording.calls, recording.attributes, recording.header)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.text(max_size=200) | st.builds(lambda body: '{"format": "gpumon-nvml-recording", ' + body, st.text(max_size=80))
)
def test_any_text_is_a_recording_or_refused_with_reasons(text: str) -> None:
    try:
        loads(text, "t.json")
    except RecordingError as exc:
        assert exc.problems and all(p.startswith("recording t.json") for p in exc.problems)
