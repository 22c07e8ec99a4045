"""Attribution trusts a cgroup only where the system made it (issue 36, item 6): a user who may create
cgroups (their systemd user manager's delegated subtree, a service with Delegate=yes, the user
cgroup of a Slurm step, the inside of a container) cannot claim a Slurm job, pod or container
with a directory name, so neither the process labels nor the straggler groups can be spoofed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpumon.collect.energy import owner_of
from gpumon.collect.processes import ProcessEnricher, enrich, parse_cgroup_path
from gpumon.health.stragglers import job_key
from gpumon.model.snapshot import ProcessSnapshot

CID = "4f8e3c2a1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f"
FAKE_CID = "a" * 64
POD = "7d3b1c2e-4a5f-4b6c-8d7e-9f0a1b2c3d4e"
FAKE_POD = "11111111-2222-4333-8444-555555555555"
pytestmark = pytest.mark.faults  # the daemon under faults, as a user meets them: make test-faults
USER_TREE = "/user.slice/user-1000.slice/user@1000.service/app.slice"


@pytest.mark.parametrize(
    "path",
    [
        f"{USER_TREE}/slurm/job_4242/task_0",
        f"{USER_TREE}/slurmstepd.scope/job_4242",
        f"{USER_TREE}/docker-{FAKE_CID}.scope",
        f"{USER_TREE}/kubepods-pod{FAKE_POD.replace('-', '_')}.slice/cri-containerd-{FAKE_CID}.scope",
        f"{USER_TREE}/kubepods/pod{FAKE_POD}/{FAKE_CID}",
        "/user.slice/user-1000.slice/session-3.scope/slurm/job_4242",  # not where slurmstepd puts jobs
        "/system.slice/myslurm-tools.service/job_4242",
    ],
)
def test_a_user_made_cgroup_claims_no_job_pod_or_container(path: str) -> None:
    place = parse_cgroup_path(path)
    assert (place.slurm_job_id, place.pod_uid, place.container_id) == (None, None, None)


@pytest.mark.parametrize(
    ("path", "container", "pod", "job"),
    [
        # a container that makes cgroups of its own (systemd or kind inside docker): the outer one counts
        (f"/system.slice/docker-{CID}.scope/kubepods/pod{FAKE_POD}/{FAKE_CID}", CID, None, None),
        # the user cgroup slurmstepd delegates to the job's user: the job counts, claims under it do not
        (f"/system.slice/slurmstepd.scope/job_77/step_0/user/docker-{FAKE_CID}.scope", None, None, "77"),
        (f"/system.slice/slurmstepd.scope/job_77/step_0/user/kubepods-pod{FAKE_POD}.slice", None, None, "77"),
        ("/slurm/uid_1000/job_77/step_0/job_4242", None, None, "77"),
        # a pod and its container, as kubelet makes them: both count
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
            f"cri-containerd-{CID}.scope",
            CID,
            POD,
            None,
        ),
    ],
)
def test_claims_nested_inside_a_job_or_container_do_not_override_it(
    path: str, container: str | None, pod: str | None, job: str | None
) -> None:
    place = parse_cgroup_path(path)
    assert (place.container_id, place.pod_uid, place.slurm_job_id) == (container, pod, job)


def _proc(root: Path, pid: int, cgroup: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text("python3\n")
    (d / "status").write_text("Name:\tpython3\nUid:\t1000\t1000\t1000\t1000\n")
    (d / "cgroup").write_text(cgroup)
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + ["4242"] + ["0"] * 30
    (d / "stat").write_text(f"{pid} (python3) " + " ".join(fields) + "\n")


def test_a_cgroup_directory_a_user_owns_is_not_trusted(tmp_path: Path) -> None:
    """A service with Delegate=yes running as uid 1000 made ``docker-ID.scope`` and ``job_N`` under itself:
    the directories are the user's (the cgroup file system says so), and claim nothing."""
    cgroups = tmp_path / "cgroup"
    made_by_root = cgroups / "system.slice" / f"docker-{CID}.scope"
    delegated = cgroups / "system.slice" / "tenant.service"
    made_by_user = delegated / f"docker-{FAKE_CID}.scope"
    made_by_user.mkdir(parents=True)
    made_by_root.mkdir(parents=True)
    for d in (delegated, made_by_user):
        os.chown(d, 1000, 1000)
    proc = tmp_path / "proc"
    _proc(proc, 10, f"0::/system.slice/docker-{CID}.scope\n")
    _proc(proc, 11, f"0::/system.slice/tenant.service/docker-{FAKE_CID}.scope\n")
    real, spoofed = ProcessEnricher(proc, cgroup_root=cgroups).enrich(
        [ProcessSnapshot(pid=10), ProcessSnapshot(pid=11)]
    )
    assert real.container_id == CID
    assert spoofed.container_id is None and spoofed.systemd_unit == "tenant.service"


def test_a_user_cannot_join_another_users_slurm_job_for_the_straggler_groups(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _proc(proc, 20, "0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n")
    _proc(proc, 21, f"0::{USER_TREE}/slurmstepd.scope/job_77/step_0/user/task_0\n")
    job, intruder = enrich([ProcessSnapshot(pid=20), ProcessSnapshot(pid=21)], proc_root=proc)
    assert job_key(job) == "slurm:77"
    assert job_key(intruder) != "slurm:77"


def test_a_unit_named_inside_a_delegated_cgroup_does_not_get_the_energy(tmp_path: Path) -> None:
    """Issue 42 item 5: a user with a delegated cgroup made ``alice-train.service`` inside it, and energy
    was booked to that name when no job, pod or container claimed the process. The unit is the one the
    system named: the delegated service itself, or the user's systemd manager."""
    cgroups = tmp_path / "cgroup"
    delegated = cgroups / "system.slice" / "tenant.service"
    (delegated / "alice-train.service").mkdir(parents=True)
    for d in (delegated, delegated / "alice-train.service"):
        os.chown(d, 1000, 1000)
    proc = tmp_path / "proc"
    _proc(proc, 11, "0::/system.slice/tenant.service/alice-train.service\n")
    _proc(proc, 12, "0::/user.slice/user-1000.slice/user@1000.service/app.slice/alice-train.service\n")
    in_service, in_session = ProcessEnricher(proc, cgroup_root=cgroups).enrich(
        [ProcessSnapshot(pid=11), ProcessSnapshot(pid=12)]
    )
    assert owner_of(in_service) == ("systemd_unit", "tenant.service")
    assert owner_of(in_session) == ("systemd_unit", "user@1000.service")
