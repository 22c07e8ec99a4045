"""Who runs on the GPU: name, user, systemd unit, container, pod and Slurm job from /proc."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpumon.collect.processes import CgroupPlace, ProcessEnricher, enrich, parse_cgroup_file, parse_cgroup_path
from gpumon.model.snapshot import ProcessSnapshot

CID = "4f8e3c2a1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f"
POD = "7d3b1c2e-4a5f-4b6c-8d7e-9f0a1b2c3d4e"
UNKNOWN_UID = 3_999_999


def fake_proc(root: Path, pid: int, comm: str, uid: int, cgroup: str, start: int = 4242) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "status").write_text(f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "cgroup").write_text(cgroup)
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")


def test_a_docker_container_process_is_attributed_to_its_container(tmp_path: Path) -> None:
    fake_proc(tmp_path, 4242, "python3", 0, f"0::/system.slice/docker-{CID}.scope\n")
    (p,) = enrich([ProcessSnapshot(pid=4242, used_memory_bytes=2**30)], proc_root=tmp_path)
    assert (p.name, p.user, p.container_id, p.systemd_unit) == ("python3", "root", CID, None)
    assert p.used_memory_bytes == 2**30


def test_a_kubernetes_pod_on_cgroup_v2_systemd_driver(tmp_path: Path) -> None:
    slice_uid = POD.replace("-", "_")
    cgroup = (
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{CID}.scope\n"
    )
    fake_proc(tmp_path, 100, "vllm", UNKNOWN_UID, cgroup)
    (p,) = enrich([ProcessSnapshot(pid=100)], proc_root=tmp_path)
    assert (p.pod_uid, p.container_id) == (POD, CID)
    assert p.user == str(UNKNOWN_UID)  # a uid the host does not know is shown as the number


def test_a_kubernetes_pod_on_cgroup_v1_cgroupfs_driver(tmp_path: Path) -> None:
    cgroup = (
        "".join(
            f"{i}:{ctrl}:/kubepods/burstable/pod{POD}/{CID}\n"
            for i, ctrl in enumerate(["cpu,cpuacct", "memory", "pids", "devices"], start=2)
        )
        + f"1:name=systemd:/kubepods/burstable/pod{POD}/{CID}\n"
    )
    fake_proc(tmp_path, 101, "trainer", 0, cgroup)
    (p,) = enrich([ProcessSnapshot(pid=101)], proc_root=tmp_path)
    assert (p.pod_uid, p.container_id) == (POD, CID)


def test_a_slurm_job_step(tmp_path: Path) -> None:
    v1 = "5:devices:/slurm/uid_1000/job_1234/step_0/task_0\n4:memory:/slurm/uid_1000/job_1234/step_0/task_0\n"
    fake_proc(tmp_path, 200, "a.out", 0, v1)
    v2 = "0::/system.slice/slurmstepd.scope/job_5678/step_batch/user/task_0\n"
    fake_proc(tmp_path, 201, "a.out", 0, v2)
    p1, p2 = enrich([ProcessSnapshot(pid=200), ProcessSnapshot(pid=201)], proc_root=tmp_path)
    assert p1.slurm_job_id == "1234"
    assert (p2.slurm_job_id, p2.systemd_unit) == ("5678", "slurmstepd.scope")


def test_a_systemd_service_and_a_login_session(tmp_path: Path) -> None:
    fake_proc(tmp_path, 300, "inference", 0, "0::/system.slice/inference.service\n")
    fake_proc(tmp_path, 301, "python", 0, "0::/user.slice/user-1000.slice/session-3.scope\n")
    p1, p2 = enrich([ProcessSnapshot(pid=300), ProcessSnapshot(pid=301)], proc_root=tmp_path)
    assert p1.systemd_unit == "inference.service"
    assert p2.systemd_unit == "session-3.scope"
    assert (p1.container_id, p1.pod_uid, p1.slurm_job_id) == (None, None, None)


def test_a_process_that_vanished_is_kept_as_nvml_gave_it(tmp_path: Path) -> None:
    given_by_nvml = ProcessSnapshot(pid=999, used_memory_bytes=123, name="/usr/bin/python3")
    assert enrich([given_by_nvml], proc_root=tmp_path) == (given_by_nvml,)


def test_fields_the_backend_filled_are_kept(tmp_path: Path) -> None:
    fake_proc(tmp_path, 400, "python3", 0, "0::/system.slice/x.service\n")
    (p,) = enrich([ProcessSnapshot(pid=400, user="alice")], proc_root=tmp_path)
    assert (p.user, p.name, p.systemd_unit) == ("alice", "python3", "x.service")


def test_the_cache_skips_rereading_a_known_process_but_not_a_reused_pid(tmp_path: Path) -> None:
    fake_proc(tmp_path, 500, "first", 0, "0::/system.slice/a.service\n", start=1000)
    enricher = ProcessEnricher(proc_root=tmp_path)
    assert enricher.enrich([ProcessSnapshot(pid=500)])[0].name == "first"
    (tmp_path / "500" / "comm").write_text("renamed\n")  # same process: cached answer
    assert enricher.enrich([ProcessSnapshot(pid=500)])[0].name == "first"
    import shutil

    shutil.rmtree(tmp_path / "500")
    fake_proc(tmp_path, 500, "second", 0, "0::/system.slice/b.service\n", start=2000)  # pid reused
    (p,) = enricher.enrich([ProcessSnapshot(pid=500)])
    assert (p.name, p.systemd_unit) == ("second", "b.service")


def test_the_real_proc_of_this_test_process() -> None:
    (p,) = enrich([ProcessSnapshot(pid=os.getpid())])
    assert p.name is not None and p.name.startswith(("python", "pytest"))
    assert p.user == pwd.getpwuid(os.getuid()).pw_name


# ---- cgroup parser properties ------------------------------------------------
_hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_uuid = st.uuids().map(str)
_unit_name = st.from_regex(r"[a-z][a-z0-9\-]{0,20}", fullmatch=True).filter(
    lambda s: not s.startswith(("docker-", "cri-containerd-", "crio-", "libpod-")) and "slurm" not in s
)


@given(cid=_hex64, runtime=st.sampled_from(["docker", "cri-containerd", "crio", "libpod"]))
def test_systemd_container_scopes_round_trip(cid: str, runtime: str) -> None:
    place = parse_cgroup_path(f"/system.slice/{runtime}-{cid}.scope")
    assert place == CgroupPlace(container_id=cid)


@given(uid=_uuid, cid=_hex64, qos=st.sampled_from(["", "burstable", "besteffort"]), systemd=st.booleans())
def test_kubernetes_pod_paths_round_trip(uid: str, cid: str, qos: str, systemd: bool) -> None:
    if systemd:
        qos_slice = f"kubepods-{qos}.slice/" if qos else ""
        pod_slice = f"kubepods-{qos + '-' if qos else ''}pod{uid.replace('-', '_')}.slice"
        path = f"/kubepods.slice/{qos_slice}{pod_slice}/cri-containerd-{cid}.scope"
    else:
        path = f"/kubepods/{qos + '/' if qos else ''}pod{uid}/{cid}"
    place = parse_cgroup_path(path)
    assert (place.pod_uid, place.container_id) == (uid, cid)


@given(
    job=st.integers(min_value=1, max_value=10**9),
    uid=st.integers(min_value=0, max_value=10**6),
    host=st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True),
    step=st.sampled_from(["step_0", "step_batch", "step_extern", "step_12"]),
    layout=st.sampled_from(["v1", "v1host", "v2"]),
)
def test_slurm_paths_round_trip(job: int, uid: int, host: str, step: str, layout: str) -> None:
    path = {
        "v1": f"/slurm/uid_{uid}/job_{job}/{step}/task_0",
        "v1host": f"/slurm_{host}/uid_{uid}/job_{job}/{step}",
        "v2": f"/system.slice/slurmstepd.scope/job_{job}/{step}/user/task_0",
    }[layout]
    assert parse_cgroup_path(path).slurm_job_id == str(job)


@given(unit=_unit_name, kind=st.sampled_from(["service", "scope"]), user=st.integers(min_value=0, max_value=10**6))
def test_systemd_units_round_trip(unit: str, kind: str, user: int) -> None:
    assert parse_cgroup_path(f"/system.slice/{unit}.{kind}").systemd_unit == f"{unit}.{kind}"
    nested = f"/user.slice/user-{user}.slice/user@{user}.service/app.slice/{unit}.{kind}"
    assert parse_cgroup_path(nested).systemd_unit == f"user@{user}.service"  # the user named the unit inside


@given(st.text(max_size=400))
def test_the_cgroup_parser_never_raises(text: str) -> None:
    parse_cgroup_file(text)
    parse_cgroup_path(text)


@pytest.mark.parametrize(
    "line",
    [
        f"0::/machine.slice/libpod-{CID}.scope/container\n",
        f"1:name=systemd:/system.slice/containerd.service/kubepods-besteffort-pod{POD.replace('-', '_')}.slice:cri-containerd:{CID}\n",
        f"12:pids:/docker/{CID}\n",
    ],
)
def test_other_container_layouts(line: str) -> None:
    assert parse_cgroup_file(line).container_id == CID
