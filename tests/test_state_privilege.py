"""Nothing the service user (or anyone) plants in the state directory makes root change another file.

The shipped unit runs the daemon as a service user that owns the state directory; ``gpumon health``
and ``gpumon burn`` also run there as root (under slurmd). Each test here is root working in a state
directory the user ``nobody`` owns, with what ``nobody`` could have put there: a symbolic link to a
root-owned file (the password database, here a stand-in), a hard link, a folder swapped for a link to
a root folder, a folder left writable by every user under a umask of 000. Root must leave the target as
it was, and folders root makes belong to the state directory's owner."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpumon.state.burn_record import StateFiles, burn_dir
from gpumon.util.state.anchored import UnsafePath
from gpumon.util.state.files import append_line, close_tree_to_others, ensure_dir, write_json
from gpumon.util.state.lock import CHECK_LOCK_NAME, DaemonLock, state_lock
from tests.helpers import REPO, DaemonProcess

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root (to act for a service user) and setpriv"
)

NOBODY = pwd.getpwnam("nobody")
SECRET = "root:x:0:0:root:/root:/bin/bash\n"


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder every user can reach (pytest's own tmp folders are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="gpumon-priv-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def state(place: Path) -> Path:
    """The service user's state directory (0700, owned by nobody) with its health folder."""
    state = place / "state"
    (state / "health").mkdir(parents=True)
    for folder in (state, state / "health"):
        os.chown(folder, NOBODY.pw_uid, NOBODY.pw_gid)
        folder.chmod(0o700)
    return state


@pytest.fixture
def passwd(place: Path) -> Path:
    """A root-owned file of root's (a stand-in for /etc/passwd), mode 0600."""
    target = place / "passwd"
    target.write_text(SECRET)
    target.chmod(0o600)
    return target


def planted_link(link: Path, target: Path) -> None:
    """A symbolic link made by the service user (nobody owns it)."""
    os.symlink(target, link)
    os.lchown(link, NOBODY.pw_uid, NOBODY.pw_gid)


def untouched(target: Path) -> bool:
    st = target.stat()
    return stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0 and target.read_text() == SECRET


def test_a_check_lock_linked_to_a_root_file_is_neither_chmodded_nor_written(state: Path, passwd: Path) -> None:
    planted_link(state / "health" / CHECK_LOCK_NAME, passwd)
    with state_lock(state / "health", 1.0, name=CHECK_LOCK_NAME) as held:
        assert held is False  # refused: the block runs unlocked, its own writes refused the same way
    assert untouched(passwd)


def test_a_daemon_lock_linked_to_a_root_file_is_not_truncated(state: Path, passwd: Path) -> None:
    planted_link(state / "daemon.lock", passwd)
    with pytest.raises(OSError):
        DaemonLock(state)
    assert untouched(passwd)


@pytest.mark.parametrize("kind", ["symbolic link", "hard link"])
def test_an_action_log_linked_to_a_root_file_is_not_appended_to(state: Path, passwd: Path, kind: str) -> None:
    log = state / "health" / "actions.jsonl"
    if kind == "hard link":
        os.link(passwd, log)  # what fs.protected_hardlinks=0 would let the service user do
    else:
        planted_link(log, passwd)
    with pytest.raises(UnsafePath):
        append_line(log, {"action": "drain"})
    assert untouched(passwd)


def test_a_health_folder_swapped_for_a_link_to_a_root_folder_gets_nothing_written_through_it(
    state: Path, place: Path
) -> None:
    etc = place / "etc"
    etc.mkdir()
    shutil.rmtree(state / "health")
    planted_link(state / "health", etc)
    with pytest.raises(UnsafePath):
        write_json(state / "health" / "xid.json", {"version": 1})
    with pytest.raises(UnsafePath):
        append_line(state / "health" / "actions.jsonl", {"action": "drain"})
    with state_lock(state / "health") as held:
        assert held is False
    assert list(etc.iterdir()) == []


def test_a_folder_every_user_may_write_is_refused_until_the_daemon_closes_it(state: Path) -> None:
    burn = state / "burn"
    burn.mkdir()
    burn.chmod(0o777)  # made by an old gpumon burn under umask 000
    with pytest.raises(UnsafePath):
        write_json(burn / "last.json", {"exit_code": 1})
    os.chown(burn, 0, 0)  # root's own folder (root is who runs the daemon's repair in this test)
    said = close_tree_to_others(state)
    assert any(str(burn) in line for line in said)
    assert not burn.stat().st_mode & stat.S_IWOTH
    write_json(burn / "last.json", {"exit_code": 1})


def test_folders_root_makes_in_the_service_users_state_directory_belong_to_that_user(state: Path) -> None:
    """Issue 41 item 9: a root burn left STATE/burn root:root, and the service user's burn then could not
    write its marker."""
    StateFiles(str(state), warn=pytest.fail).write_last({"exit_code": 0})
    assert (burn_dir(state).stat().st_uid, burn_dir(state).stat().st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
    ensure_dir(state / "simulated" / "fake-x" / "health")
    for folder in (state / "simulated", state / "simulated" / "fake-x", state / "simulated" / "fake-x" / "health"):
        assert folder.stat().st_uid == NOBODY.pw_uid


def as_nobody(code: str, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=str(REPO),
        timeout=60,
        preexec_fn=lambda: os.umask(umask),
    )


def test_after_a_root_burn_the_service_users_burn_still_writes_its_marker(state: Path) -> None:
    root_burn = StateFiles(str(state), warn=pytest.fail)
    root_burn.write_marker(os.getpid(), [0], ["GPU-0"], 1.0)
    root_burn.remove_marker()
    root_burn.write_last({"exit_code": 0})
    warned = as_nobody(
        "import sys; from gpumon.state.burn_record import StateFiles; "
        f"s = StateFiles({str(state)!r}, warn=lambda m: print(m)); "
        "s.write_marker(1, [0], ['GPU-0'], 2.0); s.write_last({'exit_code': 1})"
    )
    assert warned.returncode == 0 and warned.stdout == "", warned.stdout + warned.stderr
    assert json.loads((burn_dir(state) / "last.json").read_text())["exit_code"] == 1


def test_a_root_burn_under_umask_000_leaves_nothing_every_user_may_write(place: Path) -> None:
    state = place / "fresh-state"
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from gpumon.state.burn_record import StateFiles; "
            f"s = StateFiles({str(state)!r}, warn=print); s.write_marker(1, [0], [], 1.0); s.write_last({{}})",
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=lambda: os.umask(0),
        timeout=60,
    )
    for path in (state, burn_dir(state), burn_dir(state) / "last.json", burn_dir(state) / "running.json"):
        assert not path.stat().st_mode & stat.S_IWOTH, path
    replaced = as_nobody(f"open({str(burn_dir(state) / 'last.json')!r}, 'w').write('{{}}')")
    assert replaced.returncode != 0


def test_the_daemon_closes_every_folder_of_a_tree_made_under_umask_000_and_says_so(
    tmp_path: Path, start_daemon: Callable[..., DaemonProcess]
) -> None:
    state = tmp_path / "state"
    made = [state, state / "health", state / "health" / "clears.d", state / "burn", state / "alerts"]
    for folder in made:
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)  # mkdir -p under umask 000
    daemon = start_daemon("--backend", "fake", "--interval", "0.2")
    for folder in made:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
        assert f"{folder} was writable by every user" in daemon.log()


def test_a_folder_its_group_may_write_by_chance_is_refused_but_an_admin_groups_setgid_one_is_used(state: Path) -> None:
    os.chmod(state / "health", 0o775)  # a umask of 002, not the admin group's 2775
    with pytest.raises(UnsafePath):
        append_line(state / "health" / "actions.jsonl", {"action": "drain"})
    os.chmod(state / "health", 0o2775)  # docs/health.md "Who may clear": the admin group's folder
    append_line(state / "health" / "actions.jsonl", {"action": "drain"})
    assert (state / "health" / "actions.jsonl").is_file()


def root_gpumon(place: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``gpumon ARGS`` as root, with no configuration or state of the host's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    env.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", XDG_STATE_HOME=str(place / "xdg"), HOME=str(place))
    return subprocess.run(
        [sys.executable, "-m", "gpumon", *args], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120
    )


OLD_ROOT_FOLDERS = ("burn", "health/clears.d", "simulated", "simulated/fake", "simulated/fake/burn")


def left_by_an_old_root_run(state: Path) -> None:
    """What a root burn or health run of an older gpumon left: folders root:root 0755 in nobody's tree."""
    for name in OLD_ROOT_FOLDERS:
        (state / name).mkdir()
        os.chown(state / name, 0, 0)
        (state / name).chmod(0o755)


@pytest.mark.parametrize(
    "command",
    [
        ["health", "--local", "--backend", "fake"],
        ["burn", "--device", "cpu", "--duration", "1", "--tests", "sw", "--gpus", "0"],
    ],
    ids=["health", "burn"],
)
def test_folders_an_older_root_run_left_are_given_back_at_roots_next_run(
    state: Path, place: Path, command: list[str]
) -> None:
    """Issue 41 item 9 after an upgrade: folders an earlier root run left root:root stay so until root runs
    gpumon again, which gives each to the state directory's owner (one line each); nobody's burn then writes
    its marker."""
    left_by_an_old_root_run(state)
    ran = root_gpumon(place, *command, "--state-dir", str(state))
    assert ran.returncode in (0, 1), ran.stdout + ran.stderr
    for name in OLD_ROOT_FOLDERS:
        assert (state / name).stat().st_uid == NOBODY.pw_uid, name
        assert ran.stderr.count(f"{state / name} belonged to root") == 1, ran.stderr
    warned = as_nobody(
        "from gpumon.state.burn_record import StateFiles; "
        f"s = StateFiles({str(state)!r}, warn=print); s.write_marker(1, [0], ['GPU-0'], 2.0); s.remove_marker()"
    )
    assert warned.returncode == 0 and warned.stdout == "", warned.stdout + warned.stderr


def test_root_hands_nothing_over_in_its_own_state_directory_nor_what_gpumon_does_not_make(
    state: Path, place: Path
) -> None:
    own = place / "root-state"
    (own / "burn").mkdir(parents=True)
    os.chown(own / "burn", NOBODY.pw_uid, NOBODY.pw_gid)  # root's state directory: nothing is given to anyone
    (state / "burn").mkdir()
    os.chown(state / "burn", 0, 0)
    (state / "keep").mkdir()  # root's folder that gpumon does not make: left as it is
    (place / "root-folder").mkdir()
    os.symlink(place / "root-folder", state / "health" / "clears.d")  # root's link: never followed
    for where in (own, state):
        ran = root_gpumon(place, "health", "--local", "--backend", "fake", "--state-dir", str(where))
        assert ran.returncode in (0, 1), ran.stdout + ran.stderr
    assert (own.stat().st_uid, (own / "burn").stat().st_uid) == (0, NOBODY.pw_uid)
    assert (state / "burn").stat().st_uid == NOBODY.pw_uid
    assert (state / "keep").stat().st_uid == 0
    assert (place / "root-folder").stat().st_uid == 0


def test_a_one_shot_check_whose_state_writes_are_refused_says_so_on_stderr_and_keeps_its_verdict(
    state: Path, place: Path
) -> None:
    """Issue 42 follow-up: the check's verdict (stdout's first line, what Nagios and NHC read) and exit code
    are those of a check whose state could be written; that its state was not saved is said on stderr, once."""
    check = ["health", "--local", "--backend", "fake"]
    clean = root_gpumon(place, *check, "--state-dir", str(place / "root-state"))
    refused = state / "simulated" / "fake" / "health"
    refused.mkdir(parents=True)
    for folder in (state / "simulated", state / "simulated" / "fake", refused):
        os.chown(folder, NOBODY.pw_uid, NOBODY.pw_gid)
    refused.chmod(0o775)  # the service user's folder, group-writable by chance: root keeps nothing there
    ran = root_gpumon(place, *check, "--state-dir", str(state))
    assert (ran.returncode, ran.stdout) == (clean.returncode, clean.stdout), ran.stderr
    assert str(refused) not in ran.stdout
    said = [line for line in ran.stderr.splitlines() if str(refused) in line and "fail" in line]
    assert said and len(said) == len(set(said)), ran.stderr
    assert list(refused.iterdir()) == []
