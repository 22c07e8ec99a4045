"""A real Slurm controller (slurmctld), one node (slurmd) and munge on loopback, for tests.

Node ``g1`` is the real slurmd. ``g2``..``g4`` exist only in slurm.conf, at a port where
nothing listens (``Port=``; another loopback address would still reach g1's slurmd, which
listens on all addresses): Slurm keeps them DOWN, and they count in partition ``gpu`` so the circuit
breaker's share (nodes drained by gpumon / nodes in the partition) is computable.
Everything lives in one scratch directory; daemons are stopped by the pids in their pid files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO, wait_for

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sbatch", "squeue", "scancel", "sinfo")
NODE = "g1"
PARTITION = "gpu"


def missing_reason() -> str | None:
    """Why the cluster cannot start here, or None."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        return f"Slurm/munge binaries missing ({', '.join(missing)}; Debian: slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "the Slurm test cluster runs slurmd as root; not root here"
    return None


@dataclass
class SlurmCluster:
    dir: Path
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(args), capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {done.stderr or done.stdout}")
        return done

    def node(self, name: str = NODE) -> dict[str, str]:
        """``scontrol show node NAME -o`` as a dict; Reason without Slurm's [user@time] suffix."""
        line = self.run("scontrol", "show", "node", name, "-o").stdout.strip()
        head, _, reason = line.partition(" Reason=")
        fields = dict(tok.split("=", 1) for tok in head.split() if "=" in tok)
        if reason.endswith("]") and " [" in reason:
            reason = reason[: reason.rindex(" [")]
        fields["Reason"] = reason
        return fields

    def drained(self, name: str = NODE) -> bool:
        return "DRAIN" in self.node(name)["State"].split("+")

    def reset(self) -> None:
        """Every node back to undrained (the fake nodes stay DOWN)."""
        for name in ("g1", "g2", "g3", "g4"):
            if self.drained(name):
                self.run("scontrol", "update", f"nodename={name}", "state=undrain" if name != NODE else "state=resume")
        wait_for(lambda: not self.drained(NODE) and "IDLE" in self.node()["State"], 20, 0.1, "g1 idle")

    def job(self, job_id: str) -> tuple[str, str]:
        """(state, reason) of a job while squeue lists it; ("", "") once it is gone."""
        out = self.run("squeue", "-h", "-j", job_id, "-o", "%T|%r", check=False).stdout.strip()
        if not out or "|" not in out:
            return "", ""
        state, _, reason = out.partition("|")
        return state, reason


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held open together, so no two are the same)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def start(base: Path, attempts: int = 3) -> SlurmCluster:
    """Start the cluster; a port taken between choosing and binding it is retried with new ports."""
    for attempt in range(attempts):
        try:
            return _start(base / f"try{attempt}")
        except _PortTaken:
            continue
    raise AssertionError(f"the Slurm test cluster could not bind its ports in {attempts} attempts")


class _PortTaken(Exception):
    pass


def _alive(pidfile: Path) -> bool:
    pid = _pid(pidfile)
    if pid is None:
        return True  # not written yet
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _start(base: Path) -> SlurmCluster:
    base.mkdir(parents=True, exist_ok=True)
    sock = start_munge(base)
    host = socket.gethostname().split(".")[0]
    ctld_port, slurmd_port, nobody_port = _ports(3)
    for sub in ("state", "spool"):
        (base / sub).mkdir(exist_ok=True)
    conf = base / "slurm.conf"
    prolog = base / "prolog.sh"
    prolog.write_text(
        f"""#!/bin/sh
# Runs for every job; does something only while a test has written {base / "prolog.args"}.
[ -f {base / "prolog.args"} ] || exit 0
export SLURM_CONF={conf} PYTHONPATH={REPO}  # slurmd gives a clean environment: the gpumon under test
exec {sys.executable} -m gpumon health --slurm-prolog $(cat {base / "prolog.args"}) >> {base / "prolog.log"} 2>&1
"""
    )
    prolog.chmod(0o755)
    epilog = base / "epilog.sh"
    epilog.write_text(
        f"""#!/bin/sh
# Runs after every job; does something only while a test has written {base / "epilog.args"}
# (and exports what a test wrote to {base / "epilog.env"}).
[ -f {base / "epilog.args"} ] || exit 0
[ -f {base / "epilog.env"} ] && . {base / "epilog.env"}
export SLURM_CONF={conf} PYTHONPATH={REPO}
exec {sys.executable} -m gpumon health --slurm-epilog $(cat {base / "epilog.args"}) >> {base / "epilog.log"} 2>&1
"""
    )
    epilog.chmod(0o755)
    conf.write_text(
        f"""ClusterName=gpumontest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
{common_conf(sock)}StateSaveLocation={base / "state"}
SlurmdSpoolDir={base / "spool"}
SlurmctldPidFile={base / "slurmctld.pid"}
SlurmdPidFile={base / "slurmd.pid"}
Prolog={prolog}
Epilog={epilog}
PrologFlags=Alloc
SlurmdTimeout=300
MessageTimeout=5
NodeName={NODE} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
NodeName=g[2-4] NodeAddr=127.0.0.1 Port={nobody_port} CPUs=1 State=DOWN
PartitionName={PARTITION} Nodes={NODE},g[2-4] Default=YES MaxTime=INFINITE State=UP
"""
    )
    cluster = SlurmCluster(dir=base, conf=conf)
    try:
        subprocess.run(
            ["slurmctld", "-f", str(conf), "-L", str(base / "slurmctld.log"), "-i"],
            check=True,
            capture_output=True,
            env=cluster.env,
        )
        subprocess.run(
            ["slurmd", "-f", str(conf), "-L", str(base / "slurmd.log"), "-N", NODE],
            check=True,
            capture_output=True,
            env=cluster.env,
        )

        deadline = time.monotonic() + 40
        while True:
            for daemon in ("slurmctld", "slurmd"):
                if not _alive(base / f"{daemon}.pid"):
                    log = (base / f"{daemon}.log").read_text()
                    if "Address already in use" in log:
                        raise _PortTaken(daemon)
                    raise AssertionError(f"{daemon} exited:\n{log[-2000:]}")
            done = cluster.run("scontrol", "show", "node", NODE, "-o", check=False)
            if "State=IDLE" in done.stdout:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"slurmd did not register node {NODE} as IDLE within 40 s: {done.stdout}")
            time.sleep(0.2)
    except BaseException:
        stop(cluster)
        raise
    return cluster


def stop(cluster: SlurmCluster) -> None:
    base = cluster.dir
    stop_pidfiles([base / name for name in ("slurmd.pid", "slurmctld.pid", "munged.pid")])


def start_munge(base: Path) -> Path:
    """A munged of its own (key, socket, pid file ``munged.pid``, log under ``base``); its socket."""
    key = base / "munge.key"
    subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
    key.chmod(0o400)
    sock = base / "munge.socket"
    subprocess.run(
        [
            "munged",
            f"--key-file={key}",
            f"--socket={sock}",
            f"--pid-file={base / 'munged.pid'}",
            f"--log-file={base / 'munged.log'}",
            f"--seed-file={base / 'munged.seed'}",
            "--force",
        ],
        check=True,
        capture_output=True,
    )
    return sock


def common_conf(munge_socket: Path) -> str:
    """The slurm.conf lines every test cluster shares (root daemons, no cgroups, no accounting)."""
    return f"""AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SlurmUser=root
SlurmdUser=root
ReturnToService=2
SelectType=select/cons_tres
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
MinJobAge=300
"""


def stop_pidfiles(pidfiles: list[Path]) -> None:
    """SIGTERM every daemon named by a pid file, then SIGKILL what is still running after 10 s."""
    pids = []
    for path in pidfiles:
        pid = _pid(path)
        if pid is None:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
