"""Which processes run together: the ranks of one job share a launcher, jobs started one by one do not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from gpumon.collect.processes import enrich
from gpumon.model.snapshot import ProcessSnapshot
from tests.helpers import wait_for


def fake_proc(root: Path, pid: int, parent: int, session: int) -> None:
    """A /proc/PID with the stat fields the launcher is read from (ppid, session)."""
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text("python3\n")
    (d / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    (d / "cgroup").write_text("0::/user.slice/user-0.slice/session-1.scope\n")
    fields = ["S", str(parent), str(pid), str(session), "0", "-1", "4194560"] + ["0"] * 12 + ["4242"] + ["0"] * 30
    (d / "stat").write_text(f"{pid} (python3) " + " ".join(fields) + "\n")


def launchers(root: Path, *pids: int) -> list[int | None]:
    return [p.launcher_pid for p in enrich([ProcessSnapshot(pid=pid) for pid in pids], proc_root=root)]


def test_ranks_of_one_job_share_their_launcher_and_a_job_started_from_a_shell_is_its_own(tmp_path: Path) -> None:
    fake_proc(tmp_path, 50, 1, 50)  # a login shell: a session leader
    fake_proc(tmp_path, 100, 50, 50)  # torchrun, started from the shell
    fake_proc(tmp_path, 101, 100, 101)  # its ranks, each in a session of its own (torchrun does so)
    fake_proc(tmp_path, 102, 100, 102)
    fake_proc(tmp_path, 300, 50, 50)  # another job from the same shell, on one GPU
    assert launchers(tmp_path, 101, 102, 300, 100) == [100, 100, 300, 100]


def test_a_process_whose_parent_is_init_or_gone_is_its_own_launcher(tmp_path: Path) -> None:
    fake_proc(tmp_path, 200, 1, 200)
    fake_proc(tmp_path, 201, 999, 1)  # its parent has exited
    assert launchers(tmp_path, 200, 201) == [200, 201]


def test_the_real_proc_a_multiprocessing_like_job_and_a_job_beside_it() -> None:
    """A session leader starts a launcher with two workers, and one more process of its own."""
    script = (
        "import subprocess, sys\n"
        "sleep = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        "launcher = subprocess.Popen([sys.executable, '-c', "
        "'import subprocess, sys, time; "
        "w = [subprocess.Popen(sys.argv[1:]) for _ in range(2)]; "
        "print(*[p.pid for p in w], flush=True); time.sleep(60)'] + sleep, stdout=subprocess.PIPE, text=True)\n"
        "other = subprocess.Popen(sleep)\n"
        "print(launcher.pid, launcher.stdout.readline().strip(), other.pid, flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    leader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert leader.stdout is not None
        line = wait_for(leader.stdout.readline, 20, what="the pids")
        launcher, worker_a, worker_b, other = (int(x) for x in line.split())
        found = launchers(Path("/proc"), worker_a, worker_b, other, launcher)
        assert found == [launcher, launcher, other, launcher]
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait(10)
