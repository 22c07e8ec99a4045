"""Who may clear a fault or accept the inventory, and that a legitimate clear reaches the daemon whoever
makes it: with real non-root processes (``setpriv`` to user nobody) and a umask of 000.

The shipped unit runs the daemon as a service user that owns the state directory (mode 0700); root
clears with ``sudo gpumon health clear``. Everyone else is refused, with nothing written."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.helpers import REPO, free_port, value, wait_for

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"),
]

XID48_ON_GPU0 = "count: 2\ngpus:\n  - xid_events: [{tick: 0, xid: 48}]\n  - {}\n"
NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder every user can reach (pytest's own tmp folders are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="gpumon-clears-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def env(place: Path) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
    out.update(PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", XDG_STATE_HOME=str(place / "xdg"), HOME=str(place))
    return out


def gpumon(place: Path, *args: str, user: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gpumon ARGS`` under a umask of 000, as root or as ``user`` (a setpriv prefix)."""
    return subprocess.run(
        [*(user or []), sys.executable, "-m", "gpumon", *args],
        capture_output=True,
        text=True,
        env=env(place),
        cwd=str(REPO),
        timeout=60,
        preexec_fn=lambda: os.umask(0),
    )


class Daemon:
    def __init__(self, place: Path, state: Path, spec: str, user: list[str] | None = None) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log_path = place / f"daemon-{self.url.rsplit(':', 1)[1]}.log"
        with self.log_path.open("w") as log:
            listen = self.url[len("http://") :]
            args = ["run", "--listen", listen, "--state-dir", str(state), "--backend", spec, "--interval", "0.2"]
            self.proc = subprocess.Popen(
                [*(user or []), sys.executable, "-m", "gpumon", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env(place),
                cwd=str(REPO),
                preexec_fn=lambda: os.umask(0),
            )

    def health(self) -> dict[str, object]:
        data: dict[str, object] = requests.get(self.url + "/api/health", timeout=5).json()
        return data

    def status(self) -> object:
        if self.proc.poll() is not None:
            raise AssertionError(f"the daemon exited {self.proc.returncode}: {self.log_path.read_text()}")
        return self.health()["status"]

    def metric(self, name: str, **labels: str) -> float | None:
        return value(requests.get(self.url + "/metrics", timeout=5).text, name, **labels)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    made: list[Daemon] = []
    yield made
    for d in made:
        if d.proc.poll() is None:
            d.stop()


def tree(path: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``path``: (mode, mtime in ns)."""
    out = {}
    for p in sorted(path.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(path))] = (st.st_mode, st.st_mtime_ns)
    return out


def test_a_user_who_may_not_clear_is_refused_and_nothing_is_written(place: Path, daemons: list[Daemon]) -> None:
    """Under umask 000 the daemon (root) still makes its state closed to others, and user nobody can neither
    clear the critical XID 48 nor replace the inventory: a clear error, exit 1, no file anywhere."""
    scenario = place / "xid48.yaml"
    scenario.write_text(XID48_ON_GPU0)
    spec = f"fake:{scenario}"
    state = place / "state"
    d = Daemon(place, state, spec)
    daemons.append(d)
    wait_for(lambda: d.status() == "CRITICAL", 20, 0.1, "CRITICAL from XID 48")
    wait_for(lambda: any(state.rglob("inventory.json")), 10, what="the baseline")
    for p in [state, *state.rglob("*")]:
        mode = p.stat().st_mode
        assert not mode & 0o002, f"{p} is writable by every user ({mode:o})"
    before = tree(state)

    cleared = gpumon(place, "health", "clear", "--gpu", "0", "--reason", "x", "--state-dir", str(state), "--backend", spec, user=NOBODY)  # fmt: skip
    assert cleared.returncode == 1, cleared.stdout + cleared.stderr
    [line] = cleared.stderr.splitlines()
    assert "may clear faults" in line and "nobody" in line
    accepted = gpumon(place, "health", "accept-inventory", "--state-dir", str(state), "--backend", spec, user=NOBODY)
    assert accepted.returncode == 1, accepted.stdout + accepted.stderr
    assert "may accept the inventory" in accepted.stderr

    after = tree(state)
    assert set(after) == set(before), "a file was added or removed"
    baseline = str(next(state.rglob("inventory.json")).relative_to(state))
    assert after[baseline] == before[baseline], "the inventory baseline was replaced"
    assert not (place / "xdg").exists(), "written to nobody's own state folder instead"
    assert d.status() == "CRITICAL"


def test_a_root_clear_reaches_a_daemon_running_as_the_service_user_and_every_clear_is_kept(
    place: Path, daemons: list[Daemon]
) -> None:
    """The daemon runs as nobody in a state directory it owns, mode 0700 (as systemd's StateDirectory=
    makes it); root clears: the daemon applies it. A later clear by the service user keeps root's."""
    scenario = place / "xid48.yaml"
    scenario.write_text(XID48_ON_GPU0)
    spec = f"fake:{scenario}"
    state = place / "state"
    state.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    d = Daemon(place, state, spec, user=NOBODY)
    daemons.append(d)
    wait_for(lambda: d.status() == "CRITICAL", 20, 0.1, "CRITICAL from XID 48")

    root = gpumon(place, "health", "clear", "--gpu", "0", "--reason", "reseated", "--state-dir", str(state), "--backend", spec)  # fmt: skip
    assert root.returncode == 0, root.stdout + root.stderr
    wait_for(lambda: d.status() == "OK", 10, 0.1, "OK after root's clear")

    again = gpumon(place, "health", "clear", "--gpu", "1", "--reason", "checked", "--state-dir", str(state), "--backend", spec, user=NOBODY)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    records = [json.loads(p.read_text()) for p in sorted(state.rglob("clears.d/*.json"))]
    assert [(r["gpu"], r["reason"], r["user"]) for r in records] == [(0, "reseated", "root"), (1, "checked", "nobody")]
    assert d.status() == "OK"


def test_a_clear_the_daemon_cannot_read_is_said_not_ignored(place: Path, daemons: list[Daemon]) -> None:
    """A clear written 0600 by root (as an older gpumon did) where the daemon runs as the service user: a
    log line, ``gpumon_health_clears_unreadable`` and a WARNING finding, never a silent CRITICAL."""
    scenario = place / "xid48.yaml"
    scenario.write_text(XID48_ON_GPU0)
    spec = f"fake:{scenario}"
    state = place / "state"
    state.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody")
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    d = Daemon(place, state, spec, user=NOBODY)
    daemons.append(d)
    wait_for(lambda: d.status() == "CRITICAL", 20, 0.1, "CRITICAL from XID 48")
    legacy = next(state.rglob("xid.json")).parent / "clears.json"
    legacy.write_text(json.dumps([{"gpu": 0, "reason": "old", "at_seconds": 4e9, "user": "root"}]))
    legacy.chmod(0o600)

    wait_for(lambda: d.metric("gpumon_health_findings", kind="clears_unreadable") == 1.0, 10, 0.1, "the metric")
    kinds = {f["kind"] for f in d.health()["findings"]}  # type: ignore[union-attr]
    assert "clears_unreadable" in kinds
    assert "cannot read 1 operator clear" in d.log_path.read_text()


def test_members_of_the_state_directorys_group_may_clear(place: Path, daemons: list[Daemon]) -> None:
    """The admin group: the state directory's group, where that folder is group-writable (setgid)."""
    name = f"gpumonadm{os.getpid()}"
    subprocess.run(["groupadd", name], check=True, capture_output=True)
    try:
        gid = grp.getgrnam(name).gr_gid
        scenario = place / "xid48.yaml"
        scenario.write_text(XID48_ON_GPU0)
        spec = f"fake:{scenario}"
        state = place / "state"
        state.mkdir()
        os.chown(state, 0, gid)
        state.chmod(0o2770)
        d = Daemon(place, state, spec)
        daemons.append(d)
        wait_for(lambda: d.status() == "CRITICAL", 20, 0.1, "CRITICAL from XID 48")
        admin = ["setpriv", "--reuid=nobody", "--regid=nogroup", f"--groups={gid}"]
        done = gpumon(place, "health", "clear", "--gpu", "0", "--reason", "fixed", "--state-dir", str(state), "--backend", spec, user=admin)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for(lambda: d.status() == "OK", 10, 0.1, "OK after the admin's clear")
    finally:
        subprocess.run(["groupdel", name], check=False, capture_output=True)
